"""Refine two device matrices with the same `device_num` to a common one.

A device matrix is a row-major reshape of the ranks ``0 .. device_num - 1``; its prefix products
(``[2, 4]`` → 2, 8) are the breakpoints where an axis starts. The coarsest common refinement has
the union of both breakpoint sets, which works when that union is a divisibility chain
(``[2, 4]`` and ``[4, 2]`` → 2, 4, 8 → ``[2, 2, 2]``). When it is not (``[2, 3]`` and ``[3, 2]``)
no device matrix refines both: each side is refined to its own prime factors and the planner
crosses from one to the other with a CollectivePermute.

Refining a layout rewrites every device axis as the refined axes it covers, major first, so
every rank keeps exactly the same slice.
"""

from __future__ import annotations

import math

from autostrat.errors import LayoutError
from autostrat.layout import DeviceMatrix, Layout, TensorMap


def _breakpoints(matrix: DeviceMatrix) -> list[int]:
    return [math.prod(matrix.shape[: i + 1]) for i in range(matrix.ndim)]


def _matrix(points) -> DeviceMatrix:
    points = sorted(set(points))
    sizes = [high // low for low, high in zip([1] + points, points) if high > low]
    return DeviceMatrix(tuple(sizes) or (1,))


def common_matrix(first: DeviceMatrix, second: DeviceMatrix) -> DeviceMatrix | None:
    """The coarsest device matrix refining both, or None when none exists.

    Example:
        >>> str(common_matrix(DeviceMatrix((2, 4)), DeviceMatrix((4, 2))))
        '[2, 2, 2]'
        >>> str(common_matrix(DeviceMatrix((2, 1, 4)), DeviceMatrix((1, 8))))
        '[2, 4]'
        >>> common_matrix(DeviceMatrix((2, 3)), DeviceMatrix((3, 2))) is None
        True
    """
    if first.device_num != second.device_num:
        raise LayoutError(f"device matrices {first} and {second} have different device_num")
    points = sorted(set(_breakpoints(first)) | set(_breakpoints(second)))
    if any(high % low for low, high in zip(points, points[1:])):
        return None
    return _matrix(points)


def prime_matrix(matrix: DeviceMatrix) -> DeviceMatrix:
    """`matrix` with every axis cut into its prime factors, smallest first (major).

    Example:
        >>> str(prime_matrix(DeviceMatrix((6, 4))))
        '[2, 3, 2, 2]'
    """
    sizes = []
    for size in matrix.shape:
        factor = 2
        while size > 1:
            while size % factor == 0:
                sizes.append(factor)
                size //= factor
            factor += 1
    return DeviceMatrix(tuple(sizes) or (1,))


def axis_map(coarse: DeviceMatrix, fine: DeviceMatrix) -> dict[int, tuple[int, ...]]:
    """Per axis of `coarse`, the axes of `fine` it covers, major first (axes counted from the right).

    Example:
        >>> axis_map(DeviceMatrix((2, 4)), DeviceMatrix((2, 2, 2)))
        {0: (1, 0), 1: (2,)}
    """
    fine_points = _breakpoints(fine)
    if not set(_breakpoints(coarse)) <= set(fine_points) | {1}:
        raise LayoutError(f"device matrix {fine} does not refine {coarse}")
    mapping, low = {}, 1
    for position, high in enumerate(_breakpoints(coarse)):
        covered = [i for i, point in enumerate(fine_points) if low < point <= high]
        mapping[coarse.ndim - 1 - position] = tuple(fine.ndim - 1 - i for i in covered)
        low = high
    return dict(sorted(mapping.items()))


def refine_layout(layout: Layout, matrix: DeviceMatrix) -> Layout:
    """The same distribution as `layout`, written over the finer device matrix `matrix`.

    Example:
        >>> layout = Layout(DeviceMatrix((8,)), TensorMap((0, -1)), (16, 4))
        >>> str(refine_layout(layout, DeviceMatrix((2, 4))))
        '[16, 4] dm[2, 4] tm((1, 0), -1)'
    """
    mapping = axis_map(layout.device_matrix, matrix)
    entries = tuple(tuple(a for axis in entry for a in mapping[axis]) for entry in layout.tensor_map.entries)
    partial = tuple(a for axis in layout.partial for a in mapping[axis])
    return Layout(matrix, TensorMap(entries), layout.shape, partial, layout.partial_op)
