"""A pipeline run's virtual clock: the bubble its orders leave on dedicated cores, measured.

The wall-clock bubble (`runtime.pipeline`: the share of the micro-batch slots' wall time a rank
waited in its receives) counts every wait, also a rank's whose message has arrived but which
waits for a core: with more ranks than cores it is the scheduler's share as much as the
schedule's. The virtual clock leaves the machine out. Per rank and step, `PassClock` records a
trace of the micro-batch slots (the passes): at every stage-to-stage message, the CPU seconds
its thread has run in the passes so far (`time.thread_time`; the receives' own seconds, waiting,
left out), and at the step's end their total. `virtual_bubbles` then composes the ranks'
clocks along the messages they exchanged, as if each rank had a core of its own:

- a rank's clock advances by the CPU seconds it ran between two messages;
- a message carries its sender's clock at the send (the stamp), matched to its receive by
  sender, receiver, tag and order (a backend delivers the messages of one tag in order);
- a receive sets the clock to the later of the rank's clock and the message's stamp; it is the
  only wait: the sends are free, as the closed forms assume.

A step's span is the latest clock at the end of any rank's passes (every rank starts them at 0),
its bubble ``1 - sum busy / (ranks x span)``, per rank ``1 - busy / span``; a run's is its median
step's, composed of every segment's median (`median_step`: the CPU seconds between two messages,
over the steps). A pass the machine preempts runs long in CPU seconds too (on 4 ranks sharing 2
cores, a 13.4 ms forward among 3.2 ms ones, after an involuntary context switch: its caches cold,
or its virtual CPU stolen), and one on the critical path lengthens its step's span by as much; a
median per segment leaves it out unless most steps' same segment ran long, where a median of
whole steps kept the median step's preempted passes (under load most steps have one). What the
runner does between the messages that is not the passes' compute (its memory samples, its
receives' waits) is left out (`PassClock.pause`).
A device group's collectives inside the passes count at their CPU seconds, their waits for the
group's other ranks not composed (exact for groups of one device, the benchmarks' setup). It
measures the orders that ran with the compute times that ran; it reads nothing of the
prediction (`search.schedule_simulation`, `search.stages`).
"""

from __future__ import annotations

import time
from collections import deque

import numpy as np

from autostrat.errors import RuntimeBackendError

NONE, SEND, RECV, END = 0.0, 1.0, 2.0, 3.0  # a trace row's kind (NONE: padding for a gather of equal shapes)


class PassClock:
    """One rank's trace: rows ``(kind, peer, tag, busy)``, `busy` the CPU seconds of the step's
    passes so far; only what runs between `begin` and `end` (a pass) is traced.

    Example (a pass that receives, computes, sends; the numbers are the thread's own seconds):
        >>> clock = PassClock()
        >>> clock.begin(); clock.waiting(1, 7); clock.received(); clock.sending(2, 9); _ = clock.end(); clock.close_step()
        >>> [(int(kind), int(peer), int(tag)) for kind, peer, tag, _ in clock.trace()]
        [(2, 1, 7), (1, 2, 9), (3, 0, 0)]
    """

    def __init__(self):
        self.rows: list[tuple[float, float, float, float]] = []
        self.busy, self._since = 0.0, None  # seconds of the step's passes before `_since` (None: not in a pass)
        self._began = 0.0  # `busy` when the pass began
        self._paused = False  # in a pass, its clock stopped (`pause`)

    def begin(self) -> None:
        self._began, self._since = self.busy, time.thread_time()

    def end(self) -> float:
        """Close the pass; the CPU seconds it ran (its receives' left out)."""
        self.busy += time.thread_time() - self._since
        self._since = None
        return self.busy - self._began

    def sending(self, dest: int, tag: int) -> None:
        if self._since is not None:
            self.rows.append((SEND, dest, tag, self.busy + time.thread_time() - self._since))

    def waiting(self, source: int, tag: int) -> None:
        """A receive begins: the clock stops until `received`."""
        if self._since is not None:
            self.pause()
            self.rows.append((RECV, source, tag, self.busy))

    def received(self) -> None:
        self.resume()

    def pause(self) -> None:
        """Stop the clock inside a pass until `resume`: for what is not the pass's compute (a
        receive's wait, the run's own measurement of its memory); outside a pass nothing."""
        if self._since is not None:
            self.busy += time.thread_time() - self._since
            self._since, self._paused = None, True

    def resume(self) -> None:
        if self._paused:
            self._since, self._paused = time.thread_time(), False

    def close_step(self) -> None:
        self.rows.append((END, 0, 0, self.busy))
        self.busy = 0.0

    def trace(self) -> np.ndarray:
        return np.array(self.rows, np.float64).reshape(-1, 4)


