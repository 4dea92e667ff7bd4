"""Bytes sent per device by one collective, with the ring formulas of DESIGN §3.

For a group of ``g`` devices each holding a local piece of ``s`` bytes before the step:

- AllGather ``(g-1)·s``: every device forwards the ``g-1`` pieces it does not own;
- ReduceScatter and AllToAll ``(g-1)·s/g``: every device sends all chunks but its own;
- AllReduce ``2(g-1)·s/g``: a ReduceScatter followed by an AllGather of the reduced chunks;
- CollectivePermute ``s``: the whole piece goes to one other device;
- Slice and Reshape ``0``: local.

Costs are integers; when ``s`` is not a multiple of ``g`` the ring's chunks are uneven and the
busiest device sends the rounded-up amount, so the division rounds up.
"""

from __future__ import annotations

import numpy as np

from autostrat.errors import LayoutError

COLLECTIVE_KINDS = ("AllGather", "AllReduce", "AllToAll", "CollectivePermute", "ReduceScatter", "Reshape", "Slice")


def collective_bytes(kind: str, group_size: int, local_bytes: int) -> int:
    """Bytes one device sends in collective `kind` over `group_size` devices.

    `local_bytes` is the size of the device's piece before the step.

    Example:
        >>> collective_bytes("AllGather", 4, 1024), collective_bytes("ReduceScatter", 4, 1024)
        (3072, 768)
        >>> collective_bytes("AllReduce", 4, 1024), collective_bytes("Slice", 4, 1024)
        (1536, 0)
    """
    if kind not in COLLECTIVE_KINDS:
        raise LayoutError(f"collective kind must be one of {COLLECTIVE_KINDS}, got {kind!r}")
    if group_size < 1 or local_bytes < 0:
        raise LayoutError(f"{kind} needs a group of >= 1 devices and >= 0 bytes, got {group_size} and {local_bytes}")
    g, s = group_size, local_bytes
    if kind == "AllGather":
        return (g - 1) * s
    if kind in ("ReduceScatter", "AllToAll"):
        return -(-(g - 1) * s // g)
    if kind == "AllReduce":
        return -(-2 * (g - 1) * s // g)
    if kind == "CollectivePermute":
        return s
    return 0


def dtype_size(dtype) -> int:
    """Bytes per element of a numpy dtype name or object.

    Example:
        >>> dtype_size("float32"), dtype_size("float16"), dtype_size(np.int64)
        (4, 2, 8)
    """
    try:
        return np.dtype(dtype).itemsize
    except TypeError as error:
        raise LayoutError(f"dtype must name a numpy dtype (float32, float16, ...), got {dtype!r}") from error
