"""An A* lower bound: the bytes some rank still has to receive.

In every step kind a device receives no more bytes than the step's cost charges it (ring
collectives send and receive alike; a permute receives one piece). A rank must receive every
element of its destination slice that its current slice lacks and, while partial axes the
destination does not have remain, at least one value for every element of its destination slice
(its own value is only a part). The largest such amount over ranks never exceeds the remaining
cost, and one step lowers it by at most that step's cost, so the bound is admissible and
consistent: A* with it settles the same optimum as Dijkstra.
"""

from __future__ import annotations

import math

import numpy as np

from autostrat.redistribution.moves import Space, State


class ReceiveBound:
    """The lower bound towards one target state over one space (axes counted from the right)."""

    def __init__(self, space: Space, target: State):
        self.space, self.target_partial = space, set(target[1])
        sizes = space.sizes
        positions = np.indices(tuple(reversed(sizes))).reshape(len(sizes), -1)
        self.coordinates = positions[::-1]  # row a = coordinate of every rank along axis a
        self.target_start, self.target_size = self._ranges(target[0])
        self.target_volume = math.prod(self.target_size) * space.itemsize

    def _ranges(self, entries):
        starts, lengths = [], []
        for size, entry in zip(self.space.shape, entries):
            index = np.zeros(self.coordinates.shape[1], dtype=np.int64)
            for axis in entry:
                index = index * self.space.sizes[axis] + self.coordinates[axis]
            length = size // math.prod(self.space.sizes[axis] for axis in entry)
            starts.append(index * length)
            lengths.append(length)
        return starts, lengths

    def __call__(self, state: State) -> int:
        if self.target_partial:
            return 0
        if state[1]:
            return self.target_volume
        starts, lengths = self._ranges(state[0])
        overlap = np.ones(self.coordinates.shape[1], dtype=np.int64)
        for start, length, target_start, target_length in zip(starts, lengths, self.target_start, self.target_size):
            low = np.maximum(start, target_start)
            high = np.minimum(start + length, target_start + target_length)
            overlap *= np.maximum(high - low, 0)
        return self.target_volume - int(overlap.min()) * self.space.itemsize
