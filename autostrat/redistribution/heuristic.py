"""A* lower bounds: what some rank still has to receive, and what a partial sum still costs.

Both rest on one fact of the cost model: in every step kind a device sends and receives no more
bytes than the step charges it (ring collectives send and receive alike; a permute moves one
piece), so the remaining cost is at least any one rank's remaining traffic, and at least the
average over ranks of the whole remaining traffic.

- Receive: a rank must receive every element of its destination slice that its current slice
  lacks and, while partial axes the destination does not have remain, at least one value for
  every element of its destination slice (its own value is only a part).
- Combine (partial states, `partial_bounds`): every element has ``g`` distinct contributions, one
  per coordinate of the partial axes, and ``R`` ranks must end with its full value (``R`` = the
  destination's replication). Order the transmissions of one element's values (those within a
  step in any order: a rank then knows at least what it knew in parallel). Before the first rank
  knows the full value, the contributions of ``g`` different holders have flowed into it, which
  takes at least ``g - 1`` transmissions; after that every other destination holder still needs
  its own completing transmission: ``g + R - 2`` per element (AllReduce: ``2(g-1)``, the known
  optimum). Over all elements and averaged over the ``N`` ranks this bounds the remaining cost.
- Reduce, then move (partial states, `partial_bounds` and `ReceiveBound`): split the remaining
  path into its reduction steps (AllReduce, ReduceScatter) and the rest. (1) A reduction over a
  block of size ``b`` leaving ``g'`` of ``g`` contributions costs at least ``(b-1)/b`` of the
  local bytes, and a partial rank's piece is at least ``T·g/N`` bytes (``T`` the tensor; the
  partial axes split nothing), so it costs at least ``T·(g - g')/N``: ``T·(g-1)/N`` for all of
  them. (2) The shadow of a state (its partial axes made free) follows the same path for no
  more: Slice, AllGather, AllToAll and CollectivePermute move it alike at the same price (pieces
  do not depend on partial axes), an AllReduce leaves it as it is and a ReduceScatter is Slices
  of free axes there, for free. So the rest costs at least the shadow's remaining cost, bounded
  by its receive bound. The sum is often exact where the combine bound is not (a
  ReduceScatter, then a move).
- Partial targets (`ReceiveBound._partial_target_bound`): the reductions still due cost at least
  ``T·(g - g_T)/N`` (as in (1): a PartialCreate multiplies the contributions for free, so the
  reductions of a path from ``g`` to the target's ``g_T`` take away at least ``g - g_T`` of
  them); the other steps move the shadow to the target's shadow (its partial axes free), so
  cost at least that receive bound (a PartialCreate leaves the shadow as it is). The path either
  takes a CollectivePermute or not. With one, when a target partial axis is not partial yet,
  the permute sends a whole piece and only AllGathers grow a piece again, charging its growth:
  from the permute on, at least the target slice's volume. Without one, every partial axis the
  target lacks must be reduced (only a permute hands a role on), so the reductions cost at least
  ``T·(g - g/g_R)/N`` (``g_R`` the contributions of those axes), while a target partial axis the
  state lacks is created for free. The bound is the smaller of the two.
- Size (`ReceiveBound.size_bound`): along each dim a rank's slice and its target slice overlap
  in at most the shorter of their extents, so the receive bound is at least the target volume
  less the product of those; it needs no positions, so it holds up to relabelling too.

The bound may not be consistent across the partial/whole boundary; the search reopens states, so
admissibility is all it needs for the optimum.
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np

from autostrat.redistribution.moves import Space, State, group_size, split_signature


def partial_bounds(space: Space, target_free: int, state: State) -> tuple[int, int]:
    """The combine and reduce bounds of a partial `state` towards a whole destination
    replicated `target_free` times (``R``), with ``T`` the tensor's bytes, ``g`` the partial
    contributions and ``N`` the ranks: ``ceil(T·(g + R - 2)/N)`` and ``ceil(T·(g - 1)/N)``.

    Example (16 contributions all-reduced over 16 ranks: 2·15/16 of the tensor; at least 15/16
    of it is sent for the reduction alone):
        >>> space = Space(sizes=(2, 2, 2, 2), shape=(64, 64), itemsize=4)
        >>> partial_bounds(space, 16, (((), ()), (0, 1, 2, 3))) == (2 * 15 * 1024, 15 * 1024)
        True
    """
    total, ranks = math.prod(space.shape) * space.itemsize, math.prod(space.sizes)
    return _partial_bounds(total, ranks, group_size(space.sizes, state[1]), target_free)


def _partial_bounds(total: int, ranks: int, g: int, target_free: int) -> tuple[int, int]:
    return -(-total * (g + target_free - 2) // ranks), -(-total * (g - 1) // ranks)


def rank_coordinates(sizes: tuple[int, ...]) -> np.ndarray:
    """Row ``a``: every rank's coordinate along axis ``a`` (axes counted from the right).

    Example:
        >>> rank_coordinates((2, 3)).tolist()
        [[0, 1, 0, 1, 0, 1], [0, 0, 1, 1, 2, 2]]
    """
    return np.indices(tuple(reversed(sizes))).reshape(len(sizes), -1)[::-1]


def piece_index(sizes: tuple[int, ...], coordinates: np.ndarray, entry) -> np.ndarray:
    """Per rank, which piece of a dim split by the axes of `entry` (major first) it holds."""
    index = np.zeros(coordinates.shape[1], dtype=np.int64)
    for axis in entry:
        index = index * sizes[axis] + coordinates[axis]
    return index


class MemoisedBound:
    """A lower bound remembered per state: a search asks for the same states' bounds again.
    Subclasses set ``self.memo = {}`` and give ``_bound(state)``."""

    def __call__(self, state: State) -> int:
        found = self.memo.get(state)
        if found is None:
            found = self.memo[state] = self._bound(state)
        return found


class ReceiveBound(MemoisedBound):
    """The lower bound towards one target state over one space (axes counted from the right)."""

    def __init__(self, space: Space, target: State):
        self.space, self.target_partial = space, set(target[1])
        sizes = space.sizes
        self.target_contributions = group_size(sizes, target[1])
        self.coordinates = rank_coordinates(sizes)
        self.target_start, self.target_size = self._ranges(target[0])
        self.target_volume = math.prod(self.target_size) * space.itemsize
        self.total = math.prod(space.shape) * space.itemsize
        used = {axis for entry in target[0] for axis in entry} | set(target[1])
        self.target_free = math.prod(size for axis, size in enumerate(sizes) if axis not in used)
        self.memo: dict = {}  # state -> bound
        self.sized: dict = {}  # split signature -> size bound
        self.overlaps: dict = {}  # (dim, entry) -> per-rank overlap along dim
        self.pieces: dict = {}  # (dim, entry) -> per-rank count of pieces meeting the target along dim
        self.source_memo: dict = {}  # state -> `sources`

    def _ranges(self, entries):
        starts, lengths = [], []
        for size, entry in zip(self.space.shape, entries):
            start, length = self._range(size, entry)
            starts.append(start)
            lengths.append(length)
        return starts, lengths

    def _range(self, size: int, entry) -> tuple[np.ndarray, int]:
        length = size // math.prod(self.space.sizes[axis] for axis in entry)
        return piece_index(self.space.sizes, self.coordinates, entry) * length, length

    def size_bound(self, state: State) -> int:
        """The bound knowing only the extent of a rank's slice per dim, not where it lies: what
        it lacks of the target's extents (a relabelling changes neither), and for partial
        states the combine and reduce bounds. Cheap; the permuted layer, where states are known
        up to relabelling, uses it, and the search uses it as a first estimate.

        Example (a row half holds half of the target's column half; reducing a partial sum over
        2 ranks alone sends half of the 64-byte tensor):
            >>> bound = receive_bound(Space(sizes=(2,), shape=(4, 4), itemsize=4), (((), (0,)), ()))
            >>> bound.size_bound((((0,), ()), ())), bound.size_bound((((), ()), (0,)))
            (16, 32)
        """
        return self.signature_bound(split_signature(self.space, state))

    def signature_bound(self, signature) -> int:
        """`size_bound` of the states of one split signature (they share it)."""
        found = self.sized.get(signature)
        if found is None:
            found = self.sized[signature] = self._size_bound(signature)
        return found

    def _size_bound(self, signature) -> int:
        parts, contributions = signature
        # A rank's slice and its target slice overlap in at most the shorter extent per dim.
        overlap = self.space.itemsize
        for size, count, wanted in zip(self.space.shape, parts, self.target_size):
            overlap *= min(size // count, wanted)
        moved = self.target_volume - overlap
        if self.target_partial:
            return self._reduce_to_target(contributions) + moved
        if contributions == 1:
            return moved
        combined, reduced = _partial_bounds(self.total, math.prod(self.space.sizes), contributions, self.target_free)
        return max(self.target_volume, combined, reduced + moved)

    def _reduce_to_target(self, contributions: int) -> int:
        """What the reductions from `contributions` partial values to the target's cost at least
        (the module docstring's reduce bound, ending at the target's contributions; none when
        the state has no more than the target: a PartialCreate adds the rest for free)."""
        ranks = math.prod(self.space.sizes)
        return max(-(-self.total * (contributions - self.target_contributions) // ranks), 0)

    def _partial_target_bound(self, state: State) -> int:
        """Towards a partial target: the shadow's receive bound (the module docstring's
        reduce-then-move argument, the target's partial axes free in its shadow) plus the
        reductions still due, with a permute or without one (the module docstring).

        Example (a partial sum over axis 1 wanted over axis 0: the 64-byte piece is permuted,
        64 bytes, or axis 1 is reduced, at least 64·(2 - 1)/4 bytes; a whole state creates it):
            >>> bound = receive_bound(Space(sizes=(2, 2), shape=(4, 4), itemsize=4), (((), ()), (0,)))
            >>> bound((((), ()), (1,))), bound((((), ()), ()))
            (16, 0)
        """
        shadow, contributions = self._missing(state[0]), group_size(self.space.sizes, state[1])
        lacking = group_size(self.space.sizes, [axis for axis in state[1] if axis not in self.target_partial])
        unpermuted = -(-self.total * (contributions - contributions // lacking) // math.prod(self.space.sizes))
        handed = 0 if self.target_partial <= set(state[1]) else self.target_volume
        return min(unpermuted + shadow, self._reduce_to_target(contributions) + max(shadow, handed))

    def _bound(self, state: State) -> int:
        if self.target_partial:
            return self._partial_target_bound(state)
        if state[1]:
            # The shadow's receive bound is at least its size bound, so this is the larger.
            return max(self.size_bound(state), partial_bounds(self.space, 0, state)[1] + self((state[0], ())))
        return self._missing(state[0])

    def _missing(self, entries) -> int:
        """What some rank whose slice `entries` gives lacks of its target slice, in bytes."""
        if not entries:
            return 0  # a scalar: every rank holds all of it
        overlap = self._dim_overlap(0, entries[0])
        for dim in range(1, len(entries)):
            overlap = overlap * self._dim_overlap(dim, entries[dim])
        return self.target_volume - int(overlap.min()) * self.space.itemsize

    def sources(self, state: State) -> int:
        """How many ranks, at least, some rank must hear from (itself included) to reach the
        target: the distinct pieces of `state` overlapping its target slice, times the partial
        contributions of each; towards a partial target, the pieces of the state's shadow (its
        partial axes made free: the module docstring's shadow follows the same steps, less the
        reductions, and must reach the target's shadow, whose slices are the target's).

        A rank learns about another's piece only by a message; in a step over ``g`` ranks each
        rank's knowledge (the set of initial pieces its data depends on) grows at most g-fold
        while it receives at least ``g - 1 >= log2(g)`` messages, so a rank needing ``D``
        sources receives at least ``ceil(log2(D))`` messages over the rest of the path.

        Example (rows split over 4 ranks, wanted as columns: each rank needs a part of every
        row block, so hears from all 4, at least 2 messages):
            >>> bound = receive_bound(Space(sizes=(4,), shape=(8, 8), itemsize=4), (((), (0,)), ()))
            >>> bound.sources((((0,), ()), ()))
            4
        """
        found = self.source_memo.get(state)
        if found is None:
            pieces = np.ones(self.coordinates.shape[1], dtype=np.int64)
            for dim, entry in enumerate(state[0]):
                pieces = pieces * self._dim_pieces(dim, entry)
            contributions = 1 if self.target_partial else group_size(self.space.sizes, state[1])
            found = int(pieces.max()) * contributions
            self.source_memo[state] = found
        return found

    def _dim_pieces(self, dim: int, entry) -> np.ndarray:
        """Per rank, how many intervals of `dim` under `entry` its target range meets."""
        key = (dim, entry)
        found = self.pieces.get(key)
        if found is None:
            length = self.space.shape[dim] // group_size(self.space.sizes, entry)
            first, last = self.target_start[dim], self.target_start[dim] + self.target_size[dim] - 1
            found = self.pieces[key] = last // length - first // length + 1
        return found

    def _dim_overlap(self, dim: int, entry) -> np.ndarray:
        """Per rank, how many indices of `dim` its slice under `entry` shares with its target
        slice (memoised: a search meets few entries per dim but many combinations of them)."""
        key = (dim, entry)
        found = self.overlaps.get(key)
        if found is None:
            start, length = self._range(self.space.shape[dim], entry)
            low = np.maximum(start, self.target_start[dim])
            high = np.minimum(start + length, self.target_start[dim] + self.target_size[dim])
            found = self.overlaps[key] = np.maximum(high - low, 0)
        return found


@lru_cache(maxsize=256)
def receive_bound(space: Space, target: State) -> ReceiveBound:
    """The shared `ReceiveBound` towards `target` (a table's column is searched from every row).

    Example:
        >>> bound = receive_bound(Space(sizes=(2,), shape=(4,), itemsize=4), (((0,),), ()))
        >>> bound((((),), ())), bound((((),), (0,)))
        (0, 8)
    """
    return ReceiveBound(space, target)


class ImportBound:
    """What some group of ranks joined by `fast` axes must still import from outside it: the
    bytes of the group's target slices that no member holds, per member.

    A step over fast axes only keeps its groups inside one such group; any other step lets a
    rank receive at most the bytes the step charges it, so the members of a group together
    import at most ``F`` (the group's size) times those bytes. So steps touching a slower axis
    charge at least ``ceil(M / F)`` bytes, ``M`` the group's missing bytes; the search prices
    those bytes at the slower links' bandwidth (`timed.TimedBound`).

    The members vary exactly the fast axes and every axis lies in one dim's entry, so the union
    of their slices is the product over dims of the union of their ranges along each dim, and
    likewise for their target slices. Ranges are counted in units of ``dim / gcd(dim, N)``
    (every range of a divisible split is made of whole units).

    Example (4 ranks, two pairs joined by the fast axis 0; rows are split over the slow axis 1
    and the target replicates everything: each pair lacks half of the tensor, per member 8
    bytes of the 64):
        >>> bound = ImportBound(Space(sizes=(2, 2), shape=(4, 4), itemsize=4), (((), ()), ()), (0,))
        >>> bound((((1,), ()), ())), bound((((0,), ()), ()))
        (16, 0)
    """

    def __init__(self, space: Space, target: State, fast: tuple[int, ...]):
        self.space, self.fast = space, fast
        self.total = math.prod(space.shape) * space.itemsize
        sizes, ranks = space.sizes, math.prod(space.sizes)
        self.coordinates = coordinates = rank_coordinates(sizes)
        group = np.zeros(ranks, dtype=np.int64)
        for axis, size in enumerate(sizes):
            if axis not in fast:
                group = group * size + coordinates[axis]
        self.order = np.argsort(group, kind="stable")  # members of each group side by side
        self.members = math.prod(sizes[axis] for axis in fast)
        self.units = [math.gcd(size, ranks) for size in space.shape]
        self.unit_bytes = space.itemsize * math.prod(size // units for size, units in zip(space.shape, self.units))
        self.partial_target = bool(target[1])
        self.target = [self._union(dim, entry) for dim, entry in enumerate(target[0])]
        self.wanted = np.ones(ranks // self.members, dtype=np.int64)
        for union in self.target:
            self.wanted = self.wanted * union.sum(axis=1)
        self.unions: dict = {}  # (dim, entry) -> per group, how many units of its target range along dim its members hold
        self.memo: dict = {}  # whole state -> bytes

    def _union(self, dim: int, entry) -> np.ndarray:
        """(groups, units) booleans: which units of `dim` some member of each group holds."""
        units = self.units[dim]
        length = units // group_size(self.space.sizes, entry)
        start = (piece_index(self.space.sizes, self.coordinates, entry) * length)[self.order][:, None]
        held = (np.arange(units)[None, :] >= start) & (np.arange(units)[None, :] < start + length)
        return held.reshape(-1, self.members, units).any(axis=1)

    def __call__(self, state: State) -> int:
        """Bytes per device that steps touching a slower axis must still charge from `state`.

        A partial state's pieces are no smaller than its shadow's (partial axes made free).
        Towards a partial target the shadow's bound holds: the shadow (the module docstring's
        reduce-then-move argument) follows the path's steps but its reductions and
        PartialCreates, over the same axes for no more bytes, to the target's shadow, whose
        slices are the target's. When
        a partial axis is slow, every group needs each element of its target slices from
        outside: at least one value per element, and over all groups, by the combine argument
        of `partial_bounds` with groups for ranks, ``G + R - 2`` transmissions per element
        (``G`` groups hold distinct contributions, ``R`` groups want it), shared by ``N`` ranks.
        (A partial state with the target's contributions, all on fast axes, need not import its
        shadow's missing bytes once per contribution: it may all-reduce them inside its groups,
        move once, and create the target's partial values again.)
        """
        found = self.memo.get(state)
        if found is None:
            found = self.memo[state] = max(self._bound(state[0]), self._partial_bound(state[1]))
        return found

    def _partial_bound(self, partial) -> int:
        spread = group_size(self.space.sizes, [axis for axis in partial if axis not in self.fast])
        if self.partial_target or spread == 1:
            return 0
        # Each element lies in the slices of groups with every coordinate of the partial axes.
        ranks = math.prod(self.space.sizes)
        wanted = int(self.wanted.sum()) * self.unit_bytes  # sum over groups of R, in bytes
        combined = -(-(wanted + (spread - 2) * self.total) // ranks)
        return max(combined, -(-int(self.wanted.max()) * self.unit_bytes // self.members))

    def _bound(self, entries) -> int:
        if not entries:
            return 0
        shared = None
        for dim, entry in enumerate(entries):
            key = (dim, entry)
            held = self.unions.get(key)
            if held is None:
                held = self.unions[key] = (self._union(dim, entry) & self.target[dim]).sum(axis=1)
            shared = held if shared is None else shared * held
        missing = int((self.wanted - shared).max()) * self.unit_bytes
        return -(-missing // self.members)


@lru_cache(maxsize=256)
def import_bound(space: Space, target: State, fast: tuple[int, ...]) -> ImportBound:
    """The shared `ImportBound` towards `target` for groups joined by the `fast` axes."""
    return ImportBound(space, target, fast)
