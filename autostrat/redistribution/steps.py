"""Turn a search move into a `RedistributionStep`: layouts, ordered rank groups, permute sources."""

from __future__ import annotations

from autostrat.layout import Layout
from autostrat.redistribution.moves import Move
from autostrat.redistribution.plan import RedistributionStep
from autostrat.redistribution.layers import Problem


def _chunk_key(kind: str, dims, before: Layout, after: Layout):
    """How members of a group are ordered: by the chunk of the step's dim each one holds."""
    if kind in ("AllGather", "AllToAll"):
        return before.dim_shards(dims[0]).__getitem__
    if kind in ("Slice", "ReduceScatter"):
        return after.dim_shards(dims[0]).__getitem__
    return None  # by rank


def permute_sources(before: Layout, after: Layout, mapping) -> tuple[int, ...]:
    """Per rank of `after`, the rank of `before` whose piece it takes, when `after` renames
    every axis ``a`` of `before` as ``mapping[a]`` (the two matrices may differ in axis order).

    Example (swap the two axes of ``[2, 2]``):
        >>> from autostrat.layout import DeviceMatrix, TensorMap
        >>> before = Layout(DeviceMatrix((2, 2)), TensorMap((1, 0)), (4, 4))
        >>> after = Layout(DeviceMatrix((2, 2)), TensorMap((0, 1)), (4, 4))
        >>> permute_sources(before, after, (1, 0))
        (0, 2, 1, 3)
    """
    source, target = before.device_matrix, after.device_matrix
    sources = []
    for rank in range(target.device_num):
        coordinate = target.coordinate(rank)
        wanted = [0] * source.ndim
        for axis in range(source.ndim):
            wanted[source.position(axis)] = coordinate[target.position(mapping[axis])]
        sources.append(source.rank(tuple(wanted)))
    return tuple(sources)


def make_step(problem: Problem, node, move: Move, child) -> RedistributionStep | None:
    """The step `move` takes from `node` to `child`; None for a layer crossing that moves no data."""
    before, after = problem.layout(node), problem.layout(child)
    if move.kind == "CollectivePermute":
        if before.normalized() == after.normalized():
            return None
        sources = permute_sources(before, after, move.mapping)
        pairs = tuple(sorted((source, rank) for rank, source in enumerate(sources) if source != rank))
        return RedistributionStep(move.kind, move.axes, (), before, after, pairs, move.bytes, sources)
    key = _chunk_key(move.kind, move.dims, before, after)
    groups = tuple(tuple(sorted(group, key=key)) for group in before.device_matrix.groups(move.axes))
    return RedistributionStep(move.kind, move.axes, move.dims, before, after, groups, move.bytes)
