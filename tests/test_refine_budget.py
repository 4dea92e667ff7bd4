"""Refinement under a memory budget: the memory constraints the solver sees give every choice's
peak exactly (brute force), and a known plan that fits is returned, never an error; an error
only when no known plan fits, saying whether infeasibility was proven."""

from __future__ import annotations

import functools
import itertools

import numpy as np
import pytest

from autostrat.errors import InfeasibleError, SolverError
from autostrat.search.coarsen import coarsen, share_layers
from autostrat.search.memory import live_sets, peak_bytes, tensor_bytes
from autostrat.search.peaks import peak_forms
from autostrat.search.problem import build_problem
from autostrat.search.propagate import data_parallel, propagate
from autostrat.search.refine import _hint_start, _Start, refine
from tests.test_refine import CASES, small_problem


@functools.cache
def gpt_training(layers: int):
    """A small GPT training step (Adam) with Megatron's seeds on block 0 only, as BFS starts it."""
    from autostrat.autodiff import Adam, build_training
    from autostrat.frontend import trace
    from autostrat.frontend.config import apply_seeds
    from autostrat.models import GPT, megatron_seeds

    net = GPT(layers=layers, hidden=64, heads=8, seq=16, batch=8, vocab=128)
    graph = apply_seeds(trace(net, *net.example_inputs(), device_num=8), megatron_seeds(layers, 8, first_layer_only=True), 8)
    return build_problem(build_training(graph, Adam()), 8)


def starts(problem) -> tuple[dict, dict]:
    return propagate(problem).choice, data_parallel(problem, keep_seeds=True).choice


def live_set_peak(problem, choice) -> int:
    """The peak by listing every step's live tensors (what `peak_bytes` computed before)."""
    resident, activations = tensor_bytes(problem)
    base = sum(item.bytes[choice[item.owner]] for item in resident)
    live = [sum(activations[i].bytes[choice[activations[i].owner]] for i in step) for step in live_sets(problem, activations)]
    return base + max(live, default=0)


def form_peak(forms, kept: dict[str, int]) -> int:
    """The largest of the forms for a kept index per owner."""
    booleans = np.array([kept[owner] == index for owner, index in forms.columns], dtype=np.int64)
    return max(constant + int(values @ booleans[used]) for constant, used, values in forms.forms)


def random_kept(coarse, rng) -> dict[str, int]:
    return {owner: int(rng.integers(count)) for owner, count in coarse.variables.items()}


@pytest.mark.parametrize("device_num, seed", CASES[::3])
def test_peak_bytes_is_the_largest_live_set(device_num, seed):
    problem = small_problem(device_num, seed)
    rng = np.random.default_rng(seed)
    for _ in range(50):
        choice = {op: int(rng.integers(len(c))) for op, c in problem.candidates.items()}
        assert peak_bytes(problem, choice) == live_set_peak(problem, choice)


@pytest.mark.parametrize("level", ["none", "exact"])
@pytest.mark.parametrize("device_num, seed", CASES[::4])
def test_the_kept_forms_give_the_peak_of_every_choice(level, device_num, seed):
    # Brute force over every choice of the coarse model: dropping dominated steps loses nothing.
    problem = small_problem(device_num, seed)
    coarse = coarsen(problem, level, budget=True)
    forms = peak_forms(problem, coarse)
    owners = list(coarse.variables)
    combos = itertools.product(*(range(coarse.variables[o]) for o in owners))
    for combo in itertools.islice(combos, 5000):
        kept = dict(zip(owners, combo))
        assert form_peak(forms, kept) == peak_bytes(problem, coarse.expand(kept))


@pytest.mark.parametrize("level", ["exact", "layers"])
def test_the_kept_forms_give_the_peak_of_a_training_step(level):
    # Layers 1-3 share variables at level "layers": their steps form progressions, of which only
    # the ends are kept; the peak of every (layered) choice is still exact.
    problem = gpt_training(4)
    coarse = coarsen(problem, level, budget=True)
    forms = peak_forms(problem, coarse)
    steps = len(live_sets(problem, tensor_bytes(problem)[1]))
    assert len(forms.forms) < steps
    rng = np.random.default_rng(0)
    for _ in range(200):
        kept = random_kept(coarse, rng)
        assert form_peak(forms, kept) == peak_bytes(problem, coarse.expand(kept))


