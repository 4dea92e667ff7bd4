"""The solver prices what the plan pays: readers of one tensor wanting one layout share one
redistribution. Differential tests on small random graphs against the built plan's own total."""

from __future__ import annotations

import pytest

from autostrat.autodiff import SGD
from autostrat.models import tutorial_plan
from autostrat.search import SearchOptions, search
from autostrat.search.coarsen import coarsen
from autostrat.search.plan import build_plan
from autostrat.search.problem import build_problem
from autostrat.search.propagate import data_parallel, propagate
from autostrat.search.refine import refine
from autostrat.search.sharing import fanouts
from tests.brute_force import costs, every_choice
from tests.test_refine import CASES, small_problem


def plan_total(problem, choice) -> int:
    """The bytes per device of the plan built from `choice` (its redistributions, shared ones once)."""
    strategies = {op: problem.candidates[op][index] for op, index in choice.items()}
    plan = build_plan(problem.graph, problem.device_num, "auto_parallel", strategies, dict.fromkeys(strategies, "test"), ())
    return plan.total_bytes


def pairwise_optimum(problem) -> int:
    """The choice a model charging every reader its own redistribution finds best (the least
    shared cost among its ties), at its real cost."""
    choices = every_choice(problem)
    shared, pairwise = costs(problem, choices), costs(problem, choices, shared=False)
    return int(shared[pairwise == pairwise.min()].min())


@pytest.mark.parametrize("device_num, seed", CASES[::2])
def test_the_solver_objective_is_the_plan_total_and_never_worse_than_its_starts(device_num, seed):
    problem = small_problem(device_num, seed)
    starts = [propagate(problem).choice, data_parallel(problem, keep_seeds=True).choice]
    for level in ("none", "exact"):
        result = refine(problem, starts[0], time_limit=30, starts=starts[1:], coarsen_level=level)
        assert result.objective == plan_total(problem, result.choice) == problem.cost(result.choice)
        assert result.objective <= min(plan_total(problem, start) for start in starts)
        assert result.hint_objective == plan_total(problem, starts[0])


def test_the_random_cases_include_ones_where_a_pairwise_model_loses_to_sharing():
    worse = []
    for device_num, seed in CASES:
        problem = small_problem(device_num, seed)
        if not fanouts(problem):
            continue
        optimum = refine(problem, propagate(problem).choice, time_limit=30).objective
        pairwise = pairwise_optimum(problem)
        assert optimum <= pairwise
        if optimum < pairwise:
            worse.append((device_num, seed))
        if len(worse) >= 2:
            break
    assert len(worse) >= 2


def test_a_training_step_refined_costs_what_its_plan_sends():
    graph = tutorial_plan(optimizer=SGD()).graph
    problem = build_problem(graph, 8)
    assert fanouts(problem)  # the backward ops read the forward activations again
    plan = search(graph, 8, SearchOptions(refine="cpsat"))
    result = plan.refinement.result
    assert result.status == "OPTIMAL"
    assert result.objective == plan.total_bytes <= plan.refinement.before


def test_a_reader_candidate_is_never_pruned_for_one_wanting_another_layout():
    problem = small_problem(8, 3)
    coarse = coarsen(problem)
    for fanout in fanouts(problem):
        for edge, wants in zip(fanout.edges, fanout.wants):
            for pruned, kept in coarse.dominator[edge.consumer].items():
                assert wants[pruned] == wants[kept]
