"""refine="solve": the IOPDDL solver on our own search problems. The instance prices every
choice as the problem does (random choices), and the refinement is never worse than BFS, fits
the budget, and finds CP-SAT's proven optimum on the shipped small configs."""

from __future__ import annotations

import functools
from dataclasses import replace

import numpy as np
import pytest

from autostrat.cli import main
from autostrat.cost import Hardware
from autostrat.errors import ConfigError
from autostrat.frontend import trace
from autostrat.frontend.config import apply_seeds, load_config
from autostrat.frontend.run import fit_seeds
from autostrat.search.memory import peak_bytes
from autostrat.search.problem import build_problem
from autostrat.search.propagate import propagate
from autostrat.search.refine import refine
from autostrat.search.options import SearchOptions
from autostrat.search.solve.convert import FORBIDDEN_COST, shares_nothing, to_instance
from autostrat.search.solve.evaluate import peak_usage, solution_cost
from autostrat.search.solve.instance import FORBIDDEN, Instance
from autostrat.search.solve.refinement import SOLVER, refine_by_solver
from autostrat.search.solve.solver import solve
from tests.test_refine import CASES, small_problem


@functools.cache
def config_problem(name: str, timed: bool = False):
    """The search problem of a shipped config on its 8 devices, as `autostrat search` builds it
    (`timed`: with cost_model "time" on the default hardware)."""
    config = load_config(f"configs/{name}.yaml")
    _, seeds, _ = fit_seeds(config, 8)
    graph = apply_seeds(trace(config.network(), *config.inputs, device_num=8), seeds, 8)
    return build_problem(graph, 8, allow_repeated=True, hardware=Hardware() if timed else None)


def random_choices(problem, count: int, seed: int) -> list[dict[str, int]]:
    rng = np.random.default_rng(seed)
    return [{op: int(rng.integers(len(candidates))) for op, candidates in problem.candidates.items()}
            for _ in range(count)]


@pytest.mark.parametrize("device_num, seed", CASES[::4])
def test_the_instance_prices_pairwise_costs_and_peaks_exactly(device_num, seed):
    problem = small_problem(device_num, seed)
    converted = to_instance(problem, budget=10**9)
    for choice in random_choices(problem, 50, seed):
        solution = converted.solution(choice)
        assert converted.choice(solution) == choice
        assert solution_cost(converted.instance, solution) == problem.cost(choice, shared=False)
        assert peak_usage(converted.instance, solution) == peak_bytes(problem, choice)


@pytest.mark.parametrize("timed", [False, True])
@pytest.mark.parametrize("name", ["ffn", "mlp"])
def test_without_shared_readers_the_instance_prices_the_exact_cost(name, timed):
    """In bytes, and in nanoseconds (which `problem.cost` truncates to an integer)."""
    problem = config_problem(name, timed)
    assert shares_nothing(problem)
    converted = to_instance(problem)
    for choice in random_choices(problem, 200, 0):
        solution = converted.solution(choice)
        assert int(solution_cost(converted.instance, solution)) == problem.cost(choice, shared=True)
        assert peak_usage(converted.instance, solution) == peak_bytes(problem, choice)


def test_gpt_has_shared_readers():
    assert not shares_nothing(config_problem("gpt"))  # its bound is then not taken as one on the exact cost


class _Unreachable:
    """A cost table whose first entry has no redistribution."""

    def __init__(self, table):
        self.values = np.array(table.full(), dtype=float)
        self.values[0, 0] = np.inf

    def full(self):
        return self.values


def test_unreachable_pairs_become_forbidden_costs():
    problem = config_problem("ffn")
    edge = problem.edges[0]
    broken = replace(problem, edges=(replace(edge, table=_Unreachable(edge.table)), *problem.edges[1:]))
    converted = to_instance(broken)
    choice = {op: 0 for op in problem.candidates}
    assert solution_cost(converted.instance, converted.solution(choice)) >= FORBIDDEN_COST > FORBIDDEN
    choice[edge.consumer] = 1
    assert solution_cost(converted.instance, converted.solution(choice)) == problem.cost(choice, shared=False)


