"""CP-SAT refinement: on random small graphs, brute force = CP-SAT optimum <= BFS, every time."""

from __future__ import annotations

import numpy as np
import pytest

from autostrat.errors import SolverError
from autostrat.ir import Graph, OpNode, TensorInfo
from autostrat.rules import make_rule
from autostrat.search.problem import build_problem
from autostrat.search.propagate import propagate
from autostrat.search.refine import refine
from autostrat.strategies import generate_strategies
from tests.brute_force import costs, every_choice

SHAPE = (16, 16)


def random_graph(rng: np.random.Generator, device_num: int, size: int) -> Graph:
    """A DAG of `size` ops on [16, 16] tensors: unary ops, Adds joining branches, MatMuls with
    weights; about a third of the ops seeded with a random candidate (seeds may conflict)."""
    tensors = {"x": TensorInfo("x", SHAPE, "float32", "input")}
    ops, available = {}, ["x"]
    for index in range(size):
        kind = str(rng.choice(["ReLU", "Sigmoid", "Add", "MatMul", "Transpose"]))
        name = f"{kind.lower()}{index}"
        if kind == "Add":
            inputs = tuple(str(t) for t in rng.choice(available, size=2))
        elif kind == "MatMul":
            weight = f"w{index}"
            tensors[weight] = TensorInfo(weight, SHAPE, "float32", "parameter")
            inputs = (str(rng.choice(available)), weight)
        else:
            inputs = (str(rng.choice(available)),)
        attrs = {"perm": (1, 0)} if kind == "Transpose" else {}
        rule = make_rule(kind, [SHAPE] * len(inputs), **attrs)
        seed = None
        if rng.random() < 0.35:
            candidates = generate_strategies(rule, device_num)
            seed = candidates[int(rng.integers(len(candidates)))].to_tuples()
        output = f"{name}:0"
        tensors[output] = TensorInfo(output, SHAPE, "float32", "output", name)
        ops[name] = OpNode(name, kind, tuple(sorted(attrs.items())), inputs, (output,), rule, seed)
        available.append(output)
    return Graph(tensors, ops, (available[-1],))


def small_problem(device_num: int, seed: int):
    rng = np.random.default_rng(seed)
    while True:  # keep brute force small: at most ~60k combinations
        graph = random_graph(rng, device_num, int(rng.integers(5, 11)))
        problem = build_problem(graph, device_num)
        if np.prod([len(c) for c in problem.candidates.values()], dtype=float) <= 60_000:
            return problem


def brute_force(problem) -> int:
    """The least cost of any choice (every combination of candidates, tests/brute_force.py)."""
    return int(costs(problem, every_choice(problem)).min())


CASES = [(device_num, seed) for device_num in (4, 8) for seed in range(20)]


@pytest.mark.parametrize("device_num, seed", CASES)
def test_cpsat_equals_brute_force_and_never_loses_to_bfs(device_num, seed):
    problem = small_problem(device_num, seed)
    bfs = problem.cost(propagate(problem).choice)
    result = refine(problem, propagate(problem).choice, time_limit=30)
    assert result.status == "OPTIMAL" and result.gap == 0
    assert result.objective == brute_force(problem) <= bfs
    assert result.hint_objective == bfs


def test_the_random_cases_include_ones_where_bfs_is_not_optimal():
    improved = 0
    for device_num, seed in CASES:
        problem = small_problem(device_num, seed)
        improved += brute_force(problem) < problem.cost(propagate(problem).choice)
        if improved >= 2:
            break  # found: the rest of the brute forces would only take time
    assert improved >= 2


def test_tie_break_never_changes_the_optimal_bytes():
    # The objective is SCALE * bytes + quantised flops with SCALE above every tie-break sum, so the
    # bytes of the solution equal the byte-only optimum (brute force) on every random case.
    for device_num, seed in CASES[::5]:
        problem = small_problem(device_num, seed)
        assert refine(problem, propagate(problem).choice).objective == brute_force(problem)


def conflict_graph():
    """MindSpore's conflict example: Add -> ReLU -> {ReduceMax seeded ((8, 1),), Sub seeded ((1, 8), (1, 1))}."""
    from autostrat import ops
    from autostrat.frontend import trace
    from autostrat.nn import Cell, Parameter, Tensor

    class Conflict(Cell):
        def __init__(self):
            super().__init__()
            self.w = Parameter(np.zeros((32000,), np.float32))
            self.add, self.relu = ops.Add(), ops.ReLU()
            self.reduce_max = ops.ReduceMax(keep_dims=True).shard(((8, 1),))
            self.sub = ops.Sub().shard(((1, 8), (1, 1)))

        def construct(self, x):
            y = self.relu(self.add(x, self.w))
            return self.sub(y, self.reduce_max(y, -1))

    return trace(Conflict(), Tensor(shape=(64, 32000)), device_num=8)


def test_mindspore_conflict_case_refined_plan_costs_no_more_than_bfs():
    from autostrat.search import SearchOptions, search

    bfs = search(conflict_graph(), 8)
    refined = search(conflict_graph(), 8, SearchOptions(refine="cpsat"))
    # BFS keeps Add and ReLU whole (free slices to both seeds) and gathers ReduceMax's [64, 1]
    # result for Sub: 7 * 32 bytes. CP-SAT proves nothing cheaper exists.
    assert bfs.total_bytes == 224 and refined.total_bytes == 224
    assert refined.refinement.result.status == "OPTIMAL" and refined.refinement.before == 224


