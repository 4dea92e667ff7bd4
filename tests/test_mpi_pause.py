"""How a waiting rank spends its polls (`runtime.mpi.Pause`, used by `settle` and the
communication stream): spin, then yield the core, then sleep; no MPI needed."""

from __future__ import annotations

import pytest

from autostrat.runtime import mpi


class Clock:
    """A fake `time.perf_counter` that a test advances by hand."""

    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


@pytest.fixture
def calls(monkeypatch):
    """What the pause did, in order: "yield" or ("sleep", seconds); and the fake clock."""
    done, clock = [], Clock()
    monkeypatch.setattr(mpi.os, "sched_yield", lambda: done.append("yield"))
    monkeypatch.setattr(mpi.time, "sleep", lambda seconds: done.append(("sleep", seconds)))
    monkeypatch.setattr(mpi.time, "perf_counter", clock)
    return done, clock


def test_a_wait_spins_then_yields_until_its_yielding_time_is_spent_then_sleeps(calls):
    # Would catch a pause that sleeps at once (the 2 ms naps that took an 8-rank step on 2
    # cores from 4.6 to 25 ms) or one that yields for ever (a core held during a long wait).
    done, clock = calls
    pause = mpi.Pause(spins=3)
    for _ in range(3):
        pause()
    assert done == []  # the spins: a partner already there answers within them
    pause()
    pause()
    assert done == ["yield", "yield"]
    clock.now += 1.01 * mpi.YIELDING
    for _ in range(10):
        pause()
    naps = [seconds for kind, seconds in done[2:]]
    assert naps[:3] == [1e-5, 2e-5, 4e-5] and naps[-1] == mpi.LONGEST_NAP and max(naps) == mpi.LONGEST_NAP


def test_settle_polls_until_every_request_completes_pausing_between(calls):
    # Would catch a settle that returns while a request is pending, or polls without pausing.
    done, _ = calls

    class After:
        def __init__(self, tests):
            self.tests = tests

        def Test(self):
            self.tests -= 1
            return self.tests <= 0

    requests = [After(2), After(5)]
    mpi.settle(requests, spins=0)
    assert [request.tests for request in requests] == [0, 0]  # each tested until done, not after
    assert done == ["yield"] * 4


class DoneAfter:
    """A request that completes on its `polls`-th Test."""

    def __init__(self, polls: int):
        self.left = polls

    def Test(self):
        self.left -= 1
        return self.left <= 0


def test_a_blocking_wait_runs_the_background_between_polls_and_a_patient_one_never_sleeps(calls):
    done, clock = calls
    ran = []
    mpi.settle([DoneAfter(4)], spins=0, background=lambda: ran.append(1))
    assert len(ran) == 3  # between the four polls, not after the last
    done.clear()

    class Slow(DoneAfter):
        def Test(self):
            clock.now += 1.0  # a second per poll: past the yielding budget at once
            return super().Test()

    mpi.settle([Slow(5)], spins=0, yielding=float("inf"))
    assert done == ["yield"] * 4  # never a sleep
    mpi.settle([Slow(3)], spins=0)
    assert any(isinstance(call, tuple) and call[0] == "sleep" for call in done)


def test_the_executor_lends_its_stream_to_blocking_waits_for_the_run_only():
    import numpy as np

    from autostrat.runtime.executor import execute
    from autostrat.runtime.instructions import Load, Program

    class Backend:
        sent: list = []
        background = None

        def prepare(self, partitions):
            pass

    backend, seen = Backend(), []
    program = Program(0, 1, (), (Load("x", ((0, 2),)),), ("x",), (("x", "x"),))
    execute(program, backend, {"x": np.ones(2, np.float32)}, on_instruction=lambda index, _: seen.append(backend.background))
    assert [getattr(b, "__name__", None) for b in seen] == ["progress_idle"]  # the stream's, during the run
    assert backend.background is None  # and no longer after it
