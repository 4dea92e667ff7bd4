"""`refine="solve"`: the IOPDDL solver (`solver.solve`) on the problem's instance (`convert`),
for graphs too large for CP-SAT to prove.

It starts from the cheapest known plan that fits the budget (the BFS plan and the caller's
`starts`), runs within what the search's deadline leaves, and returns the cheapest of its plan
and the starts under the problem's exact cost (`problem.cost(choice, shared=True)`) whose peak
(`memory.peak_bytes`) fits: never worse than a start that fits. Its status is FEASIBLE (it proves
nothing); its bound is the solver's lower bound when the instance's cost is the exact one
(`convert.shares_nothing`), else the spanning-forest bound of the relaxed instance (readers of a
tensor sharing its tables, the memory limit dropped: `convert`), computed before the solve; 0
when the time runs out first.
"""

from __future__ import annotations

import math
from dataclasses import replace

from autostrat.errors import SolverError
from autostrat.search.deadline import Deadline, TimeRanOut
from autostrat.search.problem import SearchProblem
from autostrat.search.refine import RefineResult, _fitting, _hint_start, _starts, _stopped, candidate_space
from autostrat.search.solve.arrays import Arrays
from autostrat.search.solve.bound import lower_bound
from autostrat.search.solve.convert import shares_nothing, to_instance
from autostrat.search.solve.instance import FORBIDDEN
from autostrat.search.solve.solver import solve

SOLVER = "the IOPDDL solver"
# The solver's bound is a float sum: a relative error this large is not taken as proof.
ROUNDING = 1e-9


def refine_by_solver(problem: SearchProblem, hint: dict[str, int], time_limit: float = 60.0, workers: int = 1,
                     max_device_memory: int | None = None, progress=None, starts=(), deadline: Deadline | None = None,
                     rounds: int | None = None) -> RefineResult:
    """The solver's plan for `problem` from `hint` (the BFS choice) and `starts`, within
    `time_limit` (or `deadline`) and, with `rounds`, after at most that many of the solver's
    rounds; `workers` searches (at least 1). `progress(cost, bound, seconds)` is called as the
    solver improves (its pairwise cost, see `convert`).

    Example:
        >>> from autostrat.frontend import trace
        >>> from autostrat.models import MLP
        >>> from autostrat.nn import Tensor
        >>> from autostrat.search.problem import build_problem
        >>> from autostrat.search.propagate import propagate
        >>> net = MLP(layers=3, in_channels=64, hidden=256, out_channels=64)
        >>> problem = build_problem(trace(net, Tensor(shape=(64, 64)), device_num=8), 8)
        >>> result = refine_by_solver(problem, propagate(problem).choice, max_device_memory=200_000, rounds=20)
        >>> result.status, result.objective, 0 < result.bound <= result.objective  # CP-SAT proves 16384 optimal
        ('FEASIBLE', 16384, True)
    """
    deadline = deadline or Deadline(time_limit)
    known = _starts(problem, [hint, *starts], max_device_memory)
    try:
        converted = to_instance(problem, max_device_memory, deadline)
        deadline.check("building the solver's instance")
    except TimeRanOut as stop:
        return replace(_stopped(problem, known, max_device_memory, deadline, stop.phase), solver=SOLVER)
    exact = shares_nothing(problem)  # else the solver's bound is none on the shared cost: the relaxed one
    relaxed_bound = 0.0 if exact else _relaxed_bound(problem, deadline)
    initial = converted.solution(_hint_start(known, max_device_memory).choice)
    report = None if progress is None else (lambda cost, bound, seconds: progress(int(cost), int(bound), seconds))
    result = solve(converted.instance, deadline.left(), progress=report, rounds=rounds, workers=max(workers, 1),
                   initial=initial)
    # A solution of forbidden cost (the least-memory fallback may take unreachable pairs) is no plan.
    solved = bool(result.solution) and result.cost < FORBIDDEN
    found = _starts(problem, [converted.choice(result.solution)], max_device_memory) if solved else []
    candidates = _fitting(known, max_device_memory) + _fitting(found, max_device_memory)
    if not candidates:
        raise SolverError(f"{SOLVER} found no plan within the time limit ({deadline.limit:g} s) that fits "
                          f"max_device_memory = {int(max_device_memory):,} bytes per device; the smallest peak it found is "
                          f"{int(result.peak):,} bytes (not proven smallest). Refine 'cpsat' proves whether a plan fits")
    best = min(candidates, key=lambda s: s.bytes)  # a start on ties: it changes fewer ops
    bound = min(_exact_bound(problem, result.bound if exact else relaxed_bound), best.bytes)
    summary = (f"{result.rounds} rounds on {converted.instance.node_count} nodes "
               f"({converted.memory_nodes} of memory), no coarsening")
    return RefineResult(best.choice, best.bytes, bound, "FEASIBLE", deadline.elapsed(), known[0].bytes,
                        coarsening=summary, space=candidate_space(problem), solver=SOLVER)


def _relaxed_bound(problem: SearchProblem, deadline: Deadline) -> float:
    """A lower bound on `problem.cost(choice, shared=True)` of every choice: the relaxed
    instance's (`convert.to_instance`) spanning-forest bound without its memory limit; 0 when
    `deadline` passes while the instance is built."""
    try:
        relaxed = to_instance(problem, None, deadline, relaxed=True)
        deadline.check("building the relaxed instance for the bound")
    except TimeRanOut:
        return 0.0
    return lower_bound(Arrays(relaxed.instance))


def _exact_bound(problem: SearchProblem, bound: float) -> int:
    """A lower bound on the exact cost (from the exact or the relaxed instance) as an integer
    one (`problem.cost`), or 0 when it is not a positive number."""
    if not math.isfinite(bound) or bound <= 0:
        return 0
    bound -= ROUNDING * bound
    # Bytes are integers, so a bound rounds up; nanoseconds are floats `problem.cost` truncates.
    return math.ceil(bound) if problem.model is None else math.floor(bound)

