"""CP-SAT solvers as `refine` runs them: deterministic parameters, and Ctrl-C that stops a solve."""

from __future__ import annotations

import signal
import socket
import threading
from contextlib import contextmanager

from ortools.sat.python import cp_model


@contextmanager
def ctrl_c_stops(solver: cp_model.CpSolver):
    """Ctrl-C while CP-SAT runs stops its search at once and raises KeyboardInterrupt when it
    has returned.

    CP-SAT would otherwise catch SIGINT itself and return its best solution as if the time limit
    had struck; and Python runs its own handler only between bytecodes of the main thread, which
    waits inside the solver. Python's C-level handler still writes the signal number to the
    wakeup socket at once, so a watcher thread reading it can stop the search.
    """
    if threading.current_thread() is not threading.main_thread():
        yield  # signals are delivered to the main thread only; nothing to watch here
        return
    solver.parameters.catch_sigint_signal = False
    reader, writer = socket.socketpair()
    writer.setblocking(False)
    interrupted = threading.Event()

    def watch() -> None:
        if reader.recv(1) and not interrupted.is_set():  # set before the socket closes at the end
            interrupted.set()
            solver.stop_search()

    previous_handler = signal.signal(signal.SIGINT, lambda *_: interrupted.set())
    previous_fd = signal.set_wakeup_fd(writer.fileno())
    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        yield
    finally:
        signal.set_wakeup_fd(previous_fd)
        signal.signal(signal.SIGINT, previous_handler)
        woken = interrupted.is_set()
        interrupted.set()  # the watcher, if still waiting, must not stop anything now
        writer.close()  # wakes the watcher with an empty read
        watcher.join()
        reader.close()
        if woken:
            raise KeyboardInterrupt


def new_solver(time_limit: float, workers: int) -> cp_model.CpSolver:
    """A CP-SAT solver of `time_limit` seconds with `workers` workers (0: one, deterministic)."""
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = max(float(time_limit), 0.0)
    # One worker with a fixed seed is deterministic: the same problem gives the same choice, so
    # plans stay byte-identical (measured here, it also beat 8 interleaved workers on 2 cores).
    # More workers race: the optimum is the same, but which of several equal plans wins may vary.
    solver.parameters.num_workers = workers or 1
    solver.parameters.random_seed = 0
    # The pair variables' marginals are at-most-one constraints after presolve, which level 1
    # leaves out of the LP: its bound then never left the trivial one (an 8-layer training step
    # without a budget: no proof in 30 s at level 1, proven optimal in 8 s at level 2).
    solver.parameters.linearization_level = 2
    # Probing fixes each literal in turn and propagates: on these models it found 9 to 69 binary
    # clauses among 27,000 literals, and without it a training step under a budget was proven
    # with less work at 32 and 96 layers (47 -> 32 and 16 -> 8.5 units), a little more at 8
    # (15 -> 18).
    solver.parameters.cp_model_probing_level = 0
    return solver


def run(solver: cp_model.CpSolver, built, callback=None) -> int:
    """The status of `solver` on `built` (a `cpsat.SolverModel`), Ctrl-C stopping it."""
    with ctrl_c_stops(solver):
        return solver.Solve(built.model, callback)
