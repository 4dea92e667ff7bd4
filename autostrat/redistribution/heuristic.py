"""A* lower bounds: what some rank still has to receive, and what a partial sum still costs.

Both rest on one fact of the cost model: in every step kind a device sends and receives no more
bytes than the step charges it (ring collectives send and receive alike; a permute moves one
piece), so the remaining cost is at least any one rank's remaining traffic, and at least the
average over ranks of the whole remaining traffic.

- Receive: a rank must receive every element of its destination slice that its current slice
  lacks and, while partial axes the destination does not have remain, at least one value for
  every element of its destination slice (its own value is only a part).
- Combine (partial states, `partial_bound`): every element has ``g`` distinct contributions, one
  per coordinate of the partial axes, and ``R`` ranks must end with its full value (``R`` = the
  destination's replication). Order the transmissions of one element's values (those within a
  step in any order: a rank then knows at least what it knew in parallel). Before the first rank
  knows the full value, the contributions of ``g`` different holders have flowed into it, which
  takes at least ``g - 1`` transmissions; after that every other destination holder still needs
  its own completing transmission: ``g + R - 2`` per element (AllReduce: ``2(g-1)``, the known
  optimum). Over all elements and averaged over the ``N`` ranks this bounds the remaining cost.

The bound may not be consistent across the partial/whole boundary; the search reopens states, so
admissibility is all it needs for the optimum.
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np

from autostrat.redistribution.moves import Space, State


def partial_bound(space: Space, target_free: int, state: State) -> int:
    """The combine bound of a partial `state` towards a whole destination replicated
    `target_free` times: ``ceil(E·(g + R - 2)·itemsize / N)`` bytes (0 for a whole state).

    Example (16 partial contributions all-reduced over 16 ranks: 2·15/16 of the tensor):
        >>> space = Space(sizes=(2, 2, 2, 2), shape=(64, 64), itemsize=4)
        >>> partial_bound(space, 16, (((), ()), (0, 1, 2, 3))) == 2 * 15 * 64 * 64 * 4 // 16
        True
    """
    if not state[1]:
        return 0
    g = math.prod(space.sizes[axis] for axis in state[1])
    return -(-math.prod(space.shape) * (g + target_free - 2) * space.itemsize // math.prod(space.sizes))


class ReceiveBound:
    """The lower bound towards one target state over one space (axes counted from the right)."""

    def __init__(self, space: Space, target: State):
        self.space, self.target_partial = space, set(target[1])
        sizes = space.sizes
        positions = np.indices(tuple(reversed(sizes))).reshape(len(sizes), -1)
        self.coordinates = positions[::-1]  # row a = coordinate of every rank along axis a
        self.target_start, self.target_size = self._ranges(target[0])
        self.target_volume = math.prod(self.target_size) * space.itemsize
        used = {axis for entry in target[0] for axis in entry} | set(target[1])
        self.target_free = math.prod(size for axis, size in enumerate(sizes) if axis not in used)
        self.memo: dict = {}  # state -> bound
        self.overlaps: dict = {}  # (dim, entry) -> per-rank overlap along dim

    def _ranges(self, entries):
        starts, lengths = [], []
        for size, entry in zip(self.space.shape, entries):
            start, length = self._range(size, entry)
            starts.append(start)
            lengths.append(length)
        return starts, lengths

    def _range(self, size: int, entry) -> tuple[np.ndarray, int]:
        index = np.zeros(self.coordinates.shape[1], dtype=np.int64)
        for axis in entry:
            index = index * self.space.sizes[axis] + self.coordinates[axis]
        length = size // math.prod(self.space.sizes[axis] for axis in entry)
        return index * length, length

    def __call__(self, state: State) -> int:
        found = self.memo.get(state)
        if found is None:
            found = self.memo[state] = self._bound(state)
        return found

    def _bound(self, state: State) -> int:
        if self.target_partial:
            return 0
        if state[1]:
            return max(self.target_volume, partial_bound(self.space, self.target_free, state))
        overlap = np.ones(self.coordinates.shape[1], dtype=np.int64)
        for dim, entry in enumerate(state[0]):
            overlap *= self._dim_overlap(dim, entry)
        return self.target_volume - int(overlap.min()) * self.space.itemsize

    def _dim_overlap(self, dim: int, entry) -> np.ndarray:
        """Per rank, how many indices of `dim` its slice under `entry` shares with its target
        slice (memoised: a search meets few entries per dim but many combinations of them)."""
        key = (dim, entry)
        if key not in self.overlaps:
            start, length = self._range(self.space.shape[dim], entry)
            low = np.maximum(start, self.target_start[dim])
            high = np.minimum(start + length, self.target_start[dim] + self.target_size[dim])
            self.overlaps[key] = np.maximum(high - low, 0)
        return self.overlaps[key]


@lru_cache(maxsize=256)
def receive_bound(space: Space, target: State) -> ReceiveBound:
    """The shared `ReceiveBound` towards `target` (a table's column is searched from every row).

    Example:
        >>> bound = receive_bound(Space(sizes=(2,), shape=(4,), itemsize=4), (((0,),), ()))
        >>> bound((((),), ())), bound((((),), (0,)))
        (0, 8)
    """
    return ReceiveBound(space, target)
