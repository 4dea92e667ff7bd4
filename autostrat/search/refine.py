"""Global refinement with OR-Tools CP-SAT: the optimum of the same cost model BFS uses.

`refine` starts from known plans: the BFS plan, the data-parallel plan around the seeds, and any
other the caller adds (`starts`). The solver is hinted the start with the fewest bytes among those
that fit the memory budget (if none fits, the one with the smallest peak), and the result is the
best plan known when it stops, with a proven bound on the bytes:

- proven: the solver's plan, OPTIMAL, its bound equal to its bytes;
- the time limit struck: the best of the solver's plan and the starts that fit the budget,
  FEASIBLE, with the solver's best bound and the gap to it; also when the solver found nothing
  itself: a start that fits is a plan, never an error;
- no known plan fits: `InfeasibleError` when CP-SAT proved that no plan fits (with the smallest
  achievable peak), else `SolverError` saying that the time limit struck first and what to try.

The model is `cpsat.SolverModel` over the coarsened problem (`coarsen`), solved for bytes; once
they are proven, plans of those bytes are ordered by flops within a bounded share of the work
(`FLOPS_SHARE`), so the flops are the fewest found, not always proven fewest. The solver's plan
is expanded back to every op and its bytes are checked against the plan's.
"""

from __future__ import annotations

import signal
import socket
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass

from ortools.sat.python import cp_model

from autostrat.errors import AutostratError, InfeasibleError, SolverError
from autostrat.search.coarsen import coarsen, share_layers
from autostrat.search.cpsat import Objective, SolverModel
from autostrat.search.memory import peak_bytes, tensor_bytes
from autostrat.search.problem import SearchProblem

SOLVED = (cp_model.OPTIMAL, cp_model.FEASIBLE)
# Ordering plans of the proven bytes by flops gets this share of the work proving the bytes took,
# at least `FLOPS_WORK` (CP-SAT's deterministic time, not seconds: on a loaded machine the same
# problem still gets the same plan). Proving the flops too took twice the bytes' work on an
# 8-layer training step.
FLOPS_SHARE, FLOPS_WORK = 0.25, 1.0
# When no start fits the budget, the memory-only model may take this share of the time limit to
# find one that does (or prove that none can).
SMALLEST_SHARE = 0.25


@dataclass(frozen=True)
class RefineResult:
    """The refined choice per op and how good it is proven to be (bytes per device)."""

    choice: dict[str, int]
    objective: int
    bound: int
    status: str
    seconds: float
    hint_objective: int
    coarsening: str = ""
    exact: bool = True  # False: the bound holds for plans whose repeated layers agree
    merged: tuple[str, ...] = ()  # ops the coarsening folded into their neighbours
    space: str = ""  # the candidates the status and bound are over (`candidate_space`)

    @property
    def gap(self) -> float:
        """Relative distance between the objective and the best bound (0 when proven optimal)."""
        return 0.0 if self.objective == 0 else (self.objective - self.bound) / self.objective


@dataclass(frozen=True)
class _Start:
    """A known plan: its choice, bytes and, under a budget, peak (0 without one)."""

    choice: dict[str, int]
    bytes: int
    peak: int


def candidate_space(problem: SearchProblem) -> str:
    """What a refinement's optimum is optimal among: the splits candidates may use, on which
    mesh, and whether they may repeat work (the coarsening and shared layers say the rest).

    Example:
        >>> from autostrat.frontend import trace
        >>> from autostrat.models import FFN
        >>> from autostrat.nn import Tensor
        >>> from autostrat.search.problem import build_problem
        >>> candidate_space(build_problem(trace(FFN(), Tensor(shape=(64, 64)), device_num=32), 32))
        'candidates with splits 1, 4, 8, 32 on mesh 4 x 8'
        >>> candidate_space(build_problem(trace(FFN(), Tensor(shape=(64, 64)), device_num=8), 8, allow_repeated=True))
        'candidates with every divisor as a split, repeated calculation allowed'
    """
    if problem.split_values is None:
        splits = "every divisor as a split"
    else:
        splits = "splits " + ", ".join(map(str, sorted(problem.split_values)))
    mesh = "" if problem.mesh is None else " on mesh " + " x ".join(map(str, problem.mesh))
    return f"candidates with {splits}{mesh}{', repeated calculation allowed' if problem.allow_repeated else ''}"


