"""LocalBackend: every rank in one process, one thread per rank, numpy only (for tests).

Collectives are messages (`wire.Wire`): a rank posts a copy of each buffer it sends in the
cluster's mailbox under (source, dest, tag) and takes what it receives from there, oldest first,
so messages between a pair arrive in order. The run report's gathering (`gather_report`) meets
instead: each member posts its value in a shared slot, waits for the others at a barrier, reads
every slot and waits again before the slots can be reused; it is not traffic of the plan.
"""

from __future__ import annotations

import threading
from collections import deque
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from autostrat.errors import RuntimeBackendError
from autostrat.runtime.wire import Message, Wire

WIRE_TAG = -1  # the mailbox tag of collective messages (pipeline sends use tags >= 0)
STREAM_TAG = -2  # the communication stream's lane 0 (`runtime.stream`); lane k: STREAM_TAG - k


class _Meeting:
    """Where the members of one group exchange values."""

    def __init__(self, members: tuple[int, ...], timeout: float):
        self.members = members
        self.slots: list = [None] * len(members)
        self.barrier = threading.Barrier(len(members), timeout=timeout)

    def exchange(self, rank: int, value) -> list:
        self.slots[self.members.index(rank)] = value
        self.barrier.wait()
        values = list(self.slots)
        self.barrier.wait()  # nobody posts the next value before everyone has read this one
        return values


class LocalCluster:
    """`device_num` ranks as threads of this process.

    Example:
        >>> cluster = LocalCluster(2)
        >>> cluster.run(lambda backend: backend.allgather(np.array([backend.rank]), (0, 1)))
        [[array([0]), array([1])], [array([0]), array([1])]]
    """

    def __init__(self, device_num: int, timeout: float = 60.0):
        if device_num < 1:
            raise RuntimeBackendError(f"LocalCluster needs device_num >= 1, got {device_num}")
        self.device_num, self.timeout = device_num, timeout
        self._meetings: dict[tuple[int, ...], _Meeting] = {}
        self._lock = threading.Lock()
        self._root_failure: tuple | None = None
        self._mail: dict[tuple[int, int, int], deque] = {}  # (source, dest, tag) -> posted pieces, oldest first
        self._mail_posted = threading.Condition(self._lock)
        self.meeting(tuple(range(device_num)))

    def meeting(self, group: tuple[int, ...]) -> _Meeting:
        with self._lock:
            if group not in self._meetings:
                self._meetings[group] = _Meeting(group, self.timeout)
            return self._meetings[group]

    def post(self, source: int, dest: int, tag: int, piece) -> None:
        with self._mail_posted:
            self._mail.setdefault((source, dest, tag), deque()).append(piece)
            self._mail_posted.notify_all()

    def has(self, source: int, dest: int, tag: int) -> bool:
        """Whether a piece `source` posted to `dest` with `tag` is waiting (a failed rank
        breaks the poll, as it breaks `take`)."""
        with self._lock:
            if self._root_failure is not None:
                raise threading.BrokenBarrierError
            return bool(self._mail.get((source, dest, tag)))

    def take(self, source: int, dest: int, tag: int):
        """The oldest piece `source` posted to `dest` with `tag`, waiting for it (up to the
        timeout, or until another rank fails)."""
        with self._mail_posted:
            ready = lambda: self._root_failure is not None or self._mail.get((source, dest, tag))  # noqa: E731
            if not self._mail_posted.wait_for(ready, self.timeout) or self._root_failure is not None:
                raise threading.BrokenBarrierError  # reported like a broken collective
            return self._mail[(source, dest, tag)].popleft()

    def run(self, fn) -> list:
        """``fn(backend)`` on every rank, each in its own thread; returns the results by rank.
        The first rank to fail breaks every meeting, and its error is raised naming it."""
        with ThreadPoolExecutor(max_workers=self.device_num) as pool:
            futures = [pool.submit(self._run_rank, fn, rank) for rank in range(self.device_num)]
            results, failure = [], None
            for rank, future in enumerate(futures):
                try:
                    results.append(future.result())
                except Exception as error:  # noqa: BLE001  (re-raised below with the rank)
                    failure = failure or (rank, error)
                    results.append(None)
        if failure:
            rank, error = self._root_failure or failure  # the cause, not a rank it woke up
            raise RuntimeBackendError(f"rank {rank}: {type(error).__name__}: {error}") from error
        return results

    def _run_rank(self, fn, rank: int):
        try:
            return fn(LocalBackend(self, rank))
        except threading.BrokenBarrierError:
            raise RuntimeBackendError(f"rank {rank}: a collective was broken by another rank's failure or timed out") from None
        except BaseException as error:
            with self._lock:
                self._root_failure = self._root_failure or (rank, error)
            for meeting in list(self._meetings.values()):
                meeting.barrier.abort()  # wake the ranks waiting for this one
            with self._mail_posted:
                self._mail_posted.notify_all()
            raise


