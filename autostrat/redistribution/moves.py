"""The step set of the planner, on states over one device matrix.

A state is ``(entries, partial)``: per tensor dim the device axes splitting it, major first, and
the sorted partial axes; axes are counted from the right. Every other axis is free (replicated).
From a state, with ``s`` the local bytes before the step and ``g`` the step's group size:

- Slice: a free axis becomes the minor-most axis of a dim (only the minor end keeps every rank's
  new piece inside its old one). Cost 0.
- AllGather: a suffix block of a dim's axes becomes free (a major axis alone would leave strided
  data). Cost ``(g-1)·s``.
- AllToAll: a suffix block of dim i moves, in order, to the minor end of dim j. ``(g-1)·s/g``;
  one AllToAll over several axes is cheaper than one per axis, so blocks are needed.
- AllReduce: any non-empty set of partial axes becomes free. ``2(g-1)·s/g``; again cheaper over
  several axes at once.
- ReduceScatter: a non-empty set of partial axes becomes the minor end of a dim, larger axis ids
  first. ``(g-1)·s/g``.
- CollectivePermute: a relabelling of axes of equal sizes (an axis's role handed to a free axis,
  roles swapped or cycled). Cost ``s``. Every other step commutes with a relabelling, so the
  permutes of a sequence merge into one; `moves` leaves them out and the search has one
  "permuted" layer of states taken up to relabelling (`canonical`) instead.
- PartialCreate: free axes become partial (DTensor's Replicate -> Partial). For a sum the rank
  whose coordinates on those axes are all 0 keeps its piece and every other rank holds zeros;
  for max and min (idempotent) every rank keeps its piece. Cost 0: nothing is sent.

A PartialCreate is only ever needed last, or just before a crossing between two device matrices:
a created axis is never reduced in a cheapest plan (a Slice or nothing does at no cost what
reducing zeros does), and every other step leaves it alone or hands its role on (a permute, at
the same price), so creating it after them reaches the same state at the same price. A crossing
is the exception: it is free only when both sides are the same layout, and partial axes can make
them so (``[2, 3]`` and ``[3, 2]`` both partial over all six ranks). So `moves` leaves it out, and
the search takes it into its target (`creation`), one step over all the target's partial axes a
state lacks, and before a crossing (`creations`): the branching stays what it was. Every step
keeps every dim divisible.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from dataclasses import dataclass
from functools import lru_cache
from typing import NamedTuple

from autostrat.cost import collective_bytes

State = tuple[tuple[tuple[int, ...], ...], tuple[int, ...]]


@dataclass(frozen=True)
class Space:
    """What every state of one search shares: axis sizes (index = axis id), shape, bytes per element."""

    sizes: tuple[int, ...]
    shape: tuple[int, ...]
    itemsize: int

    def __hash__(self) -> int:
        # Every memo of a search is keyed by its space: hash the fields once, not on each lookup.
        found = self.__dict__.get("_hash")
        if found is None:
            found = hash((self.sizes, self.shape, self.itemsize))
            object.__setattr__(self, "_hash", found)
        return found

    def local_bytes(self, state: State) -> int:
        used = 1
        for entry in state[0]:
            used *= group_size(self.sizes, entry)
        return math.prod(self.shape) * self.itemsize // used


class Move(NamedTuple):
    """One step out of a state; `mapping` (new axis per old axis) is set for CollectivePermute only."""

    kind: str
    axes: tuple[int, ...]
    dims: tuple[int, ...]
    mapping: tuple[int, ...] | None
    state: State
    bytes: int


def _replace(entries, dim: int, entry) -> tuple:
    return entries[:dim] + (tuple(entry),) + entries[dim + 1 :]


def group_size(sizes: tuple[int, ...], axes) -> int:
    """How many ranks a group over `axes` has (sizes indexed by axis id).

    Example:
        >>> group_size((4, 2, 3), (0, 2))
        12
    """
    group = 1  # a loop: faster than math.prod of a generator on these few axes
    for axis in axes:
        group *= sizes[axis]
    return group


@lru_cache(maxsize=1 << 18)
def split_signature(space: Space, state: State) -> tuple[tuple[int, ...], int]:
    """Per dim, into how many parts `state` splits it, and how many contributions its partial
    axes combine: all a size bound needs, and shared by many states (memoised for every target).

    Example:
        >>> split_signature(Space(sizes=(4, 2), shape=(8, 8), itemsize=4), (((1,), ()), (0,)))
        ((2, 1), 4)
    """
    return tuple(group_size(space.sizes, entry) for entry in state[0]), group_size(space.sizes, state[1])


def _rooms(space: Space, entries) -> list[int]:
    """Per dim, its extent on a rank: a block of axes fits there iff its group size divides it."""
    return [size // group_size(space.sizes, entry) for size, entry in zip(space.shape, entries)]


@lru_cache(maxsize=1 << 16)
def moves(space: Space, state: State, unit: bool = False) -> tuple[Move, ...]:
    """Every step out of `state`, in a fixed order (the planner's tie-breaks depend on it).

    With `unit`, AllGathers and ReduceScatters take one axis each: a block costs exactly what
    its axes cost one after another (an AllGather of ``g1·g2`` from ``s``: ``(g1·g2 - 1)·s``,
    as ``(g2 - 1)·s`` then ``(g1 - 1)·g2·s``; a ReduceScatter: ``(1 - 1/(g1·g2))·s`` either
    way), so searches for bytes alone lose nothing and branch less.

    Example:
        >>> space = Space(sizes=(4, 2), shape=(64, 64), itemsize=4)
        >>> [(m.kind, m.axes, m.bytes) for m in moves(space, (((1,), ()), (0,))) if m.kind != "Slice"][:3]
        [('AllGather', (1,), 8192), ('AllToAll', (1,), 4096), ('AllReduce', (0,), 12288)]
    """
    s, rooms = space.local_bytes(state), _rooms(space, state[0])
    return tuple(_slices(space, state, rooms) + _gathers(space, state, s, rooms, unit) + _reductions(space, state, s, rooms, unit))


def _slices(space: Space, state: State, rooms) -> list[Move]:
    entries, partial = state
    used = {axis for entry in entries for axis in entry} | set(partial)
    free = [axis for axis in range(len(space.sizes)) if axis not in used]
    found = []
    for dim, entry in enumerate(entries):
        for axis in free:
            if rooms[dim] % space.sizes[axis] == 0:
                found.append(Move("Slice", (axis,), (dim,), None, (_replace(entries, dim, entry + (axis,)), partial), 0))
    return found


def _gathers(space: Space, state: State, s: int, rooms, unit: bool = False) -> list[Move]:
    """AllToAll of every suffix block of every dim, AllGather of every one (or, with `unit`, of
    the minor-most axis)."""
    entries, partial = state
    found = []
    for dim, entry in enumerate(entries):
        g = 1
        for start in range(len(entry) - 1, -1, -1):
            block, rest = entry[start:], entries[:dim] + (entry[:start],) + entries[dim + 1 :]
            g *= space.sizes[entry[start]]
            if not unit or len(block) == 1:
                found.append(Move("AllGather", block, (dim,), None, (rest, partial), collective_bytes("AllGather", g, s)))
            sent = collective_bytes("AllToAll", g, s)
            for target, target_entry in enumerate(entries):
                if target != dim and rooms[target] % g == 0:
                    moved = (_replace(rest, target, target_entry + block), partial)
                    found.append(Move("AllToAll", block, (dim, target), None, moved, sent))
    return found


@lru_cache(maxsize=4096)
def _blocks(sizes: tuple[int, ...], partial: tuple[int, ...]) -> tuple[tuple, ...]:
    """``(block, group size, remaining partial axes)`` for every non-empty set of partial axes,
    larger axis ids first (memoised: a search meets few partial sets but many states of each)."""
    found = []
    for count in range(1, len(partial) + 1):
        for block in itertools.combinations(sorted(partial, reverse=True), count):
            found.append((block, group_size(sizes, block), tuple(axis for axis in partial if axis not in block)))
    return tuple(found)


def _reductions(space: Space, state: State, s: int, rooms, unit: bool = False) -> list[Move]:
    """AllReduce of every non-empty set of partial axes, ReduceScatter of every one (or, with
    `unit`, of every single axis)."""
    entries, partial = state
    found = []
    for block, g, rest in _blocks(space.sizes, partial):
        found.append(Move("AllReduce", block, (), None, (entries, rest), collective_bytes("AllReduce", g, s, space.itemsize)))
        if unit and len(block) > 1:
            continue
        sent = collective_bytes("ReduceScatter", g, s)
        for dim, entry in enumerate(entries):
            if rooms[dim] % g == 0:
                found.append(Move("ReduceScatter", block, (dim,), None, (_replace(entries, dim, entry + block), rest), sent))
    return found


def creation(state: State, target: State) -> Move | None:
    """The PartialCreate from `state` into `target`: when they split every dim alike and the
    target's partial axes include the state's and more (those are free in the state).

    Example (a whole tensor made a partial sum over axis 1):
        >>> creation((((0,), ()), ()), (((0,), ()), (1,)))
        Move(kind='PartialCreate', axes=(1,), dims=(), mapping=None, state=(((0,), ()), (1,)), bytes=0)
        >>> creation((((0,), ()), ()), (((), ()), (1,))) is None
        True
    """
    entries, partial = state
    if entries != target[0] or len(partial) >= len(target[1]) or not set(partial) <= set(target[1]):
        return None
    return Move("PartialCreate", tuple(axis for axis in target[1] if axis not in partial), (), None, target, 0)


def creations(sizes: tuple[int, ...], state: State, wanted: tuple[int, ...]) -> list[Move]:
    """Every PartialCreate out of `state` over a set of free axes whose sizes are among the
    `wanted` sizes (with multiplicity): before a crossing, the roles the target's partial axes
    can take.

    Example (over axes of sizes 3 and 2, towards one partial axis of size 2):
        >>> [(m.axes, m.state) for m in creations((3, 2), (((),), (0,)), (2,))]
        [((1,), (((),), (0, 1)))]
    """
    entries, partial = state
    used = {axis for entry in entries for axis in entry} | set(partial)
    free = [axis for axis in range(len(sizes)) if axis not in used]
    available = Counter(wanted)
    found = []
    for count in range(1, len(free) + 1):
        for block in itertools.combinations(free, count):
            if not Counter(sizes[axis] for axis in block) - available:
                found.append(Move("PartialCreate", block, (), None, (entries, tuple(sorted(partial + block))), 0))
    return found


def relabel(state: State, mapping) -> State:
    """The state with every axis ``a`` renamed ``mapping[a]``."""
    entries, partial = state
    image = mapping.__getitem__  # map over a bound method: a timed search relabels millions of states
    return tuple(tuple(map(image, entry)) for entry in entries), (tuple(sorted(map(image, partial))) if partial else ())


@lru_cache(maxsize=1 << 16)
def canonical(sizes: tuple[int, ...], target_sizes: tuple[int, ...], state: State) -> tuple[State, tuple[int, ...]]:
    """The representative of `state` up to relabelling, over axes of `target_sizes`, and the
    relabelling used (new axis per old axis). Axes are renamed in the order they appear (dims in
    order, major first, then partial axes), each taking the lowest free id of its size, so two
    states have the same representative iff one is a relabelling of the other.

    Example:
        >>> canonical((2, 2, 2), (2, 2, 2), (((0,), (2,)), ()))
        ((((0,), (1,)), ()), (0, 2, 1))
    """
    entries, partial = state
    pools: dict[int, list[int]] = {}
    for axis, size in enumerate(target_sizes):
        pools.setdefault(size, []).append(axis)
    order = [axis for entry in entries for axis in entry] + list(partial)
    order += [axis for axis in range(len(sizes)) if axis not in order]
    mapping = [0] * len(sizes)
    for axis in order:
        mapping[axis] = pools[sizes[axis]].pop(0)
    return relabel(state, mapping), tuple(mapping)


def fixing_pools(sizes: tuple[int, ...], state: State) -> tuple[tuple[int, ...], ...]:
    """Classes of axes that any relabelling fixing `state` may permute: axes of one size that
    are all free in `state`, or all partial in it (the entries pin every other axis).

    Example:
        >>> fixing_pools((2, 2, 2, 2), (((3,), ()), (1, 2)))
        ((1, 2),)
    """
    used = {axis for entry in state[0] for axis in entry}
    roles = {}
    for axis, size in enumerate(sizes):
        if axis not in used:
            roles.setdefault((axis in state[1], size), []).append(axis)
    return tuple(tuple(pool) for _, pool in sorted(roles.items()) if len(pool) > 1)


def pools_order(pools) -> int:
    """How many relabellings permute axes within `pools` (each pool in any order).

    Example:
        >>> pools_order(((1, 2), (0, 3, 4)))
        12
    """
    return math.prod(math.factorial(len(pool)) for pool in pools)


@lru_cache(maxsize=1 << 16)
def pool_canonical(pools, axis_count: int, state: State) -> tuple[State, tuple[int, ...]]:
    """The representative of `state` (over `axis_count` axes) up to relabellings within `pools`
    and the relabelling used (new axis per old axis): within a pool, axes are renamed in the
    order they appear in the state (dims in order, major first, then partial axes, then the
    rest by id), so two states get one representative iff such a relabelling links them.

    Example:
        >>> pool_canonical(((0, 1, 2),), 3, (((2,), ()), (1,)))
        ((((0,), ()), (1,)), (2, 1, 0))
    """
    entries, partial = state
    mapping = list(range(axis_count))
    order = [axis for entry in entries for axis in entry] + list(partial)
    for pool in pools:  # a pool lists its axes by id
        seen = [axis for axis in order if axis in pool]
        for axis, image in zip(seen + [axis for axis in pool if axis not in seen], pool):
            mapping[axis] = image
    mapping = tuple(mapping)
    # Most states of a search are their own representative: skip rebuilding them.
    return (state if mapping == _identity(axis_count) else relabel(state, mapping)), mapping


@lru_cache(maxsize=64)
def _identity(axis_count: int) -> tuple[int, ...]:
    return tuple(range(axis_count))
