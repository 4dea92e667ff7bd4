"""The device matrix: `device_num` ranks arranged as an N-d array, row-major.

Device axes are named the MindSpore way, counted **from the right**: in the device matrix
``[2, 4]`` axis 0 has size 4 (it varies fastest between consecutive ranks) and axis 1 has size 2.
Every public function in `autostrat.layout` uses that convention, so a tensor map entry, a
partial axis and a communication group all name the same axis the same way.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cache

import numpy as np

from autostrat.errors import LayoutError


@dataclass(frozen=True)
class DeviceMatrix:
    """Ranks ``0 .. device_num - 1`` laid out row-major over ``shape``.

    Example:
        >>> matrix = DeviceMatrix((2, 4))
        >>> matrix.coordinate(5), matrix.rank((1, 1)), matrix.axis_size(0)
        ((1, 1), 5, 4)
        >>> matrix.groups([0])
        ((0, 1, 2, 3), (4, 5, 6, 7))
        >>> str(matrix)
        '[2, 4]'
    """

    shape: tuple[int, ...]

    def __post_init__(self) -> None:
        shape = tuple(self.shape)
        if not shape or not all(isinstance(size, int) and size >= 1 for size in shape):
            raise LayoutError(
                f"a device matrix needs one or more positive integer axis sizes, got {list(self.shape)}"
            )
        object.__setattr__(self, "shape", shape)

    @property
    def device_num(self) -> int:
        return math.prod(self.shape)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def position(self, axis: int) -> int:
        """Index into `shape` of a device axis counted from the right."""
        if not 0 <= axis < self.ndim:
            raise LayoutError(
                f"device axis {axis} does not exist in device matrix {self} "
                f"(valid axes: 0..{self.ndim - 1}, counted from the right)"
            )
        return self.ndim - 1 - axis

    def axis_size(self, axis: int) -> int:
        return self.shape[self.position(axis)]

    def coordinate(self, rank: int) -> tuple[int, ...]:
        """The rank's coordinate, left to right (the last entry varies fastest)."""
        if not 0 <= rank < self.device_num:
            raise LayoutError(f"rank {rank} is outside device matrix {self} of {self.device_num} ranks")
        return tuple(int(c) for c in np.unravel_index(rank, self.shape))

    def rank(self, coordinate: tuple[int, ...]) -> int:
        if len(coordinate) != self.ndim or any(not 0 <= c < s for c, s in zip(coordinate, self.shape)):
            raise LayoutError(f"coordinate {tuple(coordinate)} is outside device matrix {self}")
        return int(np.ravel_multi_index(tuple(coordinate), self.shape))

    def axis_coordinate(self, rank: int, axis: int) -> int:
        """The rank's index along one device axis (counted from the right)."""
        return self.coordinate(rank)[self.position(axis)]

    def groups(self, axes) -> tuple[tuple[int, ...], ...]:
        """The rank groups whose members differ only along `axes` (communication groups).

        Inside a group ranks are ordered row-major over the chosen axes, taken left to right;
        groups are ordered by their first rank. No axes gives one group per rank.
        """
        positions = tuple(sorted(self.position(axis) for axis in set(axes)))
        return _groups(self.shape, positions)

    def __str__(self) -> str:
        return "[" + ", ".join(str(size) for size in self.shape) + "]"


@cache
def _groups(shape: tuple[int, ...], positions: tuple[int, ...]) -> tuple[tuple[int, ...], ...]:
    ranks = np.arange(math.prod(shape)).reshape(shape)
    fixed = [p for p in range(len(shape)) if p not in positions]
    size = math.prod(shape[p] for p in positions)
    grouped = ranks.transpose(fixed + list(positions)).reshape(-1, size)
    return tuple(tuple(int(r) for r in row) for row in grouped)
