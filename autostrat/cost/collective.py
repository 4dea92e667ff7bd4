"""Bytes sent per device by one collective, with the ring formulas of DESIGN §3.

For a group of ``g`` devices each holding a local piece of ``s`` bytes before the step:

- AllGather ``(g-1)·s``: every device forwards the ``g-1`` pieces it does not own;
- ReduceScatter and AllToAll ``(g-1)·s/g``: every device sends all chunks but its own;
- AllReduce ``2(g-1)·s/g``: a ReduceScatter followed by an AllGather of the reduced chunks
  (exactly, see below);
- CollectivePermute ``s``: the whole piece goes to one other device;
- Slice, Reshape and PartialCreate ``0``: local (a PartialCreate of a sum zeroes the pieces of
  every rank but one per group, of a max or min changes nothing).

Costs are integers. The runtime moves these collectives as the messages of `runtime.wire`, and
these are its byte counts exactly. These are the ring's; a plan step may instead record another
algorithm (recursive doubling, hierarchical: `cost.algorithms`), whose bytes that module gives. Only AllReduce cuts a piece it was not given in blocks: it
splits the ``n = s / itemsize`` elements into g chunks as ``numpy.array_split`` does (the first
``n mod g`` one element longer), and member ``p`` sends every chunk but chunk ``p`` in the
ReduceScatter half and every chunk but chunk ``p+1`` in the AllGather half:
``(2n - c_p - c_(p+1))·itemsize`` bytes, which differs between members when g does not divide
n. A step's cost is its busiest member's. (ReduceScatter and AllToAll are given g equal blocks;
for any other ``s`` their division rounds up, the busiest member's share.)
"""

from __future__ import annotations

import numpy as np

from autostrat.errors import LayoutError

COLLECTIVE_KINDS = ("AllGather", "AllReduce", "AllToAll", "CollectivePermute", "PartialCreate", "ReduceScatter", "Reshape", "Slice")


def collective_bytes(kind: str, group_size: int, local_bytes: int, itemsize: int = 1, position: int | None = None) -> int:
    """Bytes one device sends in collective `kind` over `group_size` devices.

    `local_bytes` is the size of the device's piece before the step, of elements of `itemsize`
    bytes; `position` is the device's place in its group, None for the busiest device.

    Example:
        >>> collective_bytes("AllGather", 4, 1024), collective_bytes("ReduceScatter", 4, 1024)
        (3072, 768)
        >>> collective_bytes("AllReduce", 4, 1024), collective_bytes("Slice", 4, 1024)
        (1536, 0)
        >>> [collective_bytes("AllReduce", 8, 4, 4, position) for position in (0, 1, 7)], collective_bytes("AllReduce", 8, 4, 4)
        ([4, 8, 4], 8)
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
        return _ring_allreduce_bytes(g, s, itemsize, position)
    if kind == "CollectivePermute":
        return s
    return 0


def _ring_allreduce_bytes(g: int, s: int, itemsize: int, position: int | None) -> int:
    if g == 1:
        return 0
    if s % itemsize:
        raise LayoutError(f"AllReduce of {s} bytes is no whole number of {itemsize}-byte elements")
    n = s // itemsize
    q, r = divmod(n, g)
    if position is None:
        # The busiest member skips the two smallest neighbouring chunks: both short ones
        # (q elements) unless only one chunk is short (r = g - 1).
        skipped = 2 * q + (1 if r == g - 1 and r > 0 else 0)
    else:
        skipped = sum(q + (chunk < r) for chunk in (position % g, (position + 1) % g))
    return (2 * n - skipped) * itemsize


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
