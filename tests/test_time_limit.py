"""The refinement's time limit bounds all its solves together (the starts', the solve, the
explanation of an infeasible budget, the retries under a tighter budget). A fake clock that each
faked solve advances by all the time it is given stands in for the solver: no timed test."""

from __future__ import annotations

import importlib

import pytest
from ortools.sat.python import cp_model

import autostrat.search.refine as refine_module
from autostrat.errors import InfeasibleError
from autostrat.search import SearchOptions, search
from autostrat.search.refine import RefineResult, refine
from tests.test_refine import small_problem

search_module = importlib.import_module("autostrat.search.search")  # the package names its function `search`


class FakeClock:
    """`time` as the module under test sees it: `perf_counter` reads `now`, which solves advance."""

    def __init__(self):
        self.now, self.given = 1000.0, []

    def perf_counter(self) -> float:
        return self.now

    def spend(self, seconds: float) -> None:
        """A solve given `seconds` that uses them all."""
        self.given.append(seconds)
        self.now += seconds


def test_an_infeasible_budget_is_explained_within_the_time_limit(monkeypatch):
    clock = FakeClock()
    monkeypatch.setattr(refine_module, "time", clock)

    def smallest_peak_plan(problem, time_limit, workers, level):
        clock.spend(time_limit)
        return None, False, None

    def solve(problem, built, objective, time_limit, workers, progress):
        clock.spend(time_limit)
        return cp_model.INFEASIBLE, None, 0

    monkeypatch.setattr(refine_module, "_smallest_peak_plan", smallest_peak_plan)
    monkeypatch.setattr(refine_module, "_solve", solve)
    problem = small_problem(8, 0)
    with pytest.raises(InfeasibleError, match="smallest achievable peak was not found within the time limit"):
        refine(problem, {op: 0 for op in problem.candidates}, time_limit=60, max_device_memory=1)
    # the start the memory-only model looks for, the solve, the explanation: 60 s in all
    assert clock.given == [15.0, 45.0, 0.0]


def test_the_retries_under_a_tighter_budget_share_the_time_limit(monkeypatch):
    clock = FakeClock()
    monkeypatch.setattr(search_module, "time", clock)

    def refine_fake(problem, hint, time_limit, workers, budget, progress, level, starts):
        clock.spend(time_limit)  # its plan's copies never fit the 1-byte budget: a retry is wanted
        cost = problem.cost(hint)
        return RefineResult(dict(hint), cost, 0, "FEASIBLE", time_limit, cost)

    monkeypatch.setattr(search_module, "refine", refine_fake)
    problem = small_problem(8, 0)
    options = SearchOptions(refine="cpsat", refine_time_limit=60, max_device_memory=1)
    with pytest.raises(InfeasibleError, match=r"after 1 solve\(s\) the last plan peaks at"):
        search(problem.graph, 8, options)
    assert clock.given == [60.0]
