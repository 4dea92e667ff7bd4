"""MpiBackend: one real process per rank, collectives as point-to-point messages through mpi4py.

Every collective is a sequence of paired sends and receives on the world communicator with a tag
of its own, `WIRE_TAG` (`wire.Wire` says which calls), so the bytes each rank counts at its send
calls are the bytes MPI moves; pipeline stages use Isend/Irecv on the world communicator, and the
run report a Gather. The communication stream's collectives (`runtime.stream`: gradient
synchronisation in buckets) are the same messages begun with Isend/Irecv on `STREAM_TAG` and
tested between kernels, each lane of the stream on a tag of its own below `WIRE_TAG`, so that
they never match a blocking collective's message or one another's. Every wait is `settle`'s (a `Pause` between polls): MPI's own blocking calls spin on the core, and a
job with more ranks than cores (8 on a 2-core machine) would spend its waits taking the core
from the very rank it waits for (a rank computing a check while seven spun: 68 s of a 110 s run).
Only the buffer (upper-case) methods are used, on contiguous numpy arrays, so nothing is pickled. mpi4py is
imported on first use, so `autostrat` imports without it; a missing MPI becomes a
`RuntimeBackendError` before any collective.
"""

from __future__ import annotations

import math
import os
import time

import numpy as np

from autostrat.errors import RuntimeBackendError
from autostrat.runtime.allocator import keep_freed_memory
from autostrat.runtime.threads import share_cores
from autostrat.runtime.wire import Message, Wire

WIRE_TAG = 32767  # the largest tag every MPI allows (MPI_TAG_UB >= 32767); pipeline tags count from 0
STREAM_TAG = WIRE_TAG - 1  # the communication stream's lane 0 (`runtime.stream`); lane k: STREAM_TAG - k
SPINS = 200  # tests before the first yield: a partner that is already there answers within them
YIELDING = 0.005  # seconds of a wait spent yielding the core before sleeping (see `Pause`)
LONGEST_NAP = 0.002  # seconds: the latency a long wait adds at most


class Pause:
    """What a waiting rank does between two polls of its requests: nothing for its first
    `spins` polls, then it yields its core (``sched_yield``) until it has waited `YIELDING`
    seconds, then sleeps (from 10 us, doubling up to `LONGEST_NAP`).

    Why yield first: with more ranks than cores (8 on 2), the rank a wait needs is runnable
    and a yield hands it the core at once, where a sleep of 10 us to 2 ms lets the message
    arrive and then lie unread until the timer fires, once per message (ffn.yaml's 8-rank
    config step: 25.1 ms sleeping, 4.6 ms yielding, `benchmarks/time_model.py`). Why sleep
    after: a wait of seconds (a rank computing its check) would otherwise keep a core busy
    yielding to nobody.

    Example:
        >>> pause = Pause(spins=0)
        >>> pause(); pause.polls
        1
    """

    def __init__(self, spins: int = SPINS, yielding: float = YIELDING):
        self.spins, self.yielding, self.polls, self.nap, self.started = spins, yielding, 0, 1e-5, None

    def __call__(self) -> None:
        self.polls += 1
        if self.polls <= self.spins:
            return
        now = time.perf_counter()
        self.started = now if self.started is None else self.started
        if now - self.started < self.yielding:
            os.sched_yield()
        else:
            time.sleep(self.nap)
            self.nap = min(2 * self.nap, LONGEST_NAP)


def settle(requests: list, spins: int = SPINS, background=None, yielding: float = YIELDING) -> None:
    """Wait until every MPI request in `requests` completes, polling them with a `Pause`
    between polls, so that a waiting rank gives its core to the ranks still computing;
    `background()`, when given, runs between polls (the communication stream's progress,
    `runtime.stream`: a rank in a blocking collective keeps its buckets moving, as a device's
    second stream would, where a stream waiting for this rank's next message would hold
    every rank that waits for it). `yielding`: seconds of yielding before the pause sleeps.

    Example:
        >>> class Done:
        ...     def Test(self): return True
        >>> settle([Done(), Done()])
    """
    pending, pause = list(requests), Pause(spins, yielding)
    while pending:
        pending = [request for request in pending if not request.Test()]
        if pending:
            if background is not None:
                background()
            pause()


def import_mpi():
    """The `mpi4py.MPI` module, or a `RuntimeBackendError` saying how to get it."""
    try:
        from mpi4py import MPI
    except ImportError as error:  # also an MPI library that fails to load
        raise RuntimeBackendError(
            f"the MPI backend needs mpi4py and an MPI library (pip install mpi4py mpich); import failed: {error}"
        ) from None
    return MPI


