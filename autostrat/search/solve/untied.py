"""The refinement at coarsening "exact" (no layer tying): CP-SAT, then, when it proves nothing,
the IOPDDL solver's moves from CP-SAT's plan.

1. `refine.refine` at "exact" until `CPSAT_SHARE` of the time limit. On a graph of repeated
   layers it first solves the model whose repeated layers agree (within half the limit) and
   starts from its plan: a tied plan is one of the untied problem, so the result is never worse
   than what the tied model finds. CP-SAT's bound on the untied model holds for every plan.
2. Unless that is proven optimal, the IOPDDL solver (`refinement.refine_by_solver`) on the
   untied instance for the time left, started from step 1's plan. It returns the cheapest of
   its plan and its starts under the problem's exact cost, so never worse than step 1.

Every cost is the problem's own (`problem.cost(choice, shared=True)`, the peak by
`memory.peak_bytes`): the result is the cheaper of the two steps' plans; its bound is the higher
of their bounds (CP-SAT's; the solver's, or under shared readers the relaxed instance's:
`refinement`), both lower bounds on the same untied optimum, and its status OPTIMAL only when the plan reaches it.

Measured on the 7B-shaped training step at 64 devices (`benchmarks/coarsen_exact.py`, bytes, 2
cores shared with other work, load 12-13): BFS 52.57 GB per device; the tied model 20.20 GB,
proven optimal among tied plans in 119.5 s; this refinement within 60 s 6.25 GB, bound 0.93 GB
(the solver's plan), where CP-SAT alone on the untied model (before this module) kept the BFS plan within its 60 s.
"""

from __future__ import annotations

from dataclasses import replace

from autostrat.search.deadline import Deadline
from autostrat.search.problem import SearchProblem
from autostrat.search.refine import RefineResult, refine
from autostrat.search.solve.refinement import SOLVER, refine_by_solver

# CP-SAT's share of the time limit (the tied model's solve the first half of it); the solver has
# the rest. The 7B step's tied model finds its best plan within 8 s (load 4), the untied CP-SAT
# model is built in 7 s; the solver improves most in its first tens of seconds.
CPSAT_SHARE = 2 / 3


def refine_untied(problem: SearchProblem, hint: dict[str, int], time_limit: float = 60.0, workers: int = 0,
                  max_device_memory: int | None = None, progress=None, explain: bool = True, starts=(),
                  deadline: Deadline | None = None, rounds: int | None = None) -> RefineResult:
    """The refinement of `hint` (the BFS choice) and `starts` at coarsening "exact" (see the
    module docstring), within `time_limit` (or `deadline`); `rounds` bounds the solver's rounds
    (None: its time alone). The arguments are `refine.refine`'s; errors are its errors.

    Example:
        >>> from autostrat.frontend import trace
        >>> from autostrat.models import MLP
        >>> from autostrat.nn import Tensor
        >>> from autostrat.search.problem import build_problem
        >>> from autostrat.search.propagate import propagate
        >>> net = MLP(layers=3, in_channels=64, hidden=256, out_channels=64)
        >>> problem = build_problem(trace(net, Tensor(shape=(64, 64)), device_num=8), 8)
        >>> result = refine_untied(problem, propagate(problem).choice, max_device_memory=200_000)
        >>> result.status, result.objective, result.bound, result.solver  # proven by CP-SAT: no solver step
        ('OPTIMAL', 16384, 16384, 'CP-SAT')
    """
    deadline = deadline or Deadline(time_limit)
    # the same limit and start, ending earlier: what stops names the whole limit
    share = deadline.reserving((1 - CPSAT_SHARE) * deadline.limit)
    first = refine(problem, hint, workers=workers, max_device_memory=max_device_memory, progress=progress,
                   coarsen_level="exact", explain=explain, starts=starts, deadline=share)
    if first.status == "OPTIMAL" or deadline.passed():
        return replace(first, seconds=deadline.elapsed())
    second = refine_by_solver(problem, first.choice, workers=workers, max_device_memory=max_device_memory,
                              progress=progress, starts=starts, deadline=deadline, rounds=rounds)
    best = second if second.objective < first.objective else first  # CP-SAT's on ties: its flops are ordered
    bound = min(max(first.bound, second.bound), best.objective)
    return replace(first, choice=best.choice, objective=best.objective, bound=bound,
                   status="OPTIMAL" if bound == best.objective else "FEASIBLE", seconds=deadline.elapsed(),
                   stopped=best.stopped, solver=best.solver,
                   coarsening=f"{first.coarsening}; then {SOLVER}: {second.coarsening}")
