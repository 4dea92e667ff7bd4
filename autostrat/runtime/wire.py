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

A message to the rank itself is no message. This module never imports the cost model
(`autostrat.cost`), and a test enforces it: the counts are what the check compares the plan's
prediction with, so they must not come from the same formulas.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

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

    def transfer(self, piece: np.ndarray, dest: int, source: int, shape: tuple[int, ...]) -> np.ndarray:
        raise NotImplementedError

    def exchange(self, piece: np.ndarray, dest: int, source: int, shape: tuple[int, ...] | None = None) -> np.ndarray:
        """Send `piece` to `dest` and receive an array of `shape` (default `piece`'s) from
        `source`, counting the message sent."""
        piece = np.ascontiguousarray(piece)
        shape = piece.shape if shape is None else tuple(shape)
        if dest == self.rank and source == self.rank:
            return piece.copy()
        if dest != self.rank:
            self.sent.append(Message(dest, piece.nbytes))
        return self.transfer(piece, dest, source, shape)

    def allgather(self, piece, group):
        position = group.index(self.rank)
        pieces = [None] * len(group)
        pieces[position] = np.ascontiguousarray(piece)
        return self._ring_gather(pieces, [piece.shape] * len(group), group)

    def reduce_scatter(self, blocks, group, op):
        return self._ring_reduce(list(blocks), group, op)

    def allreduce(self, piece, group, op):
        piece = np.ascontiguousarray(piece)
        chunks = np.array_split(piece.reshape(-1), len(group))
        position = group.index(self.rank)
        gathered = [None] * len(group)
        gathered[position] = self._ring_reduce(chunks, group, op)
        gathered = self._ring_gather(gathered, [chunk.shape for chunk in chunks], group)
        return np.concatenate(gathered).reshape(piece.shape)

    def alltoall(self, blocks, group):
        g, position = len(group), group.index(self.rank)
        received = [None] * g
        received[position] = np.array(blocks[position])
        for k in range(1, g):
            to, source = (position + k) % g, (position - k) % g
            received[source] = self.exchange(blocks[to], group[to], group[source], np.shape(blocks[source]))
        return received

    def sendrecv(self, piece, dest, source):
        return self.exchange(piece, dest, source)

    def _ring_gather(self, pieces: list, shapes: list, group: tuple[int, ...]) -> list[np.ndarray]:
        """`pieces` with only this rank's entry set, completed around the ring."""
        g, position = len(group), group.index(self.rank)
        right, left = group[(position + 1) % g], group[(position - 1) % g]
        for k in range(g - 1):
            out, into = (position - k) % g, (position - k - 1) % g
            pieces[into] = self.exchange(pieces[out], right, left, shapes[into])
        return pieces

    def _ring_reduce(self, blocks: list, group: tuple[int, ...], op: str) -> np.ndarray:
        """This rank's block reduced over every member's blocks of the same number."""
        g, position = len(group), group.index(self.rank)
        right, left = group[(position + 1) % g], group[(position - 1) % g]
        combine = _COMBINE[op]
        running = np.array(blocks[position]) if g == 1 else blocks[(position - 1) % g]
        for k in range(g - 1):
            into = (position - k - 2) % g
            running = combine(self.exchange(running, right, left, np.shape(blocks[into])), blocks[into])
        return np.asarray(running)