def test_shared_layers_keep_the_memory_constraints_flat_in_depth():
    # From 5 layers on (the first, seeded one, and progressions of at least 3 shared ones).
    counts = [len(peak_forms(gpt_training(n), coarsen(gpt_training(n), "layers", budget=True)).forms) for n in (5, 10)]
    assert counts[0] == counts[1]


def test_a_seeded_first_layer_leaves_the_other_layers_shared():
    _, shared = share_layers(gpt_training(4))
    assert "blocks.1-3 (3 layers)" in shared  # block 0 carries Megatron's seeds, blocks 1-3 agree
    assert "bprop/blocks.0-3 (4 layers)" in shared


def test_the_solver_variables_are_in_the_same_order_in_every_process():
    # Their order was a set's, which changes with the hash seed: so did the search, its time and
    # the plan among equal ones.
    import os
    import subprocess
    import sys

    script = ("from tests.test_refine_budget import gpt_training; from autostrat.search.coarsen import coarsen; "
              "print(list(coarsen(gpt_training(2), 'layers', budget=True).variables))")
    orders = {subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True,
                             env=os.environ | {"PYTHONHASHSEED": seed}).stdout for seed in ("1", "2")}
    assert len(orders) == 1


def test_the_hint_is_the_cheapest_start_that_fits_else_the_smallest_peak():
    cheap_big, dear_small, middle = _Start({}, 10, 900), _Start({}, 30, 100), _Start({}, 20, 500)
    known = [cheap_big, dear_small, middle]
    assert _hint_start(known, None) is cheap_big
    assert _hint_start(known, 600) is middle
    assert _hint_start(known, 50) is dear_small


@pytest.mark.parametrize("level", ["exact", "layers"])
def test_a_time_limit_too_short_to_prove_returns_the_best_start_that_fits(level):
    # No time at all: CP-SAT proves nothing and finds nothing, the starts are all there is.
    problem = gpt_training(2)
    bfs, around_seeds = starts(problem)
    budget = max(peak_bytes(problem, bfs), peak_bytes(problem, around_seeds))  # both fit
    result = refine(problem, bfs, time_limit=0, max_device_memory=budget, coarsen_level=level, starts=[around_seeds])
    assert result.status == "FEASIBLE" and 0 < result.gap <= 1
    assert result.bound <= result.objective == min(problem.cost(bfs), problem.cost(around_seeds))
    assert peak_bytes(problem, result.choice) <= budget


def test_a_start_that_does_not_fit_is_never_returned():
    problem = gpt_training(2)
    bfs, around_seeds = starts(problem)
    assert problem.cost(bfs) < problem.cost(around_seeds) and peak_bytes(problem, bfs) < peak_bytes(problem, around_seeds)
    budget = peak_bytes(problem, around_seeds)
    result = refine(problem, around_seeds, time_limit=0, max_device_memory=budget - 1, starts=[bfs])
    assert result.choice == bfs and result.status == "FEASIBLE"


def test_search_returns_a_plan_when_refinement_has_no_time():
    from autostrat.search import SearchOptions, search

    problem = gpt_training(2)
    budget = max(peak_bytes(problem, choice) for choice in starts(problem))
    plan = search(problem.graph, 8, SearchOptions(refine="cpsat", refine_time_limit=0, max_device_memory=budget))
    assert plan.refinement.result.status == "FEASIBLE" and plan.refinement.result.bound < plan.total_bytes


