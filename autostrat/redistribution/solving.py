"""The searches under `planner`: two layouts of one tensor refined to one search problem over
prime axes (`build_problem`), and its solution as a path (`solve_path`), bytes (`solve_cost`)
or nanoseconds (`solve_time`), each memoised, with the constructive plan answering a search
stopped at its state limit (never one that ran out of states: that is a bug, raised).
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import NamedTuple

from autostrat.errors import RedistributionError
from autostrat.layout import DeviceMatrix, Layout
from autostrat.redistribution.constructive import constructive_path
from autostrat.redistribution.dim_class import dim_class, original_path
from autostrat.redistribution.layers import Problem, space_of, state_of
from autostrat.redistribution.paths import merged_units
from autostrat.redistribution.refine import common_matrix, prime_matrix, refine_layout
from autostrat.redistribution.search import cost_search, search


COARSE_FIRST_ABOVE = 6  # prime axes (64 devices of powers of 2) up to which plans search them at once


def check_pair(src: Layout, dst: Layout) -> None:
    problem = None
    if src.device_num != dst.device_num:
        problem = f"device_num {src.device_num} != {dst.device_num}"
    elif math.prod(src.shape) != math.prod(dst.shape):
        problem = (
            f"shapes {list(src.shape)} and {list(dst.shape)} differ in element count "
            f"({math.prod(src.shape)} != {math.prod(dst.shape)}), so no Reshape joins them"
        )
    if problem:
        raise RedistributionError(f"cannot redistribute {src} to {dst}: {problem}")


def build_problem(src: Layout, dst: Layout, itemsize: int) -> tuple[Problem, tuple, tuple]:
    """The search problem, start node and target node of two normalised layouts."""
    op = src.partial_op if src.partial else dst.partial_op
    matrix = common_prime_matrix(src.device_matrix, dst.device_matrix)
    if matrix is not None:
        (space, first), (_, second) = refined(src, matrix, itemsize), refined(dst, matrix, itemsize)
        return Problem((space,), op), (0, first), (0, second)
    (first_space, first), (second_space, second) = refined(src, None, itemsize), refined(dst, None, itemsize)
    return Problem((first_space, second_space), op), (0, first), (1, second)


@lru_cache(maxsize=1024)
def common_prime_matrix(first: DeviceMatrix, second: DeviceMatrix) -> DeviceMatrix | None:
    # Prime axes: a step may need part of a composite axis ([2, 4] -> [8] moves half of the
    # 4-axis), and the brute-force oracle finds such plans strictly cheaper.
    matrix = common_matrix(first, second)
    if matrix is None:
        matrix = common_matrix(prime_matrix(first), prime_matrix(second))
    return None if matrix is None else prime_matrix(matrix)


@lru_cache(maxsize=4096)
def refined(layout: Layout, matrix: DeviceMatrix | None, itemsize: int) -> tuple:
    """``(space, state)`` of `layout` over `matrix`, or over its own prime refinement when None
    (memoised: a table's rows and columns meet each layout once per other side)."""
    refined = refine_layout(layout, prime_matrix(layout.device_matrix) if matrix is None else matrix)
    return space_of(refined, itemsize), state_of(refined)


class Cut(NamedTuple):
    """A search stopped at its `limit` settled nodes (below `search.SETTLED_LIMIT`), unfinished:
    `least`, a lower bound of the optimum's objective (`Search.least`), and the cheapest path to
    the target it had reached (``()`` at an infinite objective if none): ``path``, the bytes
    ``sent`` and its ``objective``."""

    least: int
    path: tuple
    sent: int
    objective: float


def solve_path(problem: Problem, start, target, model, limit: int | None = None) -> tuple[tuple, int, bool] | Cut:
    """``(path, bytes, exhaustive)`` from `start` to a reachable `target`; a `Cut` when a `limit`
    below `search.SETTLED_LIMIT` stopped the search. Under a time `model` it is searched over
    their dim class (`dim_class`) and put back on the original dims: a time table prices the
    plan itself (`algorithms.algorithm_time`), so pairs of one class share its search. In bytes
    the table's price is `solve_cost`'s, the optimum whichever tie a path takes, and the path
    keeps the tie its own dims give (plans and their dumps as before the classes).

    Beyond `COARSE_FIRST_ABOVE` prime axes (by bytes) the path is the cost search's
    (`cost_search`), taken back to real states: kept up to the larger group of relabellings, it
    settles a fraction of the states (4 096 devices: 17 ms against 700 ms), with one axis per
    gather or scatter."""
    if model is None:
        return _over_class(_class_path, problem, start, target, model, limit, classed=False)[1]
    found, solution = _over_class(_class_path, problem, start, target, model, limit)
    return solution._replace(path=original_path(found, solution.path)) if isinstance(solution, Cut) else \
        (original_path(found, solution[0]), *solution[1:])


@lru_cache(maxsize=4096)
def _class_path(problem: Problem, start, target, model, limit: int | None) -> tuple[tuple, int, bool] | Cut:
    if model is None and len(problem.spaces) == 1 and len(problem.spaces[0].sizes) > COARSE_FIRST_ABOVE:
        found, reached = cost_search(problem, start, target, model)
        if reached is not None:
            return tuple(merged_units(found.path(reached))), found.best[reached][2], True
    found, reached = search(problem, start, target, model, limit=limit)
    if reached is not None:
        return tuple(found.path(reached)), found.best[reached][2], True
    return _cut(found) if found.cut else _fallback(problem, start, target, found)


def solve_cost(problem: Problem, start, target, model, bound: float = math.inf) -> tuple[tuple, int, bool]:
    """`solve_path` with an empty path: cost tables need only the bytes, and building the path is
    a tenth of a search; the search may then use the source's symmetry (`cost_search`), and
    keep only states within `bound`, the bytes of a plan known (`planner._coarse_bound`)."""
    return _over_class(_class_cost, problem, start, target, model, bound)[1]


@lru_cache(maxsize=1 << 15)
def _class_cost(problem: Problem, start, target, model, bound: float) -> tuple[tuple, int, bool]:
    found, reached = cost_search(problem, start, target, model, bound)
    if reached is not None:
        return (), found.best[reached][2], True
    return (), _fallback(problem, start, target, found)[1], False


def solve_time(problem: Problem, start, target, model, limit: int | None = None) -> int | Cut:
    """Nanoseconds of the fastest path under `model`: the search's objective, which times every
    move as its step will be (`_timed_permutes` keeps real axes); the constructive fallback's
    moves timed alike; a `Cut` (its path left out) when a `limit` below `search.SETTLED_LIMIT`
    stopped the search."""
    return _over_class(_class_time, problem, start, target, model, limit)[1]


@lru_cache(maxsize=1 << 15)
def _class_time(problem: Problem, start, target, model, limit: int | None) -> int | Cut:
    found, reached = search(problem, start, target, model, limit=limit)
    if reached is not None:
        return found.best[reached][0]
    if found.cut:
        return _cut(found)._replace(path=())
    _check_not_exhausted(problem, start, target, found)
    path = constructive_path(problem, start, target)
    return sum(model.step_nanoseconds(move.kind, problem.matrix(node[0]), move.axes, move.bytes) for node, move, _ in path)


def _cut(found) -> Cut:
    reached = found.reached_best()
    if reached is None:
        return Cut(found.least, (), 0, math.inf)
    return Cut(found.least, tuple(found.path(reached)), found.best[reached][2], found.best[reached][0])


def _fallback(problem: Problem, start, target, found) -> tuple[tuple, int, bool]:
    """The constructive plan, marked not proven minimal: the search `found` stopped at its
    state limit. It never runs out of states first, since every pair has a plan (the
    constructive plan is one of its paths); if it ever did, that is a bug, raised, not a
    candidate dropped."""
    _check_not_exhausted(problem, start, target, found)
    path = constructive_path(problem, start, target)
    return tuple(path), sum(move.bytes for _, move, _ in path), False


class _OutOfStates(AssertionError):
    """A search that ran out of states before its target: a bug (`_fallback`), named by `_over_class`."""


def _check_not_exhausted(problem: Problem, start, target, found) -> None:
    if found.exhausted:
        raise _OutOfStates()


def _over_class(solve, problem: Problem, start, target, *args, classed: bool = True) -> tuple:
    """``(class, solution)``: `solve` run on the dim class of the search (`dim_class`), or with
    `classed` False on the search itself (class None); a search out of states is raised naming
    the caller's layouts, not the class's."""
    found = dim_class(problem, start, target) if classed else None
    try:
        if found is None:
            return None, solve(problem, start, target, *args)
        return found, solve(found.problem, found.start, found.target, *args)
    except _OutOfStates:
        raise AssertionError(f"the search from {problem.layout(start)} ran out of states before {problem.layout(target)}") from None


def solve_layouts(src: Layout, dst: Layout, itemsize: int, model, solve=solve_path):
    """`solve` (`solve_path` unless told) between two layouts of one tensor on one cluster, normalised
    and refined to one problem (`build_problem`): ``(problem, solution)``."""
    check_pair(src, dst)
    problem, start, target = build_problem(src.normalized(), dst.normalized(), itemsize)
    return problem, solve(problem, start, target, model)
