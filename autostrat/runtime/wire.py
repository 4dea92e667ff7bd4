"""Collectives as point-to-point messages, and the count of every message at its send call.

Every collective a rank runs is a sequence of messages to one peer at a time, each sent by
`Wire.exchange` (send one buffer to a peer, receive one from another), which records the
message's destination and byte size (`Message`) before handing the buffer to the transport.
The algorithms, for a group of g members where this rank is member ``p``:

- AllGather, ring: in step k (0 .. g-2) send the piece of member ``p-k`` to member ``p+1`` and
  receive the piece of member ``p-k-1`` from member ``p-1``;
- ReduceScatter, ring: in step k send the running reduction of block ``p-k-1`` to ``p+1``,
  receive block ``p-k-2`` from ``p-1`` and reduce this rank's own block into it; after g-1
  steps block ``p`` is reduced over every member (in ring order, starting at member ``p+1``);
- AllReduce: the flattened piece cut into g chunks (`numpy.array_split`: the first ones one
  element longer when g does not divide it), a ring ReduceScatter of the chunks, then a ring
  AllGather of the reduced chunks;
- AllToAll, pairwise: in step k (1 .. g-1) send block ``p+k`` to member ``p+k`` and receive
  from member ``p-k``;
- a permute: one message to the rank that takes this rank's piece.

A step the plan records with another algorithm runs that one (the plan chose it; the runtime
never re-decides):

- AllReduce ``doubling``: recursive doubling. With p the largest power of two <= g and
  ``r = g - p``, members ``2i + 1 < 2r`` send their piece to member ``2i`` and wait for the
  result; the p others (member ``2i`` for ``i < r``, then members ``2r ..``) exchange their
  running piece with the one ``2^j`` away among them in round j and combine; then each member
  ``2i`` sends the result to ``2i + 1``.
- ``hierarchical:K`` (servers of K ranks: rank // K): a member's inner group is the members on
  its server, its outer group the members of its index inside their servers, one per server.
  AllReduce: ring ReduceScatter of k chunks inside, ring AllReduce of its chunk across, ring
  AllGather of the chunks inside. AllGather: ring AllGather across, then of the bundles of m
  pieces inside. ReduceScatter: ring ReduceScatter inside of super-blocks (the m blocks of the
  members of one inner index, in server order), then across of the super-block's blocks.

A message to the rank itself is no message. This module never imports the cost model
(`autostrat.cost`), and a test enforces it: the counts are what the check compares the plan's
prediction with, so they must not come from the same formulas.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from autostrat.errors import RuntimeBackendError

_COMBINE = {"max": np.maximum, "min": np.minimum, "sum": np.add}


@dataclass(frozen=True)
class Message:
    """One message a rank sent: its destination rank and its size in bytes."""

    dest: int
    bytes: int


class Wire:
    """The collectives of a backend, moved as messages through its `transfer`.

    A backend sets `rank` and implements ``transfer(piece, dest, source, shape)``: send the
    contiguous `piece` to `dest` and return the array of `shape` (and `piece`'s dtype) that
    `source` sent to this rank. Messages between a pair of ranks arrive in the order sent.

    Every algorithm is written once, as steps: a generator (`allgather_steps`...) yielding each
    exchange as ``(piece, dest, source, shape)`` and taking back what was received. The blocking
    calls (`allgather`...) `drive` it through `exchange`; the communication stream
    (`runtime.stream`) drives the same steps through `post`, which a backend may make
    non-blocking (`start_transfer`), so the messages, their order and their counts are the same.

    Example (two ranks of a `local.LocalCluster`, each counting one message of 8 bytes):
        >>> from autostrat.runtime.local import LocalCluster
        >>> def gather(backend):
        ...     pieces = backend.allgather(np.array([backend.rank], np.int64), (0, 1))
        ...     return [int(p[0]) for p in pieces], backend.sent
        >>> LocalCluster(2).run(gather)[1]
        ([0, 1], [Message(dest=0, bytes=8)])
    """

    rank: int

    def __init__(self) -> None:
        self.sent: list[Message] = []

    def transfer(self, piece: np.ndarray, dest: int, source: int, shape: tuple[int, ...]) -> np.ndarray | None:
        """Send `piece` to `dest` unless it is this rank; receive from `source` unless it is
        this rank (then return None)."""
        raise NotImplementedError

    def start_transfer(self, piece: np.ndarray, dest: int, source: int, shape: tuple[int, ...], lane: int = 0):
        """`transfer` begun on the stream's `lane` (a message tag of its own), as a transfer
        (``ready()``, then ``result()``): a backend without non-blocking messages transfers at once."""
        return Done(self.transfer(piece, dest, source, shape))

    def _counted(self, piece, dest: int, shape) -> tuple[np.ndarray, tuple[int, ...]]:
        """`piece` contiguous and the shape to receive, the message to `dest` counted."""
        piece = np.ascontiguousarray(piece)
        if dest != self.rank:
            self.sent.append(Message(dest, piece.nbytes))
        return piece, piece.shape if shape is None else tuple(shape)

    def exchange(self, piece: np.ndarray, dest: int, source: int, shape: tuple[int, ...] | None = None) -> np.ndarray:
        """Send `piece` to `dest` and receive an array of `shape` (default `piece`'s) from
        `source`, counting the message sent. A `dest` that is this rank sends nothing; a
        `source` that is this rank receives nothing (None is returned)."""
        if dest == self.rank and source == self.rank:
            return np.array(piece)
        piece, shape = self._counted(piece, dest, shape)
        return self.transfer(piece, dest, source, shape)

    def post(self, piece: np.ndarray, dest: int, source: int, shape: tuple[int, ...] | None = None, lane: int = 0):
        """`exchange` begun on the stream's `lane` and not waited for: its transfer (`Done`'s
        methods; the message counted now, as it is handed to the transport)."""
        if dest == self.rank and source == self.rank:
            return Done(np.array(piece))
        piece, shape = self._counted(piece, dest, shape)
        return self.start_transfer(piece, dest, source, shape, lane)

    def drive(self, steps):
        """Run a collective's `steps` to the end with blocking exchanges; its result."""
        try:
            request = next(steps)
            while True:
                request = steps.send(self.exchange(*request))
        except StopIteration as finished:
            return finished.value

    def allgather(self, piece, group, algorithm: str = "ring"):
        return self.drive(self.allgather_steps(piece, group, algorithm))

    def reduce_scatter(self, blocks, group, op, algorithm: str = "ring"):
        return self.drive(self.reduce_scatter_steps(blocks, group, op, algorithm))

    def allreduce(self, piece, group, op, algorithm: str = "ring"):
        return self.drive(self.allreduce_steps(piece, group, op, algorithm))

    def alltoall(self, blocks, group):
        return self.drive(self.alltoall_steps(blocks, group))

    def sendrecv(self, piece, dest, source):
        return self.exchange(piece, dest, source)

    def sendrecv_steps(self, piece, dest, source):
        return (yield (piece, dest, source, None))

    def allgather_steps(self, piece, group, algorithm: str = "ring"):
        piece = np.ascontiguousarray(piece)
        if algorithm.startswith("hierarchical"):
            return (yield from self._hierarchical_gather(piece, group, _server_size(algorithm)))
        _known(algorithm, "AllGather")
        pieces = [None] * len(group)
        pieces[group.index(self.rank)] = piece
        return (yield from self._ring_gather(pieces, [piece.shape] * len(group), group))

    def reduce_scatter_steps(self, blocks, group, op, algorithm: str = "ring"):
        if algorithm.startswith("hierarchical"):
            return (yield from self._hierarchical_reduce(list(blocks), group, op, _server_size(algorithm)))
        _known(algorithm, "ReduceScatter")
        return (yield from self._ring_reduce(list(blocks), group, op))

    def allreduce_steps(self, piece, group, op, algorithm: str = "ring"):
        piece = np.ascontiguousarray(piece)
        flat = piece.reshape(-1)
        if algorithm == "doubling":
            return (yield from self._doubling(flat, group, op)).reshape(piece.shape)
        if algorithm.startswith("hierarchical"):
            inner, outer = _levels(group, self.rank, _server_size(algorithm))
            chunks = np.array_split(flat, len(inner))
            reduced = [None] * len(inner)
            mine = yield from self._ring_reduce(chunks, inner, op)
            reduced[inner.index(self.rank)] = yield from self._ring_allreduce(mine, outer, op)
            return np.concatenate((yield from self._ring_gather(reduced, [c.shape for c in chunks], inner))).reshape(piece.shape)
        _known(algorithm, "AllReduce")
        return (yield from self._ring_allreduce(flat, group, op)).reshape(piece.shape)

    def _ring_allreduce(self, flat: np.ndarray, group: tuple[int, ...], op: str):
        """A flat piece cut into g chunks, ring ReduceScatter, then ring AllGather of the chunks."""
        chunks = np.array_split(flat, len(group))
        gathered = [None] * len(group)
        gathered[group.index(self.rank)] = yield from self._ring_reduce(chunks, group, op)
        return np.concatenate((yield from self._ring_gather(gathered, [chunk.shape for chunk in chunks], group)))

    def _doubling(self, flat: np.ndarray, group: tuple[int, ...], op: str):
        """Recursive doubling with the extra members folded in (module docstring)."""
        g, position, combine = len(group), group.index(self.rank), _COMBINE[op]
        power = 1 << (g.bit_length() - 1)
        extra = g - power
        if position < 2 * extra and position % 2:  # folded in: hand the piece over, take the result back
            yield (flat, group[position - 1], self.rank, None)
            return (yield (flat, self.rank, group[position - 1], None))
        if position < 2 * extra:
            flat = combine(flat, (yield (flat, self.rank, group[position + 1], None)))
        index = position // 2 if position < 2 * extra else position - extra
        distance = 1
        while distance < power:
            other = index ^ distance
            partner = group[2 * other if other < extra else other + extra]
            flat = combine(flat, (yield (flat, partner, partner, None)))  # commutative: both partners agree bitwise
            distance *= 2
        if position < 2 * extra:
            yield (flat, group[position + 1], self.rank, None)
        return np.asarray(flat)

    def _hierarchical_gather(self, piece: np.ndarray, group: tuple[int, ...], size: int):
        inner, outer = _levels(group, self.rank, size)
        across = [None] * len(outer)
        across[outer.index(self.rank)] = piece
        bundle = np.stack((yield from self._ring_gather(across, [piece.shape] * len(outer), outer)))
        bundles = [None] * len(inner)
        bundles[inner.index(self.rank)] = bundle
        bundles = yield from self._ring_gather(bundles, [bundle.shape] * len(inner), inner)
        pieces = [None] * len(group)
        for member in group:
            member_inner, member_outer = _levels(group, member, size)
            pieces[group.index(member)] = bundles[member_inner.index(member)][member_outer.index(member)]
        return pieces

    def _hierarchical_reduce(self, blocks: list, group: tuple[int, ...], op: str, size: int):
        inner, outer = _levels(group, self.rank, size)
        supers = []
        for member in inner:  # the super-block of each inner index: its members' blocks, in server order
            _, members = _levels(group, member, size)
            supers.append(np.stack([np.asarray(blocks[group.index(m)]) for m in members]))
        reduced = yield from self._ring_reduce(supers, inner, op)
        return (yield from self._ring_reduce(list(reduced), outer, op))

    def alltoall_steps(self, blocks, group):
        g, position = len(group), group.index(self.rank)
        received = [None] * g
        received[position] = np.array(blocks[position])
        for k in range(1, g):
            to, source = (position + k) % g, (position - k) % g
            received[source] = yield (blocks[to], group[to], group[source], np.shape(blocks[source]))
        return received

    def _ring_gather(self, pieces: list, shapes: list, group: tuple[int, ...]):
        """`pieces` with only this rank's entry set, completed around the ring."""
        g, position = len(group), group.index(self.rank)
        right, left = group[(position + 1) % g], group[(position - 1) % g]
        for k in range(g - 1):
            out, into = (position - k) % g, (position - k - 1) % g
            pieces[into] = yield (pieces[out], right, left, shapes[into])
        return pieces

    def _ring_reduce(self, blocks: list, group: tuple[int, ...], op: str):
        """This rank's block reduced over every member's blocks of the same number."""
        g, position = len(group), group.index(self.rank)
        right, left = group[(position + 1) % g], group[(position - 1) % g]
        combine = _COMBINE[op]
        running = np.array(blocks[position]) if g == 1 else blocks[(position - 1) % g]
        for k in range(g - 1):
            into = (position - k - 2) % g
            running = combine((yield (running, right, left, np.shape(blocks[into]))), blocks[into])
        return np.asarray(running)


class Done:
    """A transfer already complete: what a blocking transport, or a message to oneself, gives."""

    def __init__(self, received):
        self.received = received

    def ready(self) -> bool:
        return True

    def result(self):
        return self.received


def _server_size(algorithm: str) -> int:
    name, _, size = algorithm.partition(":")
    if name != "hierarchical" or not size.isdigit() or int(size) < 1:
        raise RuntimeBackendError(f"a hierarchical algorithm is written 'hierarchical:K' (K ranks per server), got {algorithm!r}")
    return int(size)


def _known(algorithm: str, kind: str) -> None:
    if algorithm != "ring":
        raise RuntimeBackendError(f"{kind} runs as 'ring'{', doubling' if kind == 'AllReduce' else ''} or 'hierarchical:K', got {algorithm!r}")


def _levels(group: tuple[int, ...], rank: int, size: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """`rank`'s inner group (the members on its server, in group order) and outer group (the
    members of its index inside their servers, servers in order of first appearance)."""
    servers: dict[int, list[int]] = {}
    for member in group:
        servers.setdefault(member // size, []).append(member)
    inner = servers[rank // size]
    index = inner.index(rank)
    return tuple(inner), tuple(members[index] for members in servers.values())