def test_no_fitting_start_and_nothing_proven_is_an_error_saying_what_to_try(monkeypatch):
    import autostrat.search.refine as refine_module
    from ortools.sat.python import cp_model

    # The memory-only model and the solve both run out of time without a plan.
    monkeypatch.setattr(refine_module, "_smallest_peak_plan", lambda *args: (None, False, None))
    monkeypatch.setattr(refine_module, "_solve", lambda *args: (cp_model.UNKNOWN, None, 0))
    problem = gpt_training(2)
    bfs, around_seeds = starts(problem)
    smallest = min(peak_bytes(problem, bfs), peak_bytes(problem, around_seeds))
    message = (rf"CP-SAT found no plan within the time limit \(30 s\) and did not prove that none fits max_device_memory = "
               rf"{smallest - 1:,} bytes per device; the smallest peak of the starts is {smallest:,} bytes. Try a longer "
               rf"refine_time_limit, or coarsen 'layers' \(repeated layers share variables: a smaller model\)")
    with pytest.raises(SolverError, match=message):
        refine(problem, bfs, time_limit=30, max_device_memory=smallest - 1, starts=[around_seeds])


def test_no_time_and_no_fitting_start_is_an_error_saying_where_the_time_ran_out():
    problem = gpt_training(2)
    bfs, around_seeds = starts(problem)
    smallest = min(peak_bytes(problem, bfs), peak_bytes(problem, around_seeds))
    message = (rf"the time limit \(0 s\) ran out while pricing the starts: no plan was found, nor proven impossible, that "
               rf"fits max_device_memory = {smallest - 1:,} bytes per device; the smallest peak of the starts is "
               rf"{smallest:,} bytes. Try a longer refine_time_limit, or coarsen 'layers'")
    with pytest.raises(SolverError, match=message):
        refine(problem, bfs, time_limit=0, max_device_memory=smallest - 1, starts=[around_seeds])


def test_a_budget_no_layered_plan_fits_is_infeasible_with_the_smallest_layered_peak():
    from autostrat.search.refine import smallest_peak

    problem = gpt_training(2)
    peak, proven = smallest_peak(problem, level="layers")
    assert proven
    message = (rf"no plan whose repeated layers agree fits max_device_memory = {peak - 1:,} bytes per device: "
               rf"the smallest achievable peak is {peak:,} bytes \(parameters plus live activations\)")
    with pytest.raises(InfeasibleError, match=message):
        refine(problem, propagate(problem).choice, time_limit=30, max_device_memory=peak - 1, coarsen_level="layers")


def test_when_the_refined_plans_copies_keep_it_over_the_budget_the_best_fitting_start_is_returned(monkeypatch):
    import importlib

    from autostrat.search import SearchOptions, search
    from autostrat.search.refine import RefineResult

    search_module = importlib.import_module("autostrat.search.search")
    graph = gpt_training(2).graph
    bfs_plan = search(graph, 8)
    budget = bfs_plan.prediction.peak_bytes  # the propagated plan fits, copies included
    answers = []

    def refine_fake(problem, hint, time_limit, workers, budget, progress, level, starts, deadline):
        # The solver's answer: the data-parallel start, which peaks over the budget.
        answers.append(starts[0])
        return RefineResult(dict(starts[0]), problem.cost(starts[0]), 0, "FEASIBLE", 1.0, problem.cost(hint))

    monkeypatch.setattr(search_module, "refine", refine_fake)
    plan = search(graph, 8, SearchOptions(refine="cpsat", max_device_memory=budget))
    over = search(graph, 8, SearchOptions(mode="semi_auto_parallel")).prediction.peak_bytes
    assert over > budget and len(answers) >= 2  # asked again under a tighter budget, to no avail
    result = plan.refinement.result
    assert all(str(plan.ops[op].strategy) == str(bfs_plan.ops[op].strategy) for op in bfs_plan.ops)  # the start
    assert plan.prediction.peak_bytes <= budget
    assert plan.total_bytes == bfs_plan.total_bytes and result.bound == 0 and result.status == "FEASIBLE"
    assert result.stopped == (f"after {len(answers)} solve(s) the refined plan still peaked over max_device_memory with "
                              f"its redistributions' copies ({over:,} bytes): the plan is the best start that fits")