def _starts(problem: SearchProblem, choices, budget: int | None) -> list[_Start]:
    return [_Start(dict(c), problem.cost(c, shared=True), peak_bytes(problem, c) if budget is not None else 0) for c in choices]


def _fitting(starts: list[_Start], budget: int | None) -> list[_Start]:
    return [start for start in starts if budget is None or start.peak <= budget]


def _hint_start(starts: list[_Start], budget: int | None) -> _Start:
    """The fewest bytes among the starts that fit, else the smallest peak (the first on ties)."""
    fitting = _fitting(starts, budget)
    return min(fitting, key=lambda s: s.bytes) if fitting else min(starts, key=lambda s: s.peak)


class _Progress(cp_model.CpSolverSolutionCallback):
    def __init__(self, report, objective: Objective, start: float):
        super().__init__()
        self.report, self.objective, self.start = report, objective, start

    def on_solution_callback(self) -> None:
        found, bound = self.objective.bytes(self.ObjectiveValue()), self.objective.bytes(self.BestObjectiveBound())
        self.report(found, bound, time.perf_counter() - self.start)


@contextmanager
def _ctrl_c_stops(solver: cp_model.CpSolver):
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


def _solver(time_limit: float, workers: int) -> cp_model.CpSolver:
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


def _run(solver: cp_model.CpSolver, built: SolverModel, callback=None) -> int:
    with _ctrl_c_stops(solver):
        return solver.Solve(built.model, callback)


def smallest_peak(problem: SearchProblem, time_limit: float = 60.0, workers: int = 0, level: str = "exact") -> tuple[int | None, bool]:
    """The smallest per-device peak memory of any choice (at coarsening `level`: "layers" only
    weighs plans whose repeated layers agree), and whether CP-SAT proved it smallest (None:
    no choice found within `time_limit`).

    Example:
        >>> from autostrat.frontend import trace
        >>> from autostrat.models import FFN
        >>> from autostrat.nn import Tensor
        >>> from autostrat.search.problem import build_problem
        >>> problem = build_problem(trace(FFN(), Tensor(shape=(64, 64)), device_num=8), 8)
        >>> smallest_peak(problem)
        (14400, True)
    """
    peak, proven, _ = _smallest_peak_plan(problem, time_limit, workers, level)
    return peak, proven


def _smallest_peak_plan(problem: SearchProblem, time_limit: float, workers: int, level: str):
    """(smallest peak found, whether proven, its choice), or (None, False, None)."""
    # Pruning keeps a candidate no smaller in any tensor, and merging only ops of constant
    # memory: the smallest peak of the coarse model is the problem's.
    built = SolverModel(problem, coarsen(problem, level, budget=True), priced=False)
    resident, activations = tensor_bytes(problem)
    peak = built.model.NewIntVar(0, sum(max(item.bytes) for item in resident + activations), "peak")
    for expression in built.memory():
        built.model.Add(peak >= expression)
    built.model.Minimize(peak)
    solver = _solver(time_limit, workers)
    status = _run(solver, built)
    if status not in SOLVED:
        return None, False, None
    return int(solver.Value(peak)), status == cp_model.OPTIMAL, built.choice(solver)


def model_size(problem: SearchProblem, level: str = "exact", budget: int | None = None) -> tuple[int, int]:
    """Variables and constraints of the CP-SAT model `refine` builds at coarsening `level`.

    Example:
        >>> from autostrat.frontend import trace
        >>> from autostrat.models import FFN
        >>> from autostrat.nn import Tensor
        >>> from autostrat.search.problem import build_problem
        >>> problem = build_problem(trace(FFN(), Tensor(shape=(64, 64)), device_num=8), 8)
        >>> model_size(problem, "none"), model_size(problem, "exact")  # a chain merges entirely
        ((185, 113), (0, 0))
    """
    built = SolverModel(problem, coarsen(problem, level, budget=budget is not None))
    built.limit_memory(budget)
    proto = built.model.Proto()
    return len(proto.variables), len(proto.constraints)


def _infeasible(problem: SearchProblem, budget: int, time_limit: float, workers: int, layered: bool) -> InfeasibleError:
    peak, proven = smallest_peak(problem, time_limit, workers, "layers" if layered else "exact")
    return _infeasible_error(budget, layered, peak, proven)


