"""A rank's communication stream: gradient synchronisation in buckets, overlapped with the backward.

The runtime is one Python thread per rank, so the stream is not a thread: it is a queue of
redistribution steps (`instructions.Communicate`) that the executor progresses between kernels.
A bucket's steps join the queue when its last gradient is final (`SyncStart`, placed by the
lowering, `runtime.bucketing`, after the kernel producing it). Each step runs as the same
generator of exchanges as a blocking call (`communicate_steps`, `wire.Wire`'s ``*_steps``),
each exchange begun with `Wire.post` (MPI: Isend/Irecv on tags of the stream's own) and
resumed when `progress` finds it complete; `SyncWait`, where the steps ran before (ahead of
their update), polls until the edge it names is done. Up to `LANES` edges (an edge: the steps
writing one target, in order) run at once, each lane on a tag of its own and taking the edges
in turn, in the same order on every rank, so the messages between two ranks on one tag are
sent and received in one order. (One edge at a time, a ring's steps each wait for the slowest
of its members to be scheduled: on 4 ranks of 2 cores, 11 of 204 messages left during the
backward, against 42-109 with 16 lanes: `benchmarks/overlap.py`.)

A bucket's AllReduces fused into one (`search.fusion`) are one `FusedAllReduce` step: its
gradients flattened and concatenated in bucket order, one AllReduce of the flat buffer (the
plan's algorithm for the fused size), the result split back into each gradient's shape. Every
rank ends with the same sums; they may differ from the unfused run's in the last bits: a ring
sums an element in an order set by the chunk it falls in, and the fused buffer is cut into
other chunks than each gradient alone was.

Bytes are counted where messages are sent (`Wire.post` records them as `exchange` does);
each step's `Traffic` is handed to the executor at its wait, in program order, so a run's
traffic lists its communication instructions as the blocking run does. The same algorithm
on the same pieces gives the same sums, bit for bit. What the stream holds (the gradients it
took, the pieces in flight, the results not yet waited for) is the rank's memory: `held` lists
it for the peak.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from autostrat.errors import RuntimeBackendError
from autostrat.runtime.mpi import Pause  # mpi4py itself is imported on first use only


@dataclass(frozen=True)
class FusedAllReduce:
    """Several "sync" edges' AllReduce `steps` (a `instructions.Communicate` each, over one group,
    reduce op and dtype) run as one AllReduce of their concatenated flat pieces, as
    `algorithm`; `predicted` is what the plan says this rank sends (module docstring)."""

    steps: tuple
    algorithm: str
    predicted: int

    kind: ClassVar[str] = "AllReduce"  # as a `Communicate`'s, in reports and traffic

    @property
    def edge(self) -> str:
        """Its first edge's label and how many it fused (the report's line of the collective)."""
        return f"{self.steps[0].edge} (+ {len(self.steps) - 1} fused)"

    @property
    def phase(self) -> str:
        return self.steps[0].phase


def step_sources(step) -> tuple[str, ...]:
    """The store keys a stream step reads: a `Communicate`'s source, a fused one's sources."""
    return tuple(s.source for s in step.steps) if isinstance(step, FusedAllReduce) else (step.source,)


def step_targets(step) -> tuple[str, ...]:
    """The store keys a stream step writes."""
    return tuple(s.target for s in step.steps) if isinstance(step, FusedAllReduce) else (step.target,)


@dataclass(frozen=True)
class SyncStart:
    """Hand a bucket's gradient synchronisation `steps` (its edges' `Communicate`s, in order,
    or a `FusedAllReduce` for those it fuses) to the communication stream (`runtime.stream`):
    placed after the kernel that makes its last gradient final, so they run while the rest of
    the backward does."""

    steps: tuple

    def reads(self) -> tuple[str, ...]:
        """The store keys it takes (each edge's gradient: what no earlier step of it writes)."""
        written, read = set(), []
        for step in self.steps:
            read += [source for source in step_sources(step) if source not in written]
            written.update(step_targets(step))
        return tuple(read)


@dataclass(frozen=True)
class SyncWait:
    """Wait for one edge's `steps` (or one `FusedAllReduce`) on the communication stream, where
    they would have run (before the first update reading them); its results join the store."""

    steps: tuple

    def writes(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(target for step in self.steps for target in step_targets(step)))


def communicate_steps(step, backend, piece: np.ndarray):
    """The rank's piece after one redistribution `step` (a `instructions.Communicate`), as a
    generator of the exchanges it makes (`wire.Wire.drive` runs it blocking); a
    `FusedAllReduce` takes its pieces and gives its results as tuples, in its steps' order."""
    if isinstance(step, FusedAllReduce):
        return (yield from fused_allreduce_steps(step, backend, piece))
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


def fused_allreduce_steps(step: FusedAllReduce, backend, pieces: tuple):
    """The AllReduce of `pieces` concatenated flat (module docstring), split back into their shapes."""
    flat = np.concatenate([np.ascontiguousarray(piece).reshape(-1) for piece in pieces])
    first = step.steps[0]
    reduced = yield from backend.allreduce_steps(flat, first.group, first.reduce_op, step.algorithm)
    ends = np.cumsum([np.size(piece) for piece in pieces])[:-1]
    return tuple(part.reshape(np.shape(piece)) for part, piece in zip(np.split(reduced, ends), pieces))


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


LANES = 16  # edges in flight at once, each on a message tag of its own


class SyncStream:
    """The stream of one rank on `backend` (a `wire.Wire`); `traffic_of(step, messages)` makes
    a step's `Traffic` (the executor's).

    Edges (the steps writing one target, in order) run in lanes: edge number n of the stream
    (counted in the order they are started, the same on every rank) runs in lane ``n % LANES``
    once the edge before it there is done, its messages tagged with the lane, so up to `LANES`
    edges progress at once and a tag's messages between two ranks belong to one edge at a time.

    Example (two local ranks: a bucket of one AllReduce started, progressed, waited for):
        >>> from autostrat.runtime.local import LocalCluster
        >>> from autostrat.runtime.instructions import Communicate
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
        self.queue: deque = deque()  # edges not begun: (number, [their steps], the gradient taken from the store)
        self.lanes: dict[int, list] = {}  # lane -> [steps left, step, its exchanges, transfer, messages, piece]
        self.results: dict[str, np.ndarray] = {}  # target key -> the latest step's result, until waited for
        self.traffic: dict[str, list] = {}  # target key -> its steps' traffic, in order
        self.started = 0  # edges queued so far

    @property
    def busy(self) -> bool:
        return bool(self.queue or self.lanes)

    def start(self, steps, store: dict) -> None:
        """Queue a bucket's `steps`, edge by edge; an edge's first step takes its key from
        `store` now (the gradient: final, and dropped from the store after this)."""
        edges: dict[tuple, list] = {}
        for step in steps:
            edges.setdefault(step_targets(step), []).append(step)
        for edge in edges.values():
            pieces = tuple(store[source] for source in step_sources(edge[0]))
            self.queue.append((self.started, edge, pieces if isinstance(edge[0], FusedAllReduce) else pieces[0]))
            self.started += 1
        self.progress()

    def progress(self) -> bool:
        """Begin the edges whose lanes are free and advance every lane as far as its messages
        have arrived, without waiting for any; whether anything moved."""
        moved, any_moved = True, False
        while moved:
            moved = self._begin()
            for lane in list(self.lanes):
                moved |= self._advance(lane)
            any_moved |= moved
        return any_moved

    def progress_idle(self) -> None:
        """`progress`, from inside a blocking wait of the rank (`mpi.settle`'s background).
        The messages it posts are the stream's traffic (its steps keep them), not the blocking
        instruction's the wait is in, which counts the backend's messages sent during it."""
        if self.queue or self.lanes:
            before = len(self.backend.sent)
            self.progress()
            del self.backend.sent[before:]

    def wait(self, steps) -> tuple[dict, list]:
        """Run the stream until every step of `steps` is done: the results of their targets
        and their `Traffic`, in the order of `steps`. Between polls of every lane it pauses
        (`mpi.Pause`: yields, then sleeps, once the backend's spins are spent), as `mpi.settle`
        does: a lane's message may come before another's, so none is waited on alone."""
        targets = tuple(dict.fromkeys(target for step in steps for target in step_targets(step)))
        spins = getattr(self.backend, "spins", 0)
        pause = Pause(spins)
        while any(self._pending(target) for target in targets):
            if self.progress():
                pause = Pause(spins)
                continue
            if not self.lanes:
                raise RuntimeBackendError(f"rank {self.backend.rank}: the stream ended before {targets} were synchronised")
            pause()
        traffic = [record for target in targets for record in self.traffic.pop(target, ())]  # a fused step's: at its first
        return {target: self.results.pop(target) for target in targets}, traffic

    def held(self) -> list:
        """The arrays the stream holds for the rank: gradients taken, pieces in flight, results
        not waited for."""
        pieces = [piece for _, _, piece in self.queue] + [lane[5] for lane in self.lanes.values()]
        return [array for piece in pieces for array in (piece if isinstance(piece, tuple) else (piece,))] + list(
            self.results.values())

    def _pending(self, target: str) -> bool:
        return any(target in step_targets(edge[0]) for _, edge, _ in self.queue) or any(
            target in step_targets(lane[1]) for lane in self.lanes.values())

    def _begin(self) -> bool:
        """Begin the queued edges, in order, while the next one's lane is free."""
        begun = False
        while self.queue and self.queue[0][0] % LANES not in self.lanes:
            number, edge, piece = self.queue.popleft()
            self.lanes[number % LANES] = [deque(edge[1:]), None, None, None, None, piece, number]
            self._next_step(number % LANES, edge[0], piece)
            begun = True
        return begun

    def _next_step(self, lane: int, step, piece) -> None:
        state = self.lanes[lane]
        state[1:6] = [step, communicate_steps(step, self.backend, piece), None, [], piece]
        self._resume(lane, None)

    def _advance(self, lane: int) -> bool:
        """Resume the lane's step if its exchange is done; whether it moved."""
        transfer = self.lanes[lane][3]
        if not transfer.ready():
            return False
        self._resume(lane, transfer.result())
        return True

    def _resume(self, lane: int, received) -> None:
        """Send `received` into the lane's exchanges; post the next one, or finish its step
        (and begin the edge's next step, or free the lane)."""
        state = self.lanes[lane]
        steps_left, step, exchanges, _, messages, _, _ = state
        try:
            request = exchanges.send(received)
        except StopIteration as finished:
            fused = isinstance(step, FusedAllReduce)
            self.results.update(zip(step_targets(step), finished.value if fused else (finished.value,)))
            self.traffic.setdefault(step_targets(step)[0], []).append(self.traffic_of(step, messages))
            if steps_left:
                return self._next_step(lane, steps_left.popleft(), finished.value)
            del self.lanes[lane]
            return
        before = len(self.backend.sent)
        state[3] = self.backend.post(*request, lane=lane)
        messages.extend(self.backend.sent[before:])
