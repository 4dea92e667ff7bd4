"""Local reshapes: when every rank's piece of one layout, reshaped, is its piece of another.

A row-major reshape from shape A to shape B (equal element counts) splits into groups at the
common breakpoints of their prefix products (``[8, 6]`` and ``[2, 4, 6]`` → ``[8] ~ [2, 4]`` and
``[6] ~ [6]``); within a group both sides view one flat run of elements. A rank's piece stays a
piece under the reshape iff, in every group, its box flattens to an aligned contiguous run (the
group's leading dims split into single indices, one dim split further, later dims whole) that
is also a box of the other side. Both hold exactly when the group's axes, major first, form a
"flat entry" that cuts both sides' dims into whole leading parts: its axes fill the first dim
exactly, then the next, and only the last dim they reach may be filled partly (`unflatten`).
So a local reshape is a bijection between compatible states of A and of B that keeps partial
axes, free axes and the bytes every rank holds: Reshape is free (MindSpore's ``Reshape``).
"""

from __future__ import annotations

import itertools
import math

from autostrat.redistribution.moves import State, group_size


def shape_groups(first: tuple[int, ...], second: tuple[int, ...]) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """Pairs of dim index tuples (of `first`, of `second`) that view one flat run of elements.

    Example:
        >>> shape_groups((8, 6), (2, 4, 6))
        [((0,), (0, 1)), ((1,), (2,))]
        >>> shape_groups((6, 4), (4, 6))
        [((0, 1), (0, 1))]
    """
    groups, low_a, low_b = [], 0, 0
    product_a = product_b = 1
    a = b = 0
    while a < len(first) or b < len(second):
        # Advance the side with the smaller prefix product; close a group when they meet.
        if b >= len(second) or (a < len(first) and product_a * first[a] <= product_b):
            product_a *= first[a]
            a += 1
        else:
            product_b *= second[b]
            b += 1
        if product_a == product_b and (a == len(first) or first[a] != 1 or b == len(second)):
            if a > low_a or b > low_b:
                groups.append((tuple(range(low_a, a)), tuple(range(low_b, b))))
            low_a, low_b = a, b
    return groups


def flatten(sizes, dim_sizes, entries) -> tuple[int, ...] | None:
    """The flat entry of one group's `entries` (over dims of `dim_sizes`), or None when a rank's
    box is not a contiguous run: after a dim split into fewer parts than its size, every later
    dim must be whole.

    Example (axis sizes (2, 2)):
        >>> flatten((2, 2), (2, 4), ((1,), (0,))), flatten((2, 2), (4, 2), ((1,), (0,)))
        ((1, 0), None)
    """
    flat, closed = [], False
    for size, entry in zip(dim_sizes, entries):
        parts = group_size(sizes, entry)
        if closed and parts > 1:
            return None
        flat.extend(entry)
        closed = closed or parts < size
    return tuple(flat)


def unflatten(sizes, dim_sizes, flat) -> tuple[tuple[int, ...], ...] | None:
    """The entries of one group's dims that `flat` splits into, or None when an axis would
    straddle two dims (it must fill each dim exactly before the next; only the last may be
    filled partly).

    Example:
        >>> unflatten((2, 2), (2, 4), (1, 0)), unflatten((4,), (2, 2), (0,))
        (((1,), (0,)), None)
    """
    entries: list[list[int]] = [[] for _ in dim_sizes]
    dim, product = 0, 1
    for axis in flat:
        while dim < len(dim_sizes) and product == dim_sizes[dim]:
            dim, product = dim + 1, 1
        if dim == len(dim_sizes) or dim_sizes[dim] % (product * sizes[axis]):
            return None
        entries[dim].append(axis)
        product *= sizes[axis]
    return tuple(tuple(entry) for entry in entries)


def reshape_state(sizes, first: tuple[int, ...], second: tuple[int, ...], state: State) -> State | None:
    """The state over `second` whose pieces are the reshaped pieces of `state` over `first`,
    or None when the reshape is not local (same axes, partial axes kept).

    Example ([8, 6] split 4-way on rows -> [2, 4, 6] split on dims 0 and 1):
        >>> reshape_state((2, 2), (8, 6), (2, 4, 6), (((1, 0), ()), ()))
        (((1,), (0,), ()), ())
    """
    entries: list = [()] * len(second)
    for dims_a, dims_b in shape_groups(first, second):
        flat = flatten(sizes, [first[d] for d in dims_a], [state[0][d] for d in dims_a])
        found = None if flat is None else unflatten(sizes, [second[d] for d in dims_b], flat)
        if found is None:
            return None
        for dim, entry in zip(dims_b, found):
            entries[dim] = entry
    return tuple(entries), state[1]


def reshape_pairs(sizes, first, second, partial) -> list[tuple[State, State]]:
    """Every compatible ``(state over first, state over second)`` pair whose partial axes are a
    subset of `partial`, in a fixed order: every axis is free, partial or in one group's flat
    entry, and each group's flat entry must cut both sides' dims (`unflatten`).

    Example (2 devices, [4] -> [2, 2]: the whole tensor, or split on dim 0):
        >>> [pair[1] for pair in reshape_pairs((2,), (4,), (2, 2), ())]
        [(((), ()), ()), (((0,), ()), ())]
    """
    groups = shape_groups(first, second)
    found = []
    for roles in itertools.product(range(-2, len(groups)), repeat=len(sizes)):
        if any(role == -1 and axis not in partial for axis, role in enumerate(roles)):
            continue
        members = [[a for a, role in enumerate(roles) if role == g] for g in range(len(groups))]
        state_partial = tuple(a for a, role in enumerate(roles) if role == -1)
        for orders in itertools.product(*(itertools.permutations(axes) for axes in members)):
            pair = _pair(sizes, first, second, groups, orders, state_partial)
            if pair is not None:
                found.append(pair)
    return found


def _pair(sizes, first, second, groups, orders, partial) -> tuple[State, State] | None:
    entries_a: list = [()] * len(first)
    entries_b: list = [()] * len(second)
    for (dims_a, dims_b), flat in zip(groups, orders):
        if math.prod(first[d] for d in dims_a) % group_size(sizes, flat):
            return None
        cut_a = unflatten(sizes, [first[d] for d in dims_a], flat)
        cut_b = unflatten(sizes, [second[d] for d in dims_b], flat)
        if cut_a is None or cut_b is None:
            return None
        for dim, entry in zip(dims_a, cut_a):
            entries_a[dim] = entry
        for dim, entry in zip(dims_b, cut_b):
            entries_b[dim] = entry
    return (tuple(entries_a), partial), (tuple(entries_b), partial)
