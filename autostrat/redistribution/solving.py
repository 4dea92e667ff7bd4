"""The searches under `planner`: two layouts of one tensor refined to one search problem over
prime axes (`build_problem`), and its solution as a path (`solve_path`), bytes (`solve_cost`)
or nanoseconds (`solve_time`), each memoised, with the constructive plan answering a search
stopped at its state limit (never one that ran out of states: that is a bug, raised).
"""

from __future__ import annotations

import math
from functools import lru_cache

from autostrat.errors import RedistributionError
from autostrat.layout import DeviceMatrix, Layout
from autostrat.redistribution.constructive import constructive_path
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


@lru_cache(maxsize=4096)
def solve_path(problem: Problem, start, target, model) -> tuple[tuple, int, bool]:
    """``(path, bytes, exhaustive)`` from `start` to a reachable `target`.

    Beyond `COARSE_FIRST_ABOVE` prime axes (by bytes) the path is the cost search's
    (`cost_search`), taken back to real states: kept up to the larger group of relabellings, it
    settles a fraction of the states (4 096 devices: 17 ms against 700 ms), with one axis per
    gather or scatter."""
    if model is None and len(problem.spaces) == 1 and len(problem.spaces[0].sizes) > COARSE_FIRST_ABOVE:
        found, reached = cost_search(problem, start, target, model)
        if reached is not None:
            return tuple(merged_units(found.path(reached))), found.best[reached][2], True
    found, reached = search(problem, start, target, model)
    if reached is not None:
        return tuple(found.path(reached)), found.best[reached][2], True
    return _fallback(problem, start, target, found)


@lru_cache(maxsize=1 << 15)
def solve_cost(problem: Problem, start, target, model, bound: float = math.inf) -> tuple[tuple, int, bool]:
    """`solve_path` with an empty path: cost tables need only the bytes, and building the path is
    a tenth of a search; the search may then use the source's symmetry (`cost_search`), and
    keep only states within `bound`, the bytes of a plan known (`planner._coarse_bound`)."""
    found, reached = cost_search(problem, start, target, model, bound)
    if reached is not None:
        return (), found.best[reached][2], True
    return _fallback(problem, start, target, found)


@lru_cache(maxsize=1 << 15)
def solve_time(problem: Problem, start, target, model) -> int:
    """Nanoseconds of the fastest path under `model`: the search's objective, which times every
    move as its step will be (`_timed_permutes` keeps real axes); the constructive fallback's
    moves timed alike."""
    found, reached = search(problem, start, target, model)
    if reached is not None:
        return found.best[reached][0]
    _check_not_exhausted(problem, start, target, found)
    path = constructive_path(problem, start, target)
    return sum(model.step_nanoseconds(move.kind, problem.matrix(node[0]), move.axes, move.bytes) for node, move, _ in path)


def _fallback(problem: Problem, start, target, found) -> tuple[tuple, int, bool]:
    """The constructive plan, marked not proven minimal: the search `found` stopped at its
    state limit. It never runs out of states first, since every pair has a plan (the
    constructive plan is one of its paths); if it ever did, that is a bug, raised, not a
    candidate dropped."""
    _check_not_exhausted(problem, start, target, found)
    path = constructive_path(problem, start, target)
    return tuple(path), sum(move.bytes for _, move, _ in path), False


def _check_not_exhausted(problem: Problem, start, target, found) -> None:
    if found.exhausted:
        raise AssertionError(f"the search from {problem.layout(start)} ran out of states before {problem.layout(target)}")


def solve_layouts(src: Layout, dst: Layout, itemsize: int, model, solve=solve_path):
    """`solve` (`solve_path` unless told) between two layouts of one tensor on one cluster, normalised
    and refined to one problem (`build_problem`): ``(problem, solution)``."""
    check_pair(src, dst)
    problem, start, target = build_problem(src.normalized(), dst.normalized(), itemsize)
    return problem, solve(problem, start, target, model)
