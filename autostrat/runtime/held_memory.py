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


def _block(array) -> tuple[object, int]:
    """The object whose memory `array` uses (the end of its chain of `base`s; anything other
    than an array is its own), and that memory's bytes: `held_bytes`' rule, which walks it
    apart (the exact walk `HeldBlocks` is tested against shares no code with it)."""
    if not isinstance(array, np.ndarray):
        return array, np.asarray(array).nbytes
    base = array.base
    while isinstance(base, np.ndarray):
        array, base = base, base.base
    return array, array.nbytes


class HeldBlocks:
    """The distinct blocks behind a set of arrays that changes an array at a time, and their
    bytes (`total`), kept up to date as arrays come and go instead of walked again at every
    sample: what `held_bytes` gives for the set (tests compare the two at every instruction).
    An array held twice holds its block until both are gone.

    Example (a view of a held array adds nothing; a copy adds its block):
        >>> whole, blocks = np.zeros(8, np.float32), HeldBlocks()
        >>> blocks.add(whole); blocks.add(whole[:4]); blocks.remove(whole)
        >>> blocks.total, blocks.bytes_with([whole[2:]], [whole.copy()])
        (32, 64)
    """

    def __init__(self):
        self._blocks: dict[int, list] = {}  # id(block) -> [block, arrays holding it]; the block kept, so its id stays its own
        self.total = 0

    def add(self, array) -> None:
        block, size = _block(array)
        entry = self._blocks.get(id(block))
        if entry is None:
            self._blocks[id(block)] = [block, 1]
            self.total += size
        else:
            entry[1] += 1

    def remove(self, array) -> None:
        block, size = _block(array)
        entry = self._blocks[id(block)]
        entry[1] -= 1
        if not entry[1]:
            del self._blocks[id(block)]
            self.total -= size

    def bytes_with(self, *groups) -> int:
        """`total` with the blocks behind the arrays of `groups` that it lacks, each once."""
        extra: dict[int, int] = {}
        for group in groups:
            for array in group:
                block, size = _block(array)
                if id(block) not in self._blocks:
                    extra[id(block)] = size
        return self.total + sum(extra.values())


class HeldMemory:
    """The peak of `held_bytes` over the moments a rank samples (`sample`), or of what a rank
    found another way (`note`: `HeldBlocks.bytes_with`).

    Example:
        >>> memory = HeldMemory(); memory.sample([np.zeros(4)]); memory.sample([np.zeros(2)]); memory.peak
        32
    """

    def __init__(self):
        self.peak = 0

    def sample(self, *groups) -> None:
        self.note(held_bytes(*groups))

    def note(self, held: int) -> None:
        self.peak = max(self.peak, held)


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
