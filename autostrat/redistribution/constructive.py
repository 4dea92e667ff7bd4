"""Which pairs of layouts a plan joins, and one plan for every such pair, built without a search.

Steps resolve partial values (AllReduce, ReduceScatter), hand their roles to other axes of equal
size (CollectivePermute, or a crossing between the two device matrices of a search) and create
them on free axes (PartialCreate). So every destination is reachable from every source of the
same tensor on the same cluster: within one partial op the constructive plan
(`constructive_path`) shows it, and a partial source of another op is first resolved
(`planner._resolved_first`). The search uses this plan as its fallback past its state limit and
as its upper bound.

The plan, in its cases:

1. keep as many source partial axes as can take a destination partial axis's role, one per
   destination partial axis of the same size (the same axis when it is partial in the source
   and the problem has one space); resolve the others with one AllReduce;
2. gather every split dim (one AllGather per dim), but without a permute a dim whose axes
   start the destination's axes of that dim keeps them;
3. when the kept axes are not the destination's, one CollectivePermute hands their roles over
   (and crosses to the destination's device matrix when the problem has two); a crossing of a
   replicated, whole tensor moves no data;
4. slice the destination's split dims where they still lack axes, major axis first;
5. create the destination's partial axes that no kept axis took (one PartialCreate, free).
"""

from __future__ import annotations

from autostrat.cost import collective_bytes
from autostrat.redistribution.moves import Move, group_size
from autostrat.redistribution.layers import Problem


def _kept_partial(sizes, partial, target_sizes, target_partial, same_space: bool) -> dict[int, int]:
    """Source partial axis -> the destination partial axis whose role it takes (step 1); the
    destination partial axes no source axis of their size is left for are created (step 5)."""
    kept: dict[int, int] = {}
    for axis in target_partial:
        if same_space and axis in partial and axis not in kept:
            kept[axis] = axis
    for axis in target_partial:
        if axis in kept.values():
            continue
        pick = next((a for a in partial if a not in kept and sizes[a] == target_sizes[axis]), None)
        if pick is not None:
            kept[pick] = axis
    return kept


def _relabelling(sizes, target_sizes, kept: dict[int, int]) -> tuple[int, ...]:
    """A bijection of axes of equal sizes extending `kept`, fixing what it can (step 3)."""
    mapping = dict(kept)
    taken = set(kept.values())
    for axis in range(len(sizes)):
        if axis in mapping:
            continue
        image = axis if axis < len(target_sizes) and axis not in taken and target_sizes[axis] == sizes[axis] else None
        if image is None:
            image = next(b for b in range(len(target_sizes)) if b not in taken and target_sizes[b] == sizes[axis])
        mapping[axis] = image
        taken.add(image)
    return tuple(mapping[axis] for axis in range(len(sizes)))


def constructive_path(problem: Problem, start, target) -> list[tuple]:
    """The ``(node, move, child)`` steps of the constructive plan from `start` to a reachable
    `target` (the module docstring's cases).

    Example (a partial sum over axis 1 of two handed to axis 0: a permute of the whole piece):
        >>> from autostrat.redistribution.moves import Space
        >>> problem = Problem((Space((2, 2), (8, 8), 4),), "sum")
        >>> path = constructive_path(problem, (0, (((), ()), (1,))), (0, (((), ()), (0,))))
        >>> [(move.kind, move.mapping, move.bytes) for _, move, _ in path]
        [('CollectivePermute', (1, 0), 256)]
    """
    path, node = [], start
    space, last = problem.spaces[0], problem.spaces[-1]

    def step(kind, axes, dims, state, sent, layer=None, mapping=None):
        nonlocal node
        child = (node[0] if layer is None else layer, state)
        path.append((node, Move(kind, axes, dims, mapping, state, sent), child))
        node = child

    entries, partial = start[1]
    kept = _kept_partial(space.sizes, partial, last.sizes, target[1][1], len(problem.spaces) == 1)
    resolved = tuple(axis for axis in partial if axis not in kept)
    if resolved:
        g = group_size(space.sizes, resolved)
        step("AllReduce", resolved, (), (entries, tuple(sorted(kept))), collective_bytes("AllReduce", g, space.local_bytes(node[1]), space.itemsize))
    mapping = _relabelling(space.sizes, last.sizes, kept)
    permuted = target[0] != start[0] or any(axis != image for axis, image in enumerate(mapping))
    for dim, entry in enumerate(entries):
        if entry and (permuted or target[1][0][dim][: len(entry)] != entry):
            gathered = node[1][0][:dim] + ((),) + node[1][0][dim + 1 :]
            step("AllGather", entry, (dim,), (gathered, node[1][1]), collective_bytes("AllGather", group_size(space.sizes, entry), space.local_bytes(node[1])))
    if permuted:
        moved = tuple(axis for axis, image in enumerate(mapping) if axis != image or target[0] != start[0])
        state = (node[1][0], tuple(sorted(kept.values())))
        # Every rank holds the whole tensor: only partial pieces differ between ranks.
        same = problem.layout(node).normalized() == problem.layout((target[0], state)).normalized()
        step("CollectivePermute", moved, (), state, 0 if same else space.local_bytes(node[1]), layer=target[0], mapping=mapping)
    for dim, entry in enumerate(target[1][0]):
        for axis in entry[len(node[1][0][dim]) :]:
            sliced = node[1][0][:dim] + (node[1][0][dim] + (axis,),) + node[1][0][dim + 1 :]
            step("Slice", (axis,), (dim,), (sliced, node[1][1]), 0)
    created = tuple(axis for axis in target[1][1] if axis not in node[1][1])
    if created:
        step("PartialCreate", created, (), target[1], 0)
    return path