def _infeasible_error(budget: int, layered: bool, peak: int | None, proven: bool) -> InfeasibleError:
    """No plan (whose repeated layers agree, when `layered`) fits `budget`; the smallest peak
    the memory-only model found, if any, and whether it proved it smallest."""
    plans = "no plan whose repeated layers agree" if layered else "no plan"
    if peak is None:
        smallest = "the smallest achievable peak was not found within the time limit"
    elif proven:
        smallest = f"the smallest achievable peak is {peak:,} bytes (parameters plus live activations)"
    else:
        smallest = f"the smallest peak found within the time limit is {peak:,} bytes (not proven smallest)"
    return InfeasibleError(f"{plans} fits max_device_memory = {int(budget):,} bytes per device: {smallest}")


def _no_plan(problem: SearchProblem, status: int, starts: list[_Start], budget: int, time_limit: float, left: float,
             workers: int, layered: bool, explain: bool) -> AutostratError:
    """Why no plan is returned: proven infeasible (explained within the `left` seconds of the
    time limit), or the time limit struck before anything fit."""
    if status == cp_model.INFEASIBLE:
        if not explain:
            return InfeasibleError(f"no plan fits max_device_memory = {int(budget):,} bytes per device")
        return _infeasible(problem, budget, left, workers, layered)
    smallest = min(start.peak for start in starts)
    return SolverError(
        f"CP-SAT found no plan within the time limit ({time_limit:g} s) and did not prove that none fits "
        f"max_device_memory = {int(budget):,} bytes per device; the smallest peak of the starts is {smallest:,} bytes. "
        f"Try a longer refine_time_limit, or coarsen 'layers' (repeated layers share variables: a smaller model)"
    )


def _checked_start(problem: SearchProblem, built: SolverModel, solver: cp_model.CpSolver, objective: Objective) -> _Start:
    """The solver's plan and its cost as the plan pays it (shared redistributions once), which
    must be what the coarse model counted."""
    choice = built.choice(solver)
    found = problem.cost(choice, shared=True)
    modelled = solver.Value(objective.byte_sum) * objective.unit + objective.constant
    if found != modelled:
        raise SolverError(f"the coarse model's bytes ({modelled}) disagree with the plan's ({found})")
    return _Start(choice, found, 0)


def _solve(problem: SearchProblem, built: SolverModel, objective: Objective, time_limit: float, workers: int,
           progress) -> tuple[int, _Start | None, int]:
    """CP-SAT's status on the bytes, its plan (None without one) and its bound on the bytes; once
    the bytes are proven, plans of those bytes are ordered by flops within `FLOPS_SHARE` of the
    work left."""
    begin = time.perf_counter()
    solver = _solver(time_limit, workers)
    status = _run(solver, built, _Progress(progress, objective, begin) if progress else None)
    if status == cp_model.MODEL_INVALID:
        raise SolverError(f"CP-SAT rejected the model: {built.model.Validate()}")
    if status == cp_model.INFEASIBLE:
        return status, None, objective.constant
    bound = objective.bytes(max(solver.BestObjectiveBound(), 0))
    if status not in SOLVED:
        return status, None, bound
    found = _checked_start(problem, built, solver, objective)
    left = time_limit - (time.perf_counter() - begin)
    if status == cp_model.OPTIMAL and left > 0 and built.minimize_flops(objective, solver.Value(objective.byte_sum)):
        built.hint(built.solution(solver))
        work = max(FLOPS_WORK, FLOPS_SHARE * solver.deterministic_time)
        solver = _solver(left, workers)
        solver.parameters.max_deterministic_time = work
        if _run(solver, built) in SOLVED:
            found = _checked_start(problem, built, solver, objective)
    return status, found, bound


def _smallest_start(problem: SearchProblem, time_limit: float, workers: int, budget: int, level: str) -> list[_Start]:
    """When no known plan fits: the plan of the smallest peak, found by the memory-only model
    (no pair variables: it solves in a fraction of the priced model's time), as a start that
    fits; an `InfeasibleError` at once when that model proves nothing fits. (Measured: a 2-block
    stack on 8 devices under a budget below every plan's peak ran the priced model's whole
    60 s without a verdict; the memory-only model proved the smallest peak in 0.5 s.)"""
    peak, proven, choice = _smallest_peak_plan(problem, time_limit, workers, level)
    if peak is not None and peak > budget and proven:
        raise _infeasible_error(budget, level == "layers" and bool(share_layers(problem)[1]), peak, proven)
    return _starts(problem, [choice], budget) if peak is not None and peak <= budget else []


