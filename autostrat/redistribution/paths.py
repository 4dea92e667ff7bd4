"""A path the layout search found, made real and short: states kept up to relabellings made
real (`real_states`, `onto_target`), the permuted layer's representatives
replaced by real states (`unpermute`), and runs of single-axis steps over one dim merged into
one step over their block (`merged_units`, `ordered_slices`)."""

from __future__ import annotations

from autostrat.redistribution.moves import canonical, pool_canonical, relabel
from autostrat.redistribution.relabellings import conjugated


def inverse(mapping) -> list[int]:
    """The relabelling undoing `mapping` (``mapping[a]``: a's new name).

    Example:
        >>> inverse((2, 0, 1))
        [1, 2, 0]
    """
    undone = [0] * len(mapping)
    for axis, image in enumerate(mapping):
        undone[image] = axis
    return undone


def real_states(pools, count: int, start, path: list[tuple], permuted: int) -> list[tuple]:
    """`path` over representatives (states kept up to the relabellings of `pools`, of `count`
    axes) as real states from the real `start`: ``back`` maps the axes of each representative
    to real ones; it fixes the target, so the path still ends there. Layer `permuted`'s states
    are left to `unpermute`."""
    if not pools:
        return path
    back = inverse(pool_canonical(pools, count, start)[1])
    real = []
    for node, move, child in path:
        if node[0] == permuted:
            real.append((node, move, child))
        elif child[0] == permuted:
            real.append(((node[0], relabel(node[1], back)), move, child))
        else:
            state = relabel(move.state, back)
            mapping = None if move.mapping is None else conjugated(move.mapping, back)
            moved = move._replace(axes=tuple(back[a] for a in move.axes), state=state, mapping=mapping)
            real.append(((node[0], relabel(node[1], back)), moved, (child[0], state)))
            step = inverse(pool_canonical(pools, count, move.state)[1])
            back = [back[step[axis]] for axis in range(count)]
    return real


def onto_target(pools, count: int, target, path: list[tuple]) -> list[tuple]:
    """`path` (real steps kept up to the source's relabellings, `pools`) ends at a relabelling of
    `target` that fixes the source; its inverse maps the path, step for step at the same price
    (see `search`'s module docstring), onto one from the source to `target` itself."""
    if not path:
        return path
    end = path[-1][2][1]
    to_end = inverse(pool_canonical(pools, count, end)[1])  # representative -> end
    from_target = pool_canonical(pools, count, target)[1]  # target -> representative
    back = inverse([to_end[from_target[axis]] for axis in range(count)])  # end -> target
    if relabel(end, back) != target:
        raise AssertionError("a path kept up to the source's relabellings ends off the target's class")
    return [
        ((node[0], relabel(node[1], back)), move._replace(axes=tuple(back[a] for a in move.axes), state=relabel(move.state, back)),
         (child[0], relabel(child[1], back)))
        for node, move, child in path
    ]


def unpermute(problem, path: list[tuple], target, permuted: int) -> list[tuple]:
    """Replace the representatives of layer `permuted` (states kept up to relabelling after a
    permute) by the real states, choosing the permute's relabelling so the last one is `target`
    (walk back composing each step's relabelling)."""
    sizes = problem.spaces[-1].sizes
    back = inverse(canonical(sizes, sizes, target[1])[1])  # representative axis -> real axis
    tail, child = [], target
    for index in range(len(path) - 1, -1, -1):
        node, move, _ = path[index]
        if node[0] != permuted:
            mapping = tuple(back[a] for a in canonical(problem.space(node[0]).sizes, sizes, node[1])[1])
            changed = tuple(a for a in range(len(mapping)) if mapping[a] != a or node[0] != target[0])
            tail.append((node, move._replace(axes=changed, mapping=mapping, state=child[1]), child))
            return path[:index] + tail[::-1]
        step = canonical(sizes, sizes, move.state)[1]  # the move's axes -> next representative
        back = [back[step[axis]] for axis in range(len(sizes))]
        real = (target[0], relabel(node[1], back))
        tail.append((real, move._replace(axes=tuple(back[a] for a in move.axes), state=child[1]), child))
        child = real
    raise AssertionError("a path into the permuted layer starts with a permute")


def merged_units(path) -> list[tuple]:
    """`path` with runs of single-axis AllGathers (or ReduceScatters) of one dim, as a cost
    search takes them (``unit``), merged into one step over their block: the same bytes
    ((g1·g2 - 1)·s for a gather, (1 - 1/(g1·g2))·s for a scatter) in fewer messages. A
    ReduceScatter block places larger axis ids first (`moves._reductions`), so only scatters in
    that order merge.

    Example:
        >>> from autostrat.redistribution.moves import Move
        >>> first = ((0, (((1, 0),), ())), Move("AllGather", (0,), (0,), None, (((1,),), ()), 4), (0, (((1,),), ())))
        >>> second = ((0, (((1,),), ())), Move("AllGather", (1,), (0,), None, (((),), ()), 8), (0, (((),), ())))
        >>> [(move.axes, move.bytes) for _, move, _ in merged_units([first, second])]
        [((1, 0), 12)]
    """
    merged: list[tuple] = []
    for node, move, child in path:
        last = merged[-1][1] if merged else None
        if last is not None and last.kind == move.kind and last.dims == move.dims and len(move.axes) == 1:
            if move.kind == "AllGather":
                block = move.axes + last.axes  # the next minor-most axis goes before the gathered block
            elif move.kind == "ReduceScatter" and last.axes[-1] > move.axes[0]:
                block = last.axes + move.axes
            else:
                block = None
            if block is not None:
                merged[-1] = (merged[-1][0], last._replace(axes=block, state=move.state, bytes=last.bytes + move.bytes), child)
                continue
        merged.append((node, move, child))
    return merged


def ordered_slices(path) -> list[tuple]:
    """`path` with consecutive single-axis Slices of one dim merged into one Slice."""
    merged: list[tuple] = []
    for node, move, child in path:
        last = merged[-1] if merged else None
        if last and move.kind == "Slice" and last[1].kind == "Slice" and last[1].dims == move.dims:
            merged[-1] = (last[0], last[1]._replace(axes=last[1].axes + move.axes, state=move.state), child)
        else:
            merged.append((node, move, child))
    return merged
