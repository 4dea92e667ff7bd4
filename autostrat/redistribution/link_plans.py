"""Link plans: what a timed search answers past `search.TIMED_BUDGET` settled nodes, a plan
bounded by the search instead of proven by it.

A search under a time model has that budget when the layouts and the model's links (inside a
server, across servers) meet on fewer axes than the prime ones (`link_matrix`): every pair it
settles within it is proven optimal, as `planner` says. Past it the plan is the faster of the
path the search had reached and the link plan, the fastest over those coarser axes
(`_link_solution`), a plan over the prime axes too; it is marked not exhaustive and carries
``least``, the largest key the search settled, below which no plan exists
(`solving.Cut`), so it is at most ``time / least`` times the optimum (its text says
``fastest >= least ns``). Measured: on every pair of [8, 4] layouts over 2 servers of 4 with a
budget of one node, at most 2.5 times the optimum (a reorder on the 8-device axis that the link
plan moves whole; tests/test_redistribution_budget.py); the 7B row of `benchmarks/quality.py`
refined for time (400 s limit), at the shipped budget: 21 of its searches stop at the budget
(exact, they took 33.5 of its 51.9 s of pricing), 33 of its 1 821 priced pairs differ from the
exact price, by at most 9.3 %, and the plan found is the same (631.836 ms, OPTIMAL over those
prices).
"""

from __future__ import annotations

from autostrat.layout import DeviceMatrix, Layout
from autostrat.redistribution import search
from autostrat.redistribution.layers import Problem
from autostrat.redistribution.refine import common_matrix, prime_matrix
from autostrat.redistribution.solving import Cut, refined, solve_layouts, solve_path, solve_time


def timed_objective(src: Layout, dst: Layout, itemsize: int, model) -> int:
    """Nanoseconds of `timed_solution`'s plan (ring prices), without building it unless the
    search stops at its budget."""
    if link_matrix(src, dst, model) is None:
        return solve_layouts(src, dst, itemsize, model, solve_time)[1]
    found = solve_layouts(src, dst, itemsize, model, _budgeted(solve_time))[1]
    if not isinstance(found, Cut):
        return found
    return int(min(found.objective, _link_solution(src, dst, itemsize, model)[2]))


def timed_solution(src: Layout, dst: Layout, itemsize: int, model) -> tuple:
    """``(problem, (path, bytes, exhaustive), least)``: the plan of the search over prime axes;
    under a time `model`, when that search settles `search.TIMED_BUDGET` nodes unfinished and
    the link matrix has fewer axes (`link_matrix`), the faster of the path it had reached and
    the link plan (`_link_solution`), with ``least``, the search's lower bound of the optimum
    (else None)."""
    if model is None or link_matrix(src, dst, model) is None:
        return (*solve_layouts(src, dst, itemsize, model), None)
    problem, found = solve_layouts(src, dst, itemsize, model, _budgeted(solve_path))
    if not isinstance(found, Cut):
        return problem, found, None
    link_problem, solution, nanoseconds = _link_solution(src, dst, itemsize, model)
    if found.objective < nanoseconds:
        return problem, (found.path, found.sent, False), found.least
    return link_problem, solution, found.least


def _budgeted(solve):
    """`solve` (`solve_path` or `solve_time`) stopped at `search.TIMED_BUDGET` settled nodes."""
    def budgeted(problem, start, target, model):
        return solve(problem, start, target, model, search.TIMED_BUDGET)
    return budgeted


def link_matrix(src: Layout, dst: Layout, model) -> DeviceMatrix | None:
    """The coarsest device matrix refining both layouts' and `model`'s (whose axes are its links:
    inside a server, across servers), when it has fewer axes than its prime refinement; else None.

    Example (8 servers of 8: a split over 64 devices and one over 8 x 8 meet on the servers' axes):
        >>> from autostrat.cost import Hardware
        >>> from autostrat.layout import TensorMap
        >>> whole = Layout(DeviceMatrix((64,)), TensorMap((0,)), (64,))
        >>> link_matrix(whole, Layout(DeviceMatrix((8, 8)), TensorMap((1,)), (64,)), Hardware().alpha_beta(64))
        DeviceMatrix(shape=(8, 8))
    """
    if model is None or model.device_matrix.device_num != src.device_num:
        return None
    matrix = common_matrix(src.normalized().device_matrix, dst.normalized().device_matrix)
    matrix = None if matrix is None else common_matrix(matrix, model.device_matrix)
    return matrix if matrix is not None and matrix.ndim < prime_matrix(matrix).ndim else None


def _link_solution(src: Layout, dst: Layout, itemsize: int, model) -> tuple:
    """``(problem, (path, bytes, False), nanoseconds)``: the fastest plan over `link_matrix`,
    whose axes move whole (a plan over prime axes too, so never faster than the optimum)."""
    src, dst = src.normalized(), dst.normalized()
    matrix = link_matrix(src, dst, model)
    (space, first), (_, second) = refined(src, matrix, itemsize), refined(dst, matrix, itemsize)
    problem = Problem((space,), src.partial_op if src.partial else dst.partial_op)
    path, sent, _ = solve_path(problem, (0, first), (0, second), model)
    nanoseconds = sum(model.step_nanoseconds(move.kind, problem.matrix(node[0]), move.axes, move.bytes) for node, move, _ in path)
    return problem, (path, sent, False), nanoseconds
