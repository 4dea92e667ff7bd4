"""Cut a global numpy array into per-rank slices for a layout, and assemble slices back."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from autostrat.errors import LayoutError
from autostrat.layout.layout import Layout

_COMBINE = {"sum": np.add, "max": np.maximum, "min": np.minimum}


def rank_slices(layout: Layout, rank: int) -> tuple[slice, ...]:
    """Index of the rank's slice in the global tensor, usable as ``array[index]``."""
    return tuple(slice(start, stop) for start, stop in layout.slice_range(rank))


def split_tensor(array: np.ndarray, layout: Layout) -> list[np.ndarray]:
    """One slice per rank (copies). For a partial layout the value is spread so that combining
    the slices by `partial_op` gives it back: the first rank of each partial group holds it
    and, for a sum, the others hold zeros.

    Example:
        >>> from autostrat.layout import DeviceMatrix, TensorMap
        >>> layout = Layout(DeviceMatrix((2,)), TensorMap((0, -1)), (4, 3))
        >>> [piece.shape for piece in split_tensor(np.zeros((4, 3)), layout)]
        [(2, 3), (2, 3)]
    """
    array = np.asarray(array)
    if array.shape != layout.shape:
        raise LayoutError(f"array of shape {list(array.shape)} does not match layout {layout}")
    pieces = [array[rank_slices(layout, rank)].copy() for rank in range(layout.device_num)]
    if layout.partial and layout.partial_op == "sum":
        for group in layout.partial_groups():
            for rank in group[1:]:
                pieces[rank][...] = 0
    return pieces


def assemble_tensor(pieces, layout: Layout, *, check_replicas: bool = False) -> np.ndarray:
    """The global array from one slice per rank: partial axes are combined by `partial_op`.

    With `check_replicas`, ranks that must hold identical slices are compared (exactly) and a
    mismatch raises `LayoutError` naming the ranks.
    """
    if len(pieces) != layout.device_num:
        raise LayoutError(f"expected {layout.device_num} slices for layout {layout}, got {len(pieces)}")
    pieces = [np.asarray(piece) for piece in pieces]
    for rank, piece in enumerate(pieces):
        if piece.shape != layout.slice_shape:
            raise LayoutError(
                f"rank {rank} holds a slice of shape {list(piece.shape)}, "
                f"layout {layout} gives slices of shape {list(layout.slice_shape)}"
            )
    combined = _combine_partial(pieces, layout)
    result = np.empty(layout.shape, dtype=np.result_type(*pieces))
    for group in layout.replica_groups():
        if check_replicas:
            for rank in group[1:]:
                if not np.array_equal(combined[rank], combined[group[0]]):
                    raise LayoutError(f"ranks {group[0]} and {rank} should hold the same slice of {layout}")
        result[rank_slices(layout, group[0])] = combined[group[0]]
    return result


def _combine_partial(pieces: list[np.ndarray], layout: Layout) -> list[np.ndarray]:
    if not layout.partial:
        return pieces
    combine = _COMBINE[layout.partial_op]
    combined = list(pieces)
    for group in layout.partial_groups():
        total = pieces[group[0]]
        for rank in group[1:]:
            total = combine(total, pieces[rank])
        for rank in group:
            combined[rank] = total
    return combined


@dataclass(frozen=True)
class SliceContext:
    """Where one rank's slices sit in an op's global operands.

    Most kernels compute the same on a slice as on the whole tensor; the few that do not
    (a Gather of a row-split table, a OneHot with split depth, a mean over a split dim, a
    Reshape to a sliced shape, Dropout's index-based mask) read their slice's place from here.

    Example:
        >>> context = SliceContext((((8, 16), (0, 4)),), ((32, 4),), (((8, 16),),), ((32,),))
        >>> context.input_offset(0, 0), context.output_local_shape(0)
        (8, (8,))
    """

    input_ranges: tuple[tuple[tuple[int, int], ...], ...]
    input_shapes: tuple[tuple[int, ...], ...]
    output_ranges: tuple[tuple[tuple[int, int], ...], ...]
    output_shapes: tuple[tuple[int, ...], ...]

    @classmethod
    def of(cls, rank: int, input_layouts, output_layouts) -> "SliceContext":
        """`rank`'s context for an op whose operands have these layouts."""
        return cls(
            tuple(layout.slice_range(rank) for layout in input_layouts),
            tuple(tuple(layout.shape) for layout in input_layouts),
            tuple(layout.slice_range(rank) for layout in output_layouts),
            tuple(tuple(layout.shape) for layout in output_layouts),
        )

    def input_offset(self, index: int, dim: int) -> int:
        return self.input_ranges[index][dim][0]

    def output_offset(self, index: int, dim: int) -> int:
        return self.output_ranges[index][dim][0]

    def output_local_shape(self, index: int) -> tuple[int, ...]:
        return tuple(stop - start for start, stop in self.output_ranges[index])
