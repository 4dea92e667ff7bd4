"""Run a ring strategy's op (`layout.Strategy.ring`) on a backend: its kernel
(`kernels.ring_attention`) passes blocks around the ring through the backend's wire, where every
message is counted (`wire.Wire.exchange`), as the messages of a collective are.

Every block travels in the ring's wire dtype, the held dtype of the op's key input (a 16-bit
run: the 16-bit values, widened to float32 for the arithmetic on arrival, as its kernels compute).
"""

from __future__ import annotations

import numpy as np

from autostrat.runtime.kernels.ring_attention import RING_KERNELS
from autostrat.runtime.sixteen_bit import rounded, widened


class Ring:
    """The ring of `group` (members in block order) through `backend`'s rank.

    Example (two local ranks pass their rank numbers on: each gets the other's):
        >>> from autostrat.runtime.local import LocalCluster
        >>> def swap(backend):
        ...     [got] = Ring(backend, (0, 1)).pass_on((np.array([backend.rank]),))
        ...     return int(got[0])
        >>> LocalCluster(2).run(swap)
        [1, 0]
    """

    def __init__(self, backend, group: tuple[int, ...], dtype: str = "") -> None:
        self.backend, self.group, self.dtype = backend, tuple(group), dtype
        self.size, self.position = len(self.group), self.group.index(backend.rank)

    def pass_on(self, arrays) -> tuple[np.ndarray, ...]:
        """Send `arrays` to the next member and return the previous member's, one message each."""
        right, left = self.group[(self.position + 1) % self.size], self.group[(self.position - 1) % self.size]
        return tuple(widened(self.backend.sendrecv(rounded(np.asarray(a), self.dtype), right, left)) for a in arrays)


def run_ring_kernel(op_type: str, inputs, attrs: dict, context, ring: Ring) -> tuple[np.ndarray, ...]:
    """The results of `op_type`'s ring kernel on the rank's slices `inputs`, whose `context`
    (`layout.SliceContext`) places its query rows."""
    offset = 0 if context is None else context.input_offset(0, 2)
    result = RING_KERNELS[op_type](*inputs, ring=ring, scale_value=attrs.get("scale_value", 1.0),
                                   sparse_mode=attrs.get("sparse_mode", 0), query_offset=offset)
    return result if isinstance(result, tuple) else (result,)


def ring_compute(instruction, inputs, backend) -> tuple[np.ndarray, ...]:
    """The results of a `instructions.RingCompute`: in a 16-bit run, computed in float32 on the
    widened slices and rounded to the dtypes held (`sixteen_bit`)."""
    ring = Ring(backend, instruction.group, instruction.wire_dtype)
    arrays = [widened(np.asarray(array)) for array in inputs] if instruction.dtypes else list(inputs)
    results = run_ring_kernel(instruction.op_type, arrays, dict(instruction.attrs), instruction.context, ring)
    if not instruction.dtypes:
        return results
    return tuple(rounded(result, dtype) for result, dtype in zip(results, instruction.dtypes))