def virtual_bubbles(traces) -> tuple[float, ...]:
    """Per rank, ``1 - busy / span`` of the median step of the ranks' traces (`PassClock.trace`,
    rows of kind NONE ignored; `median_step`): their mean is the run's bubble on the virtual clock.

    Example (two stages, one micro-batch: F 2 s, B 3 s on each; rank 1 starts at 2, ends at 7, so
    rank 0 waits 5 s for its gradient; span 10):
        >>> stage0 = [(SEND, 1, 0, 2.0), (RECV, 1, 1, 2.0), (END, 0, 0, 5.0)]
        >>> stage1 = [(RECV, 0, 0, 0.0), (SEND, 0, 1, 5.0), (END, 0, 0, 5.0)]
        >>> virtual_bubbles([np.array(stage0), np.array(stage1)])
        (0.5, 0.5)
    """
    steps = [_steps(rank, np.asarray(trace, np.float64)) for rank, trace in enumerate(traces)]
    counts = {len(per_rank) for per_rank in steps}
    if len(counts) != 1:
        raise RuntimeBackendError(f"virtual clock: every rank's trace must hold the same steps; got {[len(s) for s in steps]}")
    if not counts.pop():
        return (0.0,) * len(steps)
    median = [median_step(rank, per_rank) for rank, per_rank in enumerate(steps)]
    span = max(_compose(median, 0), default=0.0)
    return tuple(1.0 - rows[-1][3] / span if span else 0.0 for rows in median)


def median_step(rank: int, steps: list[list]) -> list[tuple]:
    """One step of a rank's steps (lists of trace rows) whose every segment, the CPU seconds
    between two of its rows, is that segment's median over the steps (the higher middle one of
    an even count). Every step runs the same orders on the same shapes, so a segment is the
    same compute every step: its median leaves out a preemption that hit it in a minority of
    the steps, where a median of whole steps keeps every preemption of the median step's.

    Example (a forward of 1, 9 (preempted) and 1 s; the gradient's wait and B of 2, 2 and 7 s):
        >>> steps = [[(SEND, 1, 0, 1.0), (END, 0, 0, 3.0)], [(SEND, 1, 0, 9.0), (END, 0, 0, 11.0)],
        ...          [(SEND, 1, 0, 1.0), (END, 0, 0, 8.0)]]
        >>> median_step(0, steps)
        [(1.0, 1, 0, 1.0), (3.0, 0, 0, 3.0)]
    """
    messages = {tuple(row[:3] for row in step) for step in steps}
    if len(messages) != 1:
        raise RuntimeBackendError(f"virtual clock: rank {rank}'s steps must send and receive the same messages in the same "
                                  f"order; got {len(messages)} different sequences")
    busy = np.array([[0.0] + [row[3] for row in step] for step in steps])
    segments = np.sort(np.diff(busy, axis=1), axis=0)[len(steps) // 2]
    return [(*row[:3], float(total)) for row, total in zip(steps[0], np.cumsum(segments))]


def _steps(rank: int, trace: np.ndarray) -> list[list]:
    """A rank's trace cut at its END rows, one list of rows per step."""
    steps, current = [], []
    for row in trace.tolist():
        if row[0] == NONE:
            continue
        current.append(tuple(row))
        if row[0] == END:
            steps.append(current)
            current = []
    if current:
        raise RuntimeBackendError(f"virtual clock: rank {rank}'s trace must end with a step's end; got {len(current)} rows after it")
    return steps


def _compose(rows_by_rank: list[list], step: int) -> list[float]:
    """Every rank's clock at the end of one step's passes: each rank runs its rows in order, a
    receive waiting for its message's stamp (a rank blocked on one lets the others run first)."""
    stamps: dict[tuple[int, int, int], deque] = {}  # (source, dest, tag) -> stamps of the sends not yet received
    position, clock, ran = [0] * len(rows_by_rank), [0.0] * len(rows_by_rank), [0.0] * len(rows_by_rank)
    moved = True
    while moved:
        moved = False
        for rank, rows in enumerate(rows_by_rank):
            while position[rank] < len(rows):
                kind, peer, tag, busy = rows[position[rank]]
                key = (int(peer), rank, int(tag)) if kind == RECV else (rank, int(peer), int(tag))
                if kind == RECV and not stamps.get(key):
                    break  # its message is not sent yet (on the virtual clock)
                now = clock[rank] + busy - ran[rank]
                if kind == SEND:
                    stamps.setdefault(key, deque()).append(now)
                elif kind == RECV:
                    now = max(now, stamps[key].popleft())
                clock[rank], ran[rank] = now, busy
                position[rank] += 1
                moved = True
    blocked = [(rank, rows[position[rank]]) for rank, rows in enumerate(rows_by_rank) if position[rank] < len(rows)]
    if blocked:
        rank, (_, peer, tag, _) = blocked[0]
        raise RuntimeBackendError(f"virtual clock, step {step}: rank {rank} receives from rank {int(peer)} with tag {int(tag)} "
                                  f"a message that rank never sent; every receive must match a send")
    return clock