def _layered_start(problem: SearchProblem, starts: list[_Start], time_limit: float, workers: int, budget: int) -> list[_Start]:
    """The best plan whose repeated layers agree, as one more start for the exact model under a
    budget (measured on an 8-layer GPT: the exact model alone ends its time limit 60 % above what
    the layered one proves in 2 s); none when the graph repeats no layer or that solve fails."""
    if not share_layers(problem)[1]:
        return []
    try:
        layered = refine(problem, starts[0].choice, time_limit, workers, budget, coarsen_level="layers", explain=False,
                         starts=[start.choice for start in starts[1:]])
    except (InfeasibleError, SolverError):
        return []  # the exact model decides (and reports) infeasibility itself
    return _starts(problem, [layered.choice], budget)


def refine(problem: SearchProblem, hint: dict[str, int], time_limit: float = 60.0, workers: int = 0,
           max_device_memory: int | None = None, progress=None, coarsen_level: str = "exact",
           explain: bool = True, starts=()) -> RefineResult:
    """The CP-SAT optimum of `problem`, started from `hint` (the BFS choice) and the choices in
    `starts`; never worse than any of them that fits the budget (see the module docstring).

    The solver sees the problem coarsened at `coarsen_level` (see `coarsen`): "exact" keeps the
    optimum, "layers" finds the best plan whose repeated layers agree. With `max_device_memory`,
    the per-device peak (parameters plus live activations) must fit; `explain=False` skips the
    extra solve for the smallest achievable peak when none does. `time_limit` bounds all of it
    together: the extra starts' solves, the solve and the explanation. `progress(objective,
    bound, seconds)` is called at every improving solution.

    Example:
        >>> from autostrat.frontend import trace
        >>> from autostrat.models import MLP
        >>> from autostrat.nn import Tensor
        >>> from autostrat.search.problem import build_problem
        >>> from autostrat.search.propagate import data_parallel, propagate
        >>> net = MLP(layers=3, in_channels=64, hidden=256, out_channels=64)
        >>> problem = build_problem(trace(net, Tensor(shape=(64, 64)), device_num=8), 8)
        >>> bfs, around_seeds = propagate(problem).choice, data_parallel(problem, keep_seeds=True).choice
        >>> result = refine(problem, bfs, max_device_memory=200_000, starts=[around_seeds])
        >>> result.status, result.objective, result.bound
        ('OPTIMAL', 16384, 16384)
    """
    begin, budget = time.perf_counter(), max_device_memory
    deadline = begin + time_limit  # every solve below, and an explanation, within it

    def left(share: float = 1.0) -> float:
        return max(min(time_limit * share, deadline - time.perf_counter()), 0.0)

    known = _starts(problem, [hint, *starts], budget)
    if coarsen_level == "exact" and budget is not None:
        known += _layered_start(problem, known, left(0.5), workers, budget)
    if budget is not None and not _fitting(known, budget):
        known += _smallest_start(problem, left(SMALLEST_SHARE), workers, budget, coarsen_level)
    coarse = coarsen(problem, coarsen_level, budget=budget is not None)
    built = SolverModel(problem, coarse)
    built.limit_memory(budget)
    objective = built.minimize_bytes()
    built.hint(coarse.coarse_hint(_hint_start(known, budget).choice))
    status, found, bound = _solve(problem, built, objective, left(), workers, progress)
    candidates = ([found] if found is not None else []) + _fitting(known, budget)
    if not candidates:
        raise _no_plan(problem, status, known, budget, time_limit, left(), workers, bool(coarse.shared_layers), explain)
    best = min(candidates, key=lambda s: s.bytes)  # the solver's plan on ties: its flops are ordered
    bound = min(bound, best.bytes)
    return RefineResult(best.choice, best.bytes, bound, "OPTIMAL" if bound == best.bytes else "FEASIBLE",
                        time.perf_counter() - begin, known[0].bytes, coarsening=coarse.summary(), space=candidate_space(problem),
                        exact=not coarse.shared_layers, merged=tuple(e.owner for e in coarse.eliminated))