def mlp_graph():
    from autostrat.frontend import trace
    from autostrat.models import MLP
    from autostrat.nn import Tensor

    return trace(MLP(layers=3, in_channels=64, hidden=256, out_channels=64), Tensor(shape=(64, 64)), device_num=8)


def test_a_budget_below_the_replicated_parameters_forces_split_parameters():
    from autostrat.search import SearchOptions, search

    graph = mlp_graph()
    replicated = sum(4 * int(np.prod(t.shape)) for t in graph.parameters())
    free = search(graph, 8, SearchOptions(search_mode="integer_programming"))
    assert free.total_bytes == 0 and all(free.layouts[t.name].parts == (1,) * len(t.shape) for t in graph.parameters())
    tight = search(graph, 8, SearchOptions(search_mode="integer_programming", max_device_memory=replicated // 2))
    assert any(tight.layouts[t.name].parts != (1,) * len(t.shape) for t in graph.parameters())
    assert tight.refinement.result.status == "OPTIMAL" and tight.total_bytes > 0


def test_a_budget_below_the_smallest_peak_is_infeasible():
    from autostrat.errors import InfeasibleError
    from autostrat.search import SearchOptions, search

    # 65 824 bytes: the peak floor (`memory.peak_floor`), so CP-SAT's memory-only model is asked and proves more is needed.
    with pytest.raises(InfeasibleError, match=r"no plan fits max_device_memory = 65,824 bytes per device: the smallest achievable peak is 74,016 bytes"):
        search(mlp_graph(), 8, SearchOptions(search_mode="integer_programming", max_device_memory=65_824))


def test_without_seeds_the_gpt_plan_sends_no_more_than_megatron():
    from autostrat.frontend import trace
    from autostrat.frontend.config import apply_seeds
    from autostrat.models import GPT, megatron_seeds
    from autostrat.search import SearchOptions, search
    from autostrat.search.memory import peak_bytes

    net = GPT(layers=1, hidden=64, heads=8, seq=16, batch=8, vocab=128)
    graph = trace(net, *net.example_inputs(), device_num=8)
    megatron = search(apply_seeds(graph, megatron_seeds(1, 8), 8), 8)
    problem = build_problem(apply_seeds(graph, megatron_seeds(1, 8), 8), 8)
    megatron_peak = peak_bytes(problem, {n: problem.candidates[n].index(megatron.ops[n].strategy) for n in problem.candidates})
    automatic = search(graph, 8, SearchOptions(search_mode="integer_programming"))
    assert automatic.total_bytes == 0 < megatron.total_bytes  # unconstrained: pure data parallelism
    budgeted = search(graph, 8, SearchOptions(search_mode="integer_programming", max_device_memory=megatron_peak))
    assert budgeted.refinement.result.status == "OPTIMAL"
    assert budgeted.total_bytes <= megatron.total_bytes


def test_progress_is_reported():
    seen = []
    problem = small_problem(8, 7)
    refine(problem, propagate(problem).choice, progress=lambda objective, bound, seconds: seen.append((objective, bound)))
    assert seen and seen[-1][0] == brute_force(problem)


def test_the_bytes_objective_needs_no_room_for_the_tie_break(monkeypatch):
    # 1024-device plans sum to 2**52 bytes; a weighted sum of bytes and flops left 64 bits and
    # CP-SAT answered MODEL_INVALID. Bytes and flops are solved one after the other now: a limit
    # just above the bytes' sum is enough, and the bytes stay optimal.
    from autostrat.search import cpsat

    problem = small_problem(8, 3)
    hint = propagate(problem).choice
    ceiling = int(sum(np.nan_to_num(edge.table.full(), posinf=0).sum() for edge in problem.edges) + 10**6)
    monkeypatch.setattr(cpsat, "OBJECTIVE_LIMIT", ceiling)
    result = refine(problem, hint, coarsen_level="none")  # every variable kept: the objective has terms
    assert result.objective == brute_force(problem) and result.status == "OPTIMAL"


def quantised_flops(problem, choices: np.ndarray) -> np.ndarray:
    """The tie-break's value of every row of `choices` (`every_choice`) at coarsening "none":
    per op, its flops quantised to `TIE_LEVELS` levels between the op's least and most."""
    from autostrat.search.cpsat import TIE_LEVELS

    total = np.zeros(len(choices), dtype=np.int64)
    for column, op in enumerate(problem.candidates):
        flops = np.asarray(problem.costs[op].flops, dtype=float)
        if flops.max() > flops.min():
            total += np.floor((flops - flops.min()) / (flops.max() - flops.min()) * (TIE_LEVELS - 1)).astype(np.int64)[choices[:, column]]
    return total


@pytest.mark.parametrize("device_num, seed", CASES[::4])
def test_among_plans_of_the_optimal_bytes_the_fewest_flops_win(device_num, seed):
    problem = small_problem(device_num, seed)
    choices = every_choice(problem)
    paid = costs(problem, choices)
    least = paid.min()
    fewest = quantised_flops(problem, choices[paid == least]).min()
    result = refine(problem, propagate(problem).choice, time_limit=30, coarsen_level="none")
    chosen = np.array([[result.choice[op] for op in problem.candidates]])
    assert result.objective == least and quantised_flops(problem, chosen)[0] == fewest


def test_bytes_beyond_cp_sats_objective_are_refused_by_name(monkeypatch):
    from autostrat.search import cpsat

    problem = small_problem(8, 3)
    monkeypatch.setattr(cpsat, "OBJECTIVE_LIMIT", 1)
    with pytest.raises(SolverError, match="too large for CP-SAT's 64-bit objective"):
        refine(problem, propagate(problem).choice, coarsen_level="none")
