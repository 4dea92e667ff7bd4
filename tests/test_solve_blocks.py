"""The IOPDDL solver's CP-SAT block moves and its message-passing bound, against brute force over
every assignment of small random instances (`test_solve`'s generator and brute force)."""

from __future__ import annotations

import numpy as np
import pytest

from autostrat.search.solve.arrays import Arrays
from autostrat.search.solve.bound import lower_bound
from autostrat.search.solve.instance import read_instance
from autostrat.search.solve.moves import State, start
from autostrat.search.solve import neighbourhood
from autostrat.search.solve.neighbourhood import block_move, memory_block
from autostrat.search.solve.solver import solve
from autostrat.search.solve.trws import MessagePassing
from tests.test_solve import FORBIDDEN, _peaks, brute_force, random_problem, written


def _fits(document: dict, solution: list) -> bool:
    """The point-by-point evaluator of `test_solve`: every time point within the limit."""
    nodes = document["problem"]["nodes"]
    usages = [nodes["usages"][i][s] for i, s in enumerate(solution)]
    return max(_peaks(usages, nodes["intervals"]).values(), default=0) <= document["problem"]["usage_limit"]


def _cost(document: dict, solution: list) -> int:
    problem = document["problem"]
    nodes, edges = problem["nodes"], problem["edges"]
    total = sum(nodes["costs"][i][s] for i, s in enumerate(solution))
    for (u, v), flat in zip(edges["nodes"], edges["costs"]):
        total += flat[solution[u] * len(nodes["costs"][v]) + solution[v]]
    return total


def _started(tmp_path, seed: int, node_count: int) -> tuple:
    """The first random instance from `seed` on whose greedy start fits the limit and whose
    optimum takes no forbidden choice: (document, arrays, state)."""
    for offset in range(100):
        document = random_problem(seed * 100 + offset, node_count=node_count)
        arrays = Arrays(read_instance(written(tmp_path, document)))
        state = start(arrays)
        if _fits(document, arrays.expand(state.solution)) and brute_force(document)[0] < FORBIDDEN:
            return document, arrays, state
    raise AssertionError(f"no instance from seed {seed} starts within its limit")


@pytest.mark.parametrize("seed", range(8))
def test_a_block_of_every_group_reaches_the_optimum_and_keeps_the_limit(tmp_path, seed):
    document, arrays, state = _started(tmp_path, 60 + seed, node_count=7)
    before = _cost(document, arrays.expand(state.solution))
    change = block_move(state, list(range(arrays.node_count)), 5.0)
    after = arrays.expand(state.solution)
    assert _fits(document, after)
    assert _cost(document, after) == brute_force(document)[0]
    if before < FORBIDDEN:  # (a forbidden start's change is a float near 1e18)
        assert _cost(document, after) - before == change


@pytest.mark.parametrize("seed, rows", [(seed, 400) for seed in range(6)] + [(seed, 0) for seed in range(6)])
def test_a_memory_block_never_raises_the_cost_nor_breaks_the_limit(tmp_path, monkeypatch, seed, rows):
    monkeypatch.setattr(neighbourhood, "MEMORY_ROWS", rows)  # 0: answers over the rows left out are refused
    document, arrays, state = _started(tmp_path, 70 + seed, node_count=9)
    rng = np.random.default_rng(seed)
    costs = [_cost(document, arrays.expand(state.solution))]
    for _ in range(4):
        block_move(state, memory_block(state, rng, 3), 5.0)
        assert _fits(document, arrays.expand(state.solution))
        costs.append(_cost(document, arrays.expand(state.solution)))
    assert costs == sorted(costs, reverse=True)
    assert costs[-1] >= brute_force(document)[0]


@pytest.mark.parametrize("seed", range(12))
def test_the_bound_with_any_messages_and_multipliers_stays_below_the_optimum(tmp_path, seed):
    document = random_problem(800 + seed, node_count=6)
    arrays = Arrays(read_instance(written(tmp_path, document)))
    optimum, _ = brute_force(document)
    rng = np.random.default_rng(seed)
    passing = MessagePassing(arrays)
    multipliers = rng.random(arrays.point_count) * 5
    for forward in (True, False, True):
        passing.run_pass(arrays.costs, forward)
    arbitrary = {key: rng.random(len(message)) * 10 ** int(rng.integers(1, 20)) for key, message in passing.messages.items()}
    for messages in (passing.messages, arbitrary):
        assert lower_bound(arrays, None, messages=messages) <= optimum
        assert lower_bound(arrays, multipliers, messages=messages) <= optimum


@pytest.mark.parametrize("seed", range(4))
def test_message_passing_on_a_tree_makes_the_bound_the_optimum(tmp_path, seed):
    document = random_problem(900 + seed, node_count=9, tree=True, limit=False, forbidden=0.0)
    arrays = Arrays(read_instance(written(tmp_path, document)))
    passing = MessagePassing(arrays)
    for forward in (True, False) * 3:
        passing.run_pass(arrays.costs, forward)
    kept = np.zeros(len(arrays.edges), dtype=bool)  # no edge kept: the bound rests on the messages alone
    optimum = brute_force(document)[0]
    assert lower_bound(arrays, kept=kept, messages=passing.messages) == pytest.approx(optimum)


@pytest.mark.parametrize("seed", range(3))
def test_the_solver_ends_with_block_moves_that_reach_the_optimum(tmp_path, seed):
    document, _, _ = _started(tmp_path, 95 + seed, node_count=8)
    result = solve(read_instance(written(tmp_path, document)), 30.0, seed=seed, rounds=50, exhaustive_limit=0)
    assert _fits(document, result.solution)
    assert result.cost == _cost(document, result.solution) == brute_force(document)[0]
    assert result.rounds == 51  # 50 rounds could not prove it: one block move followed (a block of every group)
