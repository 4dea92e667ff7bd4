"""Coarsening: pruning and merging keep the optimum (brute force, with and without a memory
budget); sharing repeated layers keeps the model's size flat in the number of layers."""

from __future__ import annotations

import numpy as np
import pytest

from autostrat.search.coarsen import coarsen
from autostrat.search.problem import build_problem
from autostrat.search.propagate import propagate
from autostrat.search.refine import refine
from tests.brute_force import costs, every_choice, peaks
from tests.test_refine import CASES, small_problem


def brute_force_under(problem, budget: int | None) -> int | None:
    """The fewest bytes of any choice whose peak fits `budget` (None: no choice fits)."""
    choices = every_choice(problem)
    if budget is not None:
        choices = choices[peaks(problem, choices) <= budget]
    return int(costs(problem, choices).min()) if len(choices) else None


@pytest.mark.parametrize("level", ["none", "exact"])
@pytest.mark.parametrize("device_num, seed", CASES[::2])
def test_every_level_reaches_the_brute_force_optimum(level, device_num, seed):
    problem = small_problem(device_num, seed)
    result = refine(problem, propagate(problem).choice, time_limit=30, coarsen_level=level)
    assert result.status == "OPTIMAL" and result.exact
    assert result.objective == brute_force_under(problem, None)


@pytest.mark.slow
@pytest.mark.parametrize("device_num, seed", CASES[1::4])
def test_pruning_keeps_the_optimum_under_a_memory_budget(device_num, seed):
    from autostrat.search.memory import peak_bytes

    problem = small_problem(device_num, seed)
    hint = propagate(problem).choice
    # Halfway between the all-split and the hint's peak: tight enough that memory matters.
    lowest = min(peak_bytes(problem, {op: i for op in problem.candidates for i in [len(problem.candidates[op]) - 1]}), peak_bytes(problem, hint))
    budget = (lowest + peak_bytes(problem, hint)) // 2
    expected = brute_force_under(problem, budget)
    assert expected is not None  # the budget is at least the peak of an actual choice
    result = refine(problem, hint, time_limit=30, max_device_memory=budget, coarsen_level="exact")
    assert result.objective == expected
    assert peak_bytes(problem, result.choice) <= budget


def test_pruned_candidates_are_dominated_in_every_respect():
    problem = small_problem(8, 3)
    coarse = coarsen(problem)
    pruned = sum(len(d) for d in coarse.dominator.values())
    assert pruned > 0
    for op, dominated in coarse.dominator.items():
        costs = problem.costs[op]
        for loser, winner in dominated.items():
            assert winner in coarse.kept[op] and loser not in coarse.kept[op]
            assert costs.comm[winner] <= costs.comm[loser] and costs.flops[winner] <= costs.flops[loser]
            for edge in problem.incident[op]:
                if edge.consumer == op:
                    assert (edge.table[:, winner] <= edge.table[:, loser]).all()
                else:
                    assert (edge.table[winner] <= edge.table[loser]).all()


def test_a_chain_is_merged_entirely_and_expands_to_the_optimum():
    from autostrat.frontend import trace
    from autostrat.models import MLP
    from autostrat.nn import Tensor

    graph = trace(MLP(layers=3, in_channels=64, hidden=256, out_channels=64), Tensor(shape=(64, 64)), device_num=8)
    problem = build_problem(graph, 8)
    coarse = coarsen(problem)
    assert coarse.variables == {} and len(coarse.eliminated) == len(graph.ops)
    choice = coarse.expand({})
    assert problem.cost(choice) == coarse.constant == 0


def gpt_graph(layers: int):
    from autostrat.frontend import trace
    from autostrat.models import GPT

    net = GPT(layers=layers, hidden=64, heads=8, seq=16, batch=8, vocab=128)
    return trace(net, *net.example_inputs(), device_num=8)


def gpt_problem(layers: int):
    return build_problem(gpt_graph(layers), 8, full_only=True)


def megatron(layers: int) -> tuple[int, int]:
    """Bytes and peak memory per device of Megatron-LM's plan (seeds propagated by BFS)."""
    from autostrat.frontend.config import apply_seeds
    from autostrat.models import megatron_seeds
    from autostrat.search.memory import peak_bytes

    problem = build_problem(apply_seeds(gpt_graph(layers), megatron_seeds(layers, 8), 8), 8)
    choice = propagate(problem).choice
    return problem.cost(choice), peak_bytes(problem, choice)


def test_shared_layers_keep_the_model_flat_in_depth():
    sizes = []
    for layers in (1, 2, 4):
        coarse = coarsen(gpt_problem(layers), "layers", budget=True)
        sizes.append(sum(coarse.variables.values()))
    assert sizes[1] == sizes[2]  # layers 1.. share layer 0's variables
    exact = [sum(coarsen(gpt_problem(layers), "exact", budget=True).variables.values()) for layers in (1, 2)]
    assert exact[1] > exact[0]  # without sharing the model grows with each layer


@pytest.mark.slow
def test_shared_layers_give_every_layer_the_same_strategies():
    from autostrat.search.memory import peak_bytes

    problem = gpt_problem(2)
    megatron_bytes, budget = megatron(2)
    hint = {op: 0 for op in problem.candidates}
    shared = refine(problem, hint, max_device_memory=budget, coarsen_level="layers")
    assert shared.status == "OPTIMAL" and not shared.exact and "blocks.0-1 (2 layers)" in shared.coarsening
    # Under a budget only ops of constant memory merge: reshapes of views, GELU, the residual Add.
    assert {"blocks.0.attention.softmax", "blocks.0.ffn1.activation.gelu"} <= set(shared.merged)
    for op, index in shared.choice.items():
        if op.startswith("blocks.1."):
            assert index == shared.choice["blocks.0." + op[len("blocks.1."):]]
    assert peak_bytes(problem, shared.choice) <= budget
    assert shared.objective <= megatron_bytes
    # Sharing restricts the plans, so it is never below a lower bound of the unrestricted problem.
    # The exact level starts from the layered plan, so it is never worse than it either.
    exact = refine(problem, hint, time_limit=30, max_device_memory=budget, coarsen_level="exact")
    assert exact.bound <= exact.objective <= shared.objective and exact.hint_objective == problem.cost(hint)


def test_unknown_level_is_rejected():
    from autostrat.errors import ConfigError

    with pytest.raises(ConfigError, match="coarsen must be one of none, exact, layers; got 'all'"):
        coarsen(small_problem(4, 0), "all")


def test_coarse_hint_maps_pruned_choices_to_their_dominators():
    problem = small_problem(8, 3)
    coarse = coarsen(problem, "none")
    assert all(len(coarse.kept[op]) == len(c) for op, c in problem.candidates.items())
    exact = coarsen(problem)
    hint = {op: next(iter(exact.dominator[op]), 0) for op in problem.candidates}
    mapped = exact.coarse_hint(hint)
    for op, index in mapped.items():
        assert exact.kept[op][index] == exact.dominator[op].get(hint[op], hint[op])
    assert np.isfinite(problem.cost(exact.expand({o: mapped[o] for o in exact.variables})))