class LocalBackend(Wire):
    """One rank of a `LocalCluster` (see `backend.Backend`)."""

    def __init__(self, cluster: LocalCluster, rank: int):
        super().__init__()
        self.cluster, self.rank, self.device_num = cluster, rank, cluster.device_num

    def prepare(self, partitions) -> None:
        for partition in partitions:
            for group in partition:
                self.cluster.meeting(group)

    def _exchange(self, group, value) -> list:
        return self.cluster.meeting(tuple(group)).exchange(self.rank, value)

    def transfer(self, piece, dest, source, shape):
        if dest != self.rank:
            self.cluster.post(self.rank, dest, WIRE_TAG, np.array(piece))
        return None if source == self.rank else self.cluster.take(source, self.rank, WIRE_TAG)

    def start_transfer(self, piece, dest, source, shape, lane=0):
        """The piece posted at once (a copy) on the lane's tag, the receipt taken when it is
        there (`wire.Wire.post`)."""
        if dest != self.rank:
            self.cluster.post(self.rank, dest, STREAM_TAG - lane, np.array(piece))
        return Mail(self.cluster, source, self.rank, STREAM_TAG - lane)

    def send(self, piece, dest, tag):
        self.sent.append(Message(dest, np.asarray(piece).nbytes))
        self.cluster.post(self.rank, dest, tag, np.array(piece))

    def recv(self, shape, dtype, source, tag):
        return self.cluster.take(source, self.rank, tag)

    def complete_sends(self) -> None:
        pass  # a posted piece is a copy: nothing to wait for

    def barrier(self) -> None:
        self._exchange(tuple(range(self.device_num)), None)

    def gather_report(self, values):
        gathered = self._exchange(tuple(range(self.device_num)), np.asarray(values, np.float64))
        return [np.array(v) for v in gathered] if self.rank == 0 else None


class Mail:
    """The receipt of an exchange begun on a `LocalCluster` (a `wire.Done`'s methods): none
    when `source` is the rank itself (a one-way message)."""

    def __init__(self, cluster: LocalCluster, source: int, rank: int, tag: int):
        self.cluster, self.source, self.rank, self.tag = cluster, source, rank, tag
        self.received, self.taken = None, source == rank

    def ready(self) -> bool:
        if not self.taken and self.cluster.has(self.source, self.rank, self.tag):
            self.received, self.taken = self.cluster.take(self.source, self.rank, self.tag), True
        return self.taken

    def result(self):
        return self.received


def execute_on_ranks(programs, values: dict, backend=None):
    """One run of `programs` (one per rank) on `values`: on `backend` this rank's `RankResult`
    (an MPI rank: `check_world` first), without one rank 0's, every rank a `LocalCluster` thread.

    Example: see `executor.execute`."""
    from autostrat.runtime.backend import check_world
    from autostrat.runtime.executor import execute

    if backend is None:
        return LocalCluster(len(programs)).run(lambda local: execute(programs[local.rank], local, values))[0]
    check_world(len(programs), backend)
    return execute(programs[backend.rank], backend, values)


def run_job_locally(job):
    """Run a `job.Job` on a `LocalCluster` and return rank 0's `report.RunCheck`."""
    from autostrat.runtime.job import run_steps
    from autostrat.runtime.report import format_report

    summaries = LocalCluster(job.device_num).run(lambda backend: run_steps(job, backend))
    return format_report(job, summaries[0], "LocalBackend threads")
