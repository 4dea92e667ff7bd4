"""Global refinement with OR-Tools CP-SAT: the optimum of the same cost model BFS uses.

`refine` starts from known plans: the BFS plan, the data-parallel plan around the seeds, any
other the caller adds (`starts`) and, at coarsening "exact" on a graph of repeated layers, the
best plan whose layers agree (the "layers" model solved first). The solver is hinted the start with the fewest bytes among those
that fit the memory budget (if none fits, the one with the smallest peak), and the result is the
best plan known when it stops, with a proven bound on the bytes:

- proven: the solver's plan, OPTIMAL, its bound equal to its bytes;
- the time limit struck: the best of the solver's plan and the starts that fit the budget,
  FEASIBLE, with the solver's best bound and the gap to it; also when the solver found nothing
  itself: a start that fits is a plan, never an error;
- no known plan fits: `InfeasibleError` when CP-SAT proved that no plan fits (with the smallest
  achievable peak), else `SolverError` saying that the time limit struck first and what to try;
- the time limit struck before the solve (`deadline`: pricing the cost tables, coarsening and
  building the model check it as they go): the best start that fits, FEASIBLE with bound 0 and
  a `stopped` line naming the phase; `SolverError` as above when none fits.

The model is `cpsat.SolverModel` over the coarsened problem (`coarsen`), solved for bytes; once
they are proven, plans of those bytes are ordered by flops within a bounded share of the work
(`FLOPS_SHARE`), so the flops are the fewest found, not always proven fewest. The solver's plan
is expanded back to every op and its bytes are checked against the plan's.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from ortools.sat.python import cp_model

from autostrat.errors import AutostratError, InfeasibleError, SolverError
from autostrat.search.coarsen import coarsen, share_layers
from autostrat.search.cpsat import Objective, SolverModel
from autostrat.search.deadline import Deadline, TimeRanOut
from autostrat.search.memory import peak_bytes, tensor_bytes
from autostrat.search.problem import SearchProblem
from autostrat.search.solver_run import new_solver, run

SOLVED = (cp_model.OPTIMAL, cp_model.FEASIBLE)
# Ordering plans of the proven bytes by flops gets this share of the work proving the bytes took,
# at least `FLOPS_WORK` (CP-SAT's deterministic time, not seconds: on a loaded machine the same
# problem still gets the same plan). Proving the flops too took twice the bytes' work on an
# 8-layer training step.
FLOPS_SHARE, FLOPS_WORK = 0.25, 1.0
# When no start fits the budget, the memory-only model may take this share of the time limit to
# find one that does (or prove that none can).
SMALLEST_SHARE = 0.25
SMALLEST = "the plan of the smallest peak (a start that fits the budget)"


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
    stopped: str = ""  # when the time ran out before the solve: in which phase (the plan is then a start)
    solver: str = "CP-SAT"  # which refinement found it (`refine`, or the IOPDDL solver: `solve.refinement`)

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
    try:
        peak, proven, _ = _smallest_peak_plan(problem, Deadline(time_limit), workers, level)
    except TimeRanOut:
        return None, False
    return peak, proven


def _smallest_peak_plan(problem: SearchProblem, deadline: Deadline, workers: int, level: str):
    """(smallest peak found, whether proven, its choice), or (None, False, None) when the
    solve found none; `TimeRanOut` when `deadline` passes while the model is built."""
    # Pruning keeps a candidate no smaller in any tensor, and merging only ops of constant
    # memory: the smallest peak of the coarse model is the problem's.
    built = SolverModel(problem, coarsen(problem, level, budget=True, deadline=deadline), priced=False, deadline=deadline)
    resident, activations = tensor_bytes(problem)
    peak = built.model.NewIntVar(0, sum(max(item.bytes) for item in resident + activations), "peak")
    for expression in built.memory():
        built.model.Add(peak >= expression)
    built.model.Minimize(peak)
    deadline.check("bounding the peak in the memory-only model")
    solver = new_solver(deadline.left(), workers)
    status = run(solver, built)
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


def _infeasible(problem: SearchProblem, budget: int, deadline: Deadline, workers: int, layered: bool) -> InfeasibleError:
    """Why nothing fits `budget`: the smallest peak, if found before `deadline`."""
    try:
        peak, proven, _ = _smallest_peak_plan(problem, deadline, workers, "layers" if layered else "exact")
    except TimeRanOut:
        peak, proven = None, False
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


def _no_plan(problem: SearchProblem, status: int, starts: list[_Start], budget: int, deadline: Deadline, workers: int,
             layered: bool, explain: bool) -> AutostratError:
    """Why no plan is returned: proven infeasible (explained before `deadline`), or the time
    limit struck before anything fit."""
    if status == cp_model.INFEASIBLE:
        if not explain:
            return InfeasibleError(f"no plan fits max_device_memory = {int(budget):,} bytes per device")
        return _infeasible(problem, budget, deadline, workers, layered)
    return _time_ran_out(starts, budget, f"CP-SAT found no plan within the time limit ({deadline.limit:g} s) and did not "
                                         f"prove that none fits")


def _time_ran_out(starts: list[_Start], budget: int, what: str) -> SolverError:
    """No known plan fits `budget` when the time limit struck (`what` happened), and what to try."""
    smallest = min(start.peak for start in starts)
    return SolverError(
        f"{what} max_device_memory = {int(budget):,} bytes per device; the smallest peak of the starts is {smallest:,} bytes. "
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
    solver = new_solver(time_limit, workers)
    status = run(solver, built, _Progress(progress, objective, begin) if progress else None)
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
        solver = new_solver(left, workers)
        solver.parameters.max_deterministic_time = work
        if run(solver, built) in SOLVED:
            found = _checked_start(problem, built, solver, objective)
    return status, found, bound


def _smallest_start(problem: SearchProblem, deadline: Deadline, workers: int, budget: int, level: str) -> list[_Start]:
    """When no known plan fits: the plan of the smallest peak, found by the memory-only model
    (no pair variables: it solves in a fraction of the priced model's time) within
    `SMALLEST_SHARE` of the time limit, as a start that fits; an `InfeasibleError` at once when
    that model proves nothing fits. (Measured: a 2-block stack on 8 devices under a budget below
    every plan's peak ran the priced model's whole 60 s without a verdict; the memory-only model
    proved the smallest peak in 0.5 s.)"""
    share = deadline.within(SMALLEST_SHARE)
    try:
        peak, proven, choice = _smallest_peak_plan(problem, share, workers, level)
    except TimeRanOut as stop:
        deadline.check(f"{stop.phase} for {SMALLEST}")  # or only its share ran out: the priced model may find one
        return []
    if peak is not None and peak > budget and proven:
        raise _infeasible_error(budget, level == "layers" and bool(share_layers(problem)[1]), peak, proven)
    return _starts(problem, [choice], budget) if peak is not None and peak <= budget else []


def _layered_start(problem: SearchProblem, starts: list[_Start], deadline: Deadline, workers: int,
                   budget: int | None) -> list[_Start]:
    """The best plan whose repeated layers agree, found within half the time limit, as one more
    start for the exact model (a tied plan is an untied one, so the exact refinement is never
    worse than it; measured on an 8-layer GPT under a budget: the exact model alone ends its time
    limit 60 % above what the layered one proves in 2 s; on the 7B-shaped step at 64 devices
    without one, 54.49 GB after 120 s against the layered optimum's 20.20 GB); none when the
    graph repeats no layer or that solve fails."""
    if not share_layers(problem)[1]:
        return []
    try:
        layered = _refine(problem, list(starts), deadline.within(0.5), workers, budget, None, "layers", False)
    except (InfeasibleError, SolverError):
        return []  # the exact model decides (and reports) infeasibility itself
    except TimeRanOut as stop:
        deadline.check(f"{stop.phase} for the start whose repeated layers agree")  # only its half ran out?
        return []
    return _starts(problem, [layered.choice], budget)


def refine(problem: SearchProblem, hint: dict[str, int], time_limit: float = 60.0, workers: int = 0,
           max_device_memory: int | None = None, progress=None, coarsen_level: str = "exact",
           explain: bool = True, starts=(), deadline: Deadline | None = None) -> RefineResult:
    """The CP-SAT optimum of `problem`, started from `hint` (the BFS choice) and the choices in
    `starts`; never worse than any of them that fits the budget (see the module docstring).

    The solver sees the problem coarsened at `coarsen_level` (see `coarsen`): "exact" keeps the
    optimum (starting from the "layers" plan, solved within half the time), "layers" finds the
    best plan whose repeated layers agree. With `max_device_memory`,
    the per-device peak (parameters plus live activations) must fit; `explain=False` skips the
    extra solve for the smallest achievable peak when none does. `time_limit` (or `deadline`,
    a clock the caller started: `search` shares one among its solves) bounds all of it together:
    pricing the cost tables, coarsening, building the model, the extra starts' solves, the
    solve and the explanation. When it passes before the solve, the result is the best start
    that fits, FEASIBLE with bound 0, and `stopped` says in which phase the time ran out.
    `progress(objective, bound, seconds)` is called at every improving solution.

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
        >>> stopped = refine(problem, bfs, time_limit=0)  # no time at all: the BFS plan, not refined
        >>> stopped.choice == bfs, stopped.status, stopped.stopped
        (True, 'FEASIBLE', 'the time limit (0 s) ran out while pricing the starts: the plan is the best start, not refined')
    """
    deadline = deadline or Deadline(time_limit)
    known = _starts(problem, [hint, *starts], max_device_memory)
    try:
        deadline.check("pricing the starts")
        return _refine(problem, known, deadline, workers, max_device_memory, progress, coarsen_level, explain)
    except TimeRanOut as stop:
        return _stopped(problem, known, max_device_memory, deadline, stop.phase)


def _stopped(problem: SearchProblem, known: list[_Start], budget: int | None, deadline: Deadline, phase: str) -> RefineResult:
    """The best known start that fits `budget` when the time ran out during `phase`, before any
    solve: nothing is proven (bound 0); a `SolverError` when no start fits."""
    fitting = _fitting(known, budget)
    if not fitting:
        raise _time_ran_out(known, budget, f"the time limit ({deadline.limit:g} s) ran out while {phase}: no plan was "
                                           f"found, nor proven impossible, that fits")
    best = min(fitting, key=lambda s: s.bytes)
    note = f"the time limit ({deadline.limit:g} s) ran out while {phase}: the plan is the best start, not refined"
    return RefineResult(best.choice, best.bytes, 0, "FEASIBLE", deadline.elapsed(), known[0].bytes,
                        space=candidate_space(problem), stopped=note)


def _refine(problem: SearchProblem, known: list[_Start], deadline: Deadline, workers: int, budget: int | None, progress,
            coarsen_level: str, explain: bool) -> RefineResult:
    """`refine` from the `known` starts (which the extra starts join, for `_stopped` to choose
    from should the time run out); `TimeRanOut` when `deadline` passes before the solve."""
    if coarsen_level == "exact":
        known += _layered_start(problem, known, deadline, workers, budget)
    if budget is not None and not _fitting(known, budget):
        known += _smallest_start(problem, deadline, workers, budget, coarsen_level)
    coarse = coarsen(problem, coarsen_level, budget=budget is not None, deadline=deadline)
    built = SolverModel(problem, coarse, deadline=deadline)
    built.limit_memory(budget)
    objective = built.minimize_bytes()
    built.hint(coarse.coarse_hint(_hint_start(known, budget).choice))
    deadline.check("adding the memory budget and the hint to the CP-SAT model")
    status, found, bound = _solve(problem, built, objective, deadline.left(), workers, progress)
    candidates = ([found] if found is not None else []) + _fitting(known, budget)
    if not candidates:
        raise _no_plan(problem, status, known, budget, deadline, workers, bool(coarse.shared_layers), explain)
    best = min(candidates, key=lambda s: s.bytes)  # the solver's plan on ties: its flops are ordered
    bound = min(bound, best.bytes)
    return RefineResult(best.choice, best.bytes, bound, "OPTIMAL" if bound == best.bytes else "FEASIBLE",
                        deadline.elapsed(), known[0].bytes, coarsening=coarse.summary(), space=candidate_space(problem),
                        exact=not coarse.shared_layers, merged=tuple(e.owner for e in coarse.eliminated))
