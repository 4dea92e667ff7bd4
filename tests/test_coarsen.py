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


@pytest.mark.parametrize("layers", [2, 4])
def test_merged_fanouts_give_the_unmerged_optimum_with_fewer_booleans(layers, monkeypatch):
    # Repeated layers sharing variables repeat each other's fanouts; priced once at their sum,
    # the model is the same: the same optimum and bound, each solve checked against the plan's
    # own bytes (`refine._checked_start`), and fewer booleans, as many at 4 layers as at 2 but
    # for the causal mask every layer reads (one constant: a fanout once three layers read it).
    from autostrat.search import coarsen as coarsen_module
    from autostrat.search.cpsat import SolverModel

    problem = gpt_problem(layers)
    hint = {op: 0 for op in problem.candidates}
    flat = len(coarsen(gpt_problem(2), "layers", budget=True).fanouts)
    results, sizes = [], []
    for merge in (True, False):
        if not merge:
            monkeypatch.setattr(coarsen_module, "merged_fanouts", lambda fanouts: fanouts)
        coarse = coarsen(problem, "layers", budget=True)
        sizes.append((len(coarse.fanouts), len(SolverModel(problem, coarse).model.Proto().variables)))
        results.append(refine(problem, hint, time_limit=60, coarsen_level="layers"))
    merged, unmerged = results
    assert merged.status == unmerged.status == "OPTIMAL"
    assert merged.objective == unmerged.objective and merged.choice == unmerged.choice
    assert sizes[0][0] < sizes[1][0] and sizes[0][1] < sizes[1][1]
    assert sizes[0][0] == flat + (layers > 2)  # whatever the depth


def test_merged_fanouts_price_every_choice_as_its_plan_pays():
    # Not only at the optimum: each of these layered choices, fixed in the merged model, costs
    # what the problem charges it with shared redistributions paid once.
    import random

    from ortools.sat.python import cp_model

    from autostrat.autodiff import Adam, build_training
    from autostrat.search.cpsat import SolverModel
    from autostrat.search.sharing import fanouts
    from autostrat.search.solver_run import new_solver, run

    problem = build_problem(build_training(gpt_graph(3), Adam(1e-3)), 8)
    coarse = coarsen(problem, "layers")
    assert len(coarse.fanouts) < len(fanouts(problem))  # some were merged
    generator = random.Random(0)
    priced = set()
    for _ in range(12):
        chosen = {owner: generator.randrange(count) for owner, count in coarse.variables.items()}
        built = SolverModel(problem, coarse)
        objective = built.minimize_bytes()
        for owner, index in chosen.items():
            built.model.Add(built.x[owner][index] == 1)
        solver = new_solver(30, 0)
        status = run(solver, built)
        choice = coarse.expand(chosen)
        if status == cp_model.INFEASIBLE:  # the choice pairs unreachable layouts, and the problem says so too
            assert problem.cost(choice, shared=True) == float("inf")
            continue
        priced.add(objective.bytes(solver.ObjectiveValue()))
        assert objective.bytes(solver.ObjectiveValue()) == problem.cost(choice, shared=True)
    assert len(priced) >= 6  # choices of different costs were compared
