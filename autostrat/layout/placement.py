"""Placements: where a strategy's factors sit on the device axes.

Strategy tuples imply one placement (`default_placement`): one device axis per factor, in the
rule's factor order, then the repeated-calculation axis. A MindSpore ``Layout`` seed, or a
candidate that reads a neighbour's layout as it is (`aligned`), may use any order and put a
factor on several axes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from autostrat.layout.device_matrix import DeviceMatrix
from autostrat.layout.layout import Layout, TensorMap


@dataclass(frozen=True)
class Placement:
    """The device matrix and, per factor of a rule, the device axes splitting it (counted from
    the right, major first; () when not split). Axes no factor uses repeat the calculation.

    Example (MatMul ``m k, k n`` with m on the minor axis of [4, 2] and k on the major one):
        >>> Placement((4, 2), ((0,), (1,), ()))
        Placement(matrix=(4, 2), axes=((0,), (1,), ()))
    """

    matrix: tuple[int, ...]
    axes: tuple[tuple[int, ...], ...]

    def factor_layout(self, sizes: tuple[int, ...]) -> Layout:
        """The factors as the dims of one pseudo-tensor of shape `sizes` in this placement: two
        placements split every factor alike on every rank iff these layouts are equivalent."""
        return Layout(DeviceMatrix(self.matrix), TensorMap(tuple(axes or -1 for axes in self.axes)), sizes)


def default_placement(splits: tuple[int, ...], device_num: int) -> Placement:
    """The placement strategy tuples imply: one axis per factor in the rule's order, then the
    repeated-calculation axis."""
    repeat = device_num // math.prod(splits)
    matrix = splits + ((repeat,) if repeat > 1 or not splits else ())
    return Placement(matrix, tuple((len(matrix) - 1 - index,) for index in range(len(splits))))


def aligned(factors: tuple[str, ...], splits: tuple[int, ...], dims, layout: Layout) -> Placement | None:
    """A placement of `splits` (one per factor of a rule's `factors`) in which the operand whose
    dims are made of the factors `dims` takes `layout` as it is, or None when there is none.

    The factors of a dim `layout` splits take that dim's axes (major first, as many as each
    factor's split); the factors of dims `layout` leaves whole, then the other factors, take the
    axes it leaves free (its repeated and partial axes: a partial sum then resolves into that
    dim, a ReduceScatter), major first, as many as make their split; the rest repeat.

    Example (BiasAdd ``m n`` reading a MatMul's output on [4, 2]: m on axis 0, partial on 1):
        >>> layout = Layout(DeviceMatrix((4, 2)), TensorMap((0, -1)), (64, 64), partial=(1,))
        >>> aligned(("m", "n"), (2, 4), (("m",), ("n",)), layout)
        Placement(matrix=(4, 2), axes=((0,), (1,)))
    """
    matrix = layout.device_matrix.shape
    sizes = tuple(reversed(matrix))  # by axis, counted from the right
    split_of = dict(zip(factors, splits))
    axes: dict[str, tuple[int, ...]] = {}
    for factors_of_dim, entry in zip(dims, layout.tensor_map.entries):
        entry = tuple(axis for axis in entry if sizes[axis] > 1)
        if not entry:
            continue
        for factor in factors_of_dim:
            taken = take_axes(split_of[factor], entry, sizes)
            if taken is None or factor in axes and axes[factor] != entry[:taken]:
                return None
            axes[factor], entry = entry[:taken], entry[taken:]
        if entry:
            return None  # the dim is split more than its factors are
    used = {axis for chosen in axes.values() for axis in chosen}
    free = [axis for axis in sorted(range(len(sizes)), reverse=True) if axis not in used and sizes[axis] > 1]
    for factor in factors:
        if factor in axes or split_of[factor] == 1:
            continue
        taken = take_axes(split_of[factor], tuple(free), sizes)
        if taken is None:
            return None
        axes[factor], free = tuple(free[:taken]), free[taken:]
    return Placement(matrix, tuple(axes.get(factor, ()) for factor in factors))


def take_axes(split: int, axes: tuple[int, ...], sizes: tuple[int, ...]) -> int | None:
    """How many of `axes` (major first) make exactly `split` parts, or None."""
    count, parts = 0, 1
    while parts < split and count < len(axes):
        parts *= sizes[axes[count]]
        count += 1
    return count if parts == split else None