class MpiBackend(Wire):
    """This process's rank of ``MPI.COMM_WORLD`` (see `backend.Backend`).

    Collective messages carry `WIRE_TAG`, above every pipeline tag, so they never match a
    pipeline stage's message; between a pair of ranks MPI delivers messages of one tag in order.
    """

    def __init__(self, comm=None):
        super().__init__()
        self.MPI = import_mpi()
        self.comm = comm if comm is not None else self.MPI.COMM_WORLD
        self.rank, self.device_num = self.comm.Get_rank(), self.comm.Get_size()
        # Before the first kernel: the ranks on this machine split its cores. Where they
        # outnumber them, a waiting rank yields at once: its polls would take the core from the
        # rank it waits for (the pipeline sample on 8 ranks, 2 cores: 46.2 CPU-seconds with 200
        # polls, 44.6 with none, two runs each).
        self.spins = 0 if share_cores().crowded else SPINS
        keep_freed_memory()  # each step's buffers reuse the last step's pages (`runtime.allocator`)
        self._posted: list = []  # pipeline sends not known to be received yet, with their buffers
        self.background = None  # what a blocking wait runs between polls (`settle`; the executor sets it)

    def prepare(self, partitions) -> None:
        if not hasattr(self, "_spare"):
            settle([self.comm.Ibarrier()], self.spins)  # every rank is here: the Dup below does not spin for long
            self._spare = self.comm.Dup()  # for `barrier_on_copy`; made by every rank together

    def transfer(self, piece, dest, source, shape):
        result = None if source == self.rank else np.empty(shape, piece.dtype)
        requests = [] if result is None else [self.comm.Irecv(_raw(result), source, WIRE_TAG)]
        if dest != self.rank:  # a one-way message of recursive doubling's fold-in
            requests.append(self.comm.Isend(_raw(piece), dest, WIRE_TAG))
        settle(requests, self.spins, self.background)
        return result

    def start_transfer(self, piece, dest, source, shape, lane=0):
        """Isend and Irecv on the lane's tag, not waited for (`wire.Wire.post`)."""
        result, tag = None if source == self.rank else np.empty(shape, piece.dtype), STREAM_TAG - lane
        requests = [] if result is None else [self.comm.Irecv(_raw(result), source, tag)]
        if dest != self.rank:
            requests.append(self.comm.Isend(_raw(piece), dest, tag))
        return Posted(requests, (piece, result))

    def send(self, piece, dest, tag):
        piece = np.ascontiguousarray(piece)
        self.sent.append(Message(dest, piece.nbytes))
        self._posted.append((self.comm.Isend(_raw(piece), dest, tag=tag), piece))  # the buffer lives until completed

    def recv(self, shape, dtype, source, tag):
        result = np.empty(shape, dtype)
        settle([self.comm.Irecv(_raw(result), source, tag=tag)], self.spins, self.background)
        return result

    def complete_sends(self) -> None:
        settle([request for request, _ in self._posted], self.spins)
        self._posted.clear()

    def barrier(self) -> None:
        """Two barriers: the first may sleep (its wait may be a rank's check of the last step,
        seconds), the second never does, so that every rank leaves it within a yield of the
        last one's arrival, not a nap later (up to `LONGEST_NAP` each: a crowded job's step,
        timed from the first rank's start, took 12 ms for a 1 ms step)."""
        settle([self.comm.Ibarrier()], self.spins)
        settle([self.comm.Ibarrier()], self.spins, yielding=math.inf)

    def gather_report(self, values):
        values = np.ascontiguousarray(values, np.float64)
        received = np.empty((self.device_num,) + values.shape, np.float64) if self.rank == 0 else None
        settle([self.comm.Igather(values, received, root=0)], self.spins)
        return list(received) if self.rank == 0 else None

    def allgather_objects(self, value) -> list:
        """Every rank's `value` (pickled), in rank order: for data loading, outside the plan's
        counted traffic."""
        settle([self.comm.Ibarrier()], self.spins)  # a rank still reading its data is waited for asleep
        return self.comm.allgather(value)

    def barrier_on_copy(self) -> None:
        """A barrier on a duplicate of the world communicator (fault tests: a rank entering it
        alone deadlocks, as a mismatched collective would)."""
        settle([self._spare.Ibarrier()], self.spins)

    def abort(self, code: int = 1) -> None:
        """End every rank of the job now (MPI_Abort)."""
        self.comm.Abort(code)


class Posted:
    """An exchange begun on MPI (a `wire.Done`'s methods): its requests, and the buffers they
    use, which must live until the requests complete."""

    def __init__(self, requests: list, buffers: tuple):
        self.requests, self.buffers = requests, buffers

    def ready(self) -> bool:
        self.requests = [request for request in self.requests if not request.Test()]
        return not self.requests

    def result(self):
        return self.buffers[1]


def _raw(array: np.ndarray) -> np.ndarray:
    """`array` as MPI can take it: a 16-bit float (bf16, which MPI has no datatype for, and
    fp16) as its 16-bit words, the same bytes.

    Example:
        >>> _raw(np.ones(2, np.float16)).dtype, _raw(np.ones(2, np.float32)).dtype
        (dtype('uint16'), dtype('float32'))
    """
    return array.view(np.uint16) if array.dtype.kind in "fV" and array.dtype.itemsize == 2 else array