@pytest.mark.parametrize("name", ["ffn", "mlp"])
@pytest.mark.parametrize("tightness", [None, 1, 0.8])
def test_the_solver_finds_cpsats_proven_optimum(name, tightness):
    """Without a budget, just below the unbudgeted optimum's peak, and at 80 % of it."""
    problem = config_problem(name)
    bfs = propagate(problem).choice
    peak = peak_bytes(problem, refine(problem, bfs, time_limit=30).choice)
    budget = None if tightness is None else (peak - 1 if tightness == 1 else int(peak * tightness))
    optimum = refine(problem, bfs, time_limit=30, max_device_memory=budget)
    assert optimum.status == "OPTIMAL"
    result = refine_by_solver(problem, bfs, time_limit=30, max_device_memory=budget, rounds=40)
    assert result.objective == problem.cost(result.choice, shared=True) == optimum.objective
    assert budget is None or peak_bytes(problem, result.choice) <= budget
    assert result.status == "FEASIBLE" and 0 < result.bound <= result.objective and result.solver == SOLVER
    if budget is None or peak_bytes(problem, bfs) <= budget:
        assert result.objective <= problem.cost(bfs, shared=True)


@pytest.mark.parametrize("budget", [None, 162_208])
def test_on_gpt_the_solver_is_never_worse_than_bfs_and_fits(budget):
    """162 208 bytes is 80 % of the BFS plan's peak: the solver must find a plan of its own."""
    problem = config_problem("gpt")
    bfs = propagate(problem).choice
    result = refine_by_solver(problem, bfs, time_limit=30, max_device_memory=budget, rounds=3)
    assert result.objective == problem.cost(result.choice, shared=True)
    if budget is None:
        assert result.objective <= problem.cost(bfs, shared=True)
    else:
        assert peak_bytes(problem, bfs) > budget >= peak_bytes(problem, result.choice)
    # shared readers: the pairwise bound is no bound on the exact cost, the relaxed instance's is
    # (tests/test_solve_untied.py checks it against brute force)
    assert 0 < result.bound <= result.objective


def trap(limit: int | None) -> Instance:
    """Two nodes whose greedy start and sweeps stay at cost 10 while (1, 1) costs 1; strategy 1
    of the first node uses 5 bytes."""
    return Instance("trap", (np.array([0, 1]), np.array([0, 0])), (np.array([0, 5]), np.array([0, 0])),
                    np.array([[0, 1], [0, 1]]), np.array([[0, 1]]), (np.array([[10, 10], [10, 0]]),), limit)


def test_the_solver_starts_from_a_given_solution_when_it_is_cheaper_and_fits():
    assert solve(trap(None), 5.0, rounds=0, exhaustive_limit=0).cost == 10
    assert solve(trap(None), 5.0, rounds=0, exhaustive_limit=0, initial=[1, 1]).cost == 1
    assert solve(trap(None), 5.0, rounds=0, exhaustive_limit=0, initial=[1, 0]).cost == 10  # dearer than the greedy start
    assert solve(trap(4), 5.0, rounds=0, exhaustive_limit=0, initial=[1, 1]).cost == 10  # over the limit


def test_no_time_returns_the_bfs_plan():
    problem = config_problem("ffn")
    bfs = propagate(problem).choice
    result = refine_by_solver(problem, bfs, time_limit=0)
    assert result.choice == bfs and result.status == "FEASIBLE" and result.bound == 0
    assert result.stopped == ("the time limit (0 s) ran out while pricing every cost table for the solver's instance: "
                              "the plan is the best start, not refined")


def test_search_refines_with_the_solver(capsys):
    assert main(["search", "configs/ffn.yaml", "--refine", "solve", "--time-limit", "30"]) == 0
    out = capsys.readouterr().out
    assert "refined by the IOPDDL solver: 6144 -> 1536 bytes per device, FEASIBLE among candidates" in out
    assert "rounds on 15 nodes (10 of memory), no coarsening" in out


def test_an_unknown_refiner_names_the_valid_ones():
    with pytest.raises(ConfigError, match=r"^refine must be one of None, cpsat, solve; got 'sat'$"):
        SearchOptions(refine="sat")
