"""A rank's communication stream: gradient synchronisation in buckets, overlapped with the backward.

The runtime is one Python thread per rank, so the stream is not a thread: it is a queue of
redistribution steps (`program.Communicate`) that the executor progresses between kernels.
A bucket's steps join the queue when its last gradient is final (`SyncStart`, placed
by the lowering, `runtime.bucketing`, after the kernel producing it); the head step runs as the same generator of
exchanges as a blocking call (`communicate_steps`, `wire.Wire`'s ``*_steps``), each exchange
begun with `Wire.post` (MPI: Isend/Irecv on a tag of the stream's own) and resumed when
`progress` finds it complete; `SyncWait`, where the step ran before (ahead of its update),
waits for the edges the update reads. One step at a time, in the same order on every rank, so
the messages between two ranks on the stream's tag are sent and received in one order.

Bytes are counted where messages are sent (`Wire.post` records them as `exchange` does);
each step's `Traffic` is handed to the executor at its wait, in program order, so a run's
traffic lists its communication instructions as the blocking run does. The same algorithm
on the same pieces gives the same sums, bit for bit. What the stream holds (the sources it
took, the results not yet waited for) is the rank's memory: `held` lists it for the peak.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

from autostrat.errors import RuntimeBackendError


@dataclass(frozen=True)
class SyncStart:
    """Hand a bucket's gradient synchronisation `steps` (its edges' `Communicate`s, in order)
    to the communication stream (`runtime.stream`): placed after the kernel that makes its last
    gradient final, so they run while the rest of the backward does."""

    steps: tuple

    def reads(self) -> tuple[str, ...]:
        """The store keys it takes (each edge's gradient: what no earlier step of it writes)."""
        written, read = set(), []
        for step in self.steps:
            if step.source not in written:
                read.append(step.source)
            written.add(step.target)
        return tuple(read)


@dataclass(frozen=True)
class SyncWait:
    """Wait for one edge's `steps` on the communication stream, where they would have run
    (before the update reading them); its results join the store."""

    steps: tuple


def communicate_steps(step, backend, piece: np.ndarray):
    """The rank's piece after one redistribution `step` (a `program.Communicate`), as a
    generator of the exchanges it makes (`wire.Wire.drive` runs it blocking)."""
    piece = np.ascontiguousarray(piece)
    if step.kind == "Slice":
        parts, chunk = step.chunks
        return np.split(piece, parts, axis=step.dims[0])[chunk].copy()
    if step.kind == "PartialCreate":
        return create_partial(piece, step.reduce_op, step.chunks[0])
    if step.kind == "AllGather":
        return np.concatenate((yield from backend.allgather_steps(piece, step.group, step.algorithm)), axis=step.dims[0])
    if step.kind == "AllToAll":
        source, target = step.dims
        parts = np.split(piece, len(step.group), axis=target)
        received = yield from backend.alltoall_steps([parts[chunk] for chunk in step.chunks], step.group)
        return np.concatenate(received, axis=source)
    if step.kind == "AllReduce":
        return (yield from backend.allreduce_steps(piece, step.group, step.reduce_op, step.algorithm))
    if step.kind == "ReduceScatter":
        parts = np.split(piece, len(step.group), axis=step.dims[0])
        return (yield from backend.reduce_scatter_steps([parts[chunk] for chunk in step.chunks], step.group, step.reduce_op,
                                                        step.algorithm))
    dest, source = step.peers
    return (yield from backend.sendrecv_steps(piece, dest, source))


def create_partial(piece: np.ndarray, op: str, position: int) -> np.ndarray:
    """This rank's piece of a whole value made partial over a group where it is member
    `position`: a sum keeps it on member 0 and zeros it elsewhere; a max or min (idempotent)
    keeps it everywhere. Nothing is sent.

    Example:
        >>> create_partial(np.ones(2), "sum", 1).tolist(), create_partial(np.ones(2), "max", 1).tolist()
        ([0.0, 0.0], [1.0, 1.0])
    """
    if op not in ("max", "min", "sum"):
        raise RuntimeBackendError(f"a PartialCreate needs a partial op among max, min, sum, got {op!r}")
    return np.zeros_like(piece) if op == "sum" and position else piece.copy()


class SyncStream:
    """The stream of one rank on `backend` (a `wire.Wire`); `traffic_of(step, messages)` makes
    a step's `Traffic` (the executor's).

    Example (two local ranks: a bucket of one AllReduce started, progressed, waited for):
        >>> from autostrat.runtime.local import LocalCluster
        >>> from autostrat.runtime.program import Communicate
        >>> step = Communicate("AllReduce", "g", "g>u", (0, 1), (), (), "sum", (0, 0), 8, "g -> u", "sync")
        >>> def run(backend):
        ...     stream = SyncStream(backend, lambda step, messages: len(messages))
        ...     stream.start((step,), {"g": np.full(2, backend.rank + 1.0)})
        ...     stream.progress()
        ...     return stream.wait((step,))
        >>> LocalCluster(2).run(run)[0]
        ({'g>u': array([3., 3.])}, [2])
    """

    def __init__(self, backend, traffic_of):
        self.backend, self.traffic_of = backend, traffic_of
        self.queue: deque = deque()  # steps not begun, each with its source piece when taken from the store
        self.results: dict[str, np.ndarray] = {}  # target key -> the latest step's result, until waited for
        self.traffic: dict[str, list] = {}  # target key -> its steps' traffic, in order
        self.running = None  # (step, its exchanges, the transfer in flight, its messages, its piece)

    def start(self, steps, store: dict) -> None:
        """Queue a bucket's `steps`; a step reading a key the stream does not write takes it
        from `store` now (the gradient: final, and dropped from the store after this)."""
        written = set(self.results) | {queued.target for queued, _ in self.queue}
        for step in steps:
            self.queue.append((step, None if step.source in written else store[step.source]))
            written.add(step.target)
        self.progress()

    def progress(self) -> None:
        """Advance the head step as far as its messages have arrived, then the next steps
        (without waiting for any message)."""
        while self._advance(wait=False):
            pass

    def wait(self, steps) -> tuple[dict, list]:
        """Run the stream until every step of `steps` is done: the results of their targets
        and their `Traffic`, in the order of `steps`."""
        targets = tuple(dict.fromkeys(step.target for step in steps))
        while any(self._pending(target) for target in targets):
            if not self._advance(wait=True):
                raise RuntimeBackendError(f"rank {self.backend.rank}: the stream ended before {targets} were synchronised")
        traffic = [record for target in targets for record in self.traffic.pop(target)]
        return {target: self.results.pop(target) for target in targets}, traffic

    def held(self) -> list:
        """The arrays the stream holds for the rank: pieces taken, results not waited for."""
        pieces = [piece for _, piece in self.queue if piece is not None] + list(self.results.values())
        return pieces + ([self.running[4]] if self.running is not None else [])

    def _pending(self, target: str) -> bool:
        return (self.running is not None and self.running[0].target == target) or any(s.target == target for s, _ in self.queue)

    def _advance(self, wait: bool) -> bool:
        """One move: begin the next step or resume the running one when its exchange is done
        (`wait`: waiting for it); whether anything moved."""
        if self.running is None:
            if not self.queue:
                return False
            step, piece = self.queue.popleft()
            piece = self.results[step.source] if piece is None else piece
            self._resume(step, communicate_steps(step, self.backend, piece), None, [], piece)
            return True
        step, exchanges, transfer, messages, piece = self.running
        if not transfer.ready():
            if not wait:
                return False
            transfer.wait()
        self._resume(step, exchanges, transfer.result(), messages, piece)
        return True

    def _resume(self, step, exchanges, received, messages: list, piece) -> None:
        """Send `received` into the step's exchanges; post the next one, or finish the step."""
        try:
            request = exchanges.send(received)
        except StopIteration as finished:
            self.running = None
            self.results[step.target] = finished.value
            self.traffic.setdefault(step.target, []).append(self.traffic_of(step, messages))
            return
        before = len(self.backend.sent)
        transfer = self.backend.post(*request)
        messages.extend(self.backend.sent[before:])
        self.running = (step, exchanges, transfer, messages, piece)
