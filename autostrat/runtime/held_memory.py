"""What a rank's arrays occupy, found from the arrays themselves: the measurement of a run's
peak memory, independent of the plan's bookkeeping (`cost.live_bytes`, `search.buffers`), which
it checks (DESIGN.md §5: this module imports numpy and nothing of autostrat).

A rank holds the arrays of its store (its loaded slices of parameters, optimiser state and
batch, activations, gradients, redistributed copies), the slices it carries to its next load,
and, while an instruction runs, that instruction's inputs and results. Their memory is the sum
of the distinct blocks behind them: an array that is a view counts its owner's block once, however
many arrays look into it. Kernel and collective temporaries are not held by the rank. A rank's
`HeldMemory.peak` is the most it held at the moment an instruction's results exist next to its
inputs, the point where a step's memory is highest.

On one rank in its own process this is what `tracemalloc` traces in numpy's allocation domain
beyond what the process held before (`numpy_traced_bytes`; tests check the two agree): the
allocator's count, which threads sharing a process (`LocalBackend`) cannot separate per rank.
"""

from __future__ import annotations

import tracemalloc

import numpy as np


def held_bytes(*groups) -> int:
    """The bytes of the distinct memory blocks behind every array in `groups` (iterables of
    arrays; anything else, such as a numpy scalar, counts its own bytes).

    Example (a view, or a view of one, adds nothing; a copy adds its own block):
        >>> whole = np.zeros(8, np.float32)
        >>> held_bytes([whole, whole[:4][1:]]), held_bytes([whole], [whole[:4].copy()])
        (32, 48)
    """
    # Each array's owner (its chain of `base`s) found inline: a rank samples after every
    # instruction, each time every array it holds.
    blocks: dict[int, int] = {}
    ndarray = np.ndarray
    for group in groups:
        for array in group:
            if isinstance(array, ndarray):
                base = array.base
                while isinstance(base, ndarray):
                    array, base = base, base.base
                blocks[id(array)] = array.nbytes
            else:
                blocks[id(array)] = np.asarray(array).nbytes
    return sum(blocks.values())


class HeldMemory:
    """The peak of `held_bytes` over the moments a rank samples.

    Example:
        >>> memory = HeldMemory(); memory.sample([np.zeros(4)]); memory.sample([np.zeros(2)]); memory.peak
        32
    """

    def __init__(self):
        self.peak = 0

    def sample(self, *groups) -> None:
        self.peak = max(self.peak, held_bytes(*groups))


def numpy_traced_bytes() -> int:
    """The bytes of numpy's data allocations alive now, as `tracemalloc` traces them in numpy's
    domain (`np.lib.tracemalloc_domain`); tracemalloc must be tracing.

    Example:
        >>> tracemalloc.start(); before = numpy_traced_bytes(); block = np.ones(1000)
        >>> numpy_traced_bytes() - before; tracemalloc.stop()
        8000
    """
    snapshot = tracemalloc.take_snapshot().filter_traces([tracemalloc.DomainFilter(True, np.lib.tracemalloc_domain)])
    return sum(statistic.size for statistic in snapshot.statistics("filename"))
