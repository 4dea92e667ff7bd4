"""`autostrat solve` and the IOPDDL solver: brute force over every assignment of small random
instances, a memory evaluator of its own that sums the usage at every time point, the example
instance, refused files and the command's output."""

from __future__ import annotations

import gzip
import itertools
import json
from pathlib import Path

import numpy as np
import pytest

from autostrat.cli import main
from autostrat.errors import ConfigError
from autostrat.search.solve.evaluate import is_feasible, peak_usage, solution_cost
from autostrat.search.solve.instance import read_instance
from autostrat.search.solve.solver import solve

EXAMPLE = str(Path(__file__).resolve().parent.parent / "configs" / "iopddl_example.json")
FORBIDDEN = 10 ** 18


def random_problem(seed: int, node_count: int, tree: bool = False, limit: bool = True, forbidden: float = 0.15) -> dict:
    """A problem in the file format: up to 3 strategies per node, a share of forbidden edge costs."""
    rng = np.random.default_rng(seed)
    counts = rng.integers(1, 4, node_count).tolist()
    costs = [[int(c) for c in rng.integers(0, 50, k)] for k in counts]
    usages = [[int(u) for u in rng.integers(0, 10, k)] for k in counts]
    starts = rng.integers(0, 8, node_count)
    intervals = [[int(a), int(a + rng.integers(0, 6))] for a in starts]
    pairs = [[int(rng.integers(0, v)), v] for v in range(1, node_count)]  # a spanning tree
    if not tree:
        pairs += [sorted(map(int, rng.choice(node_count, 2, replace=False))) for _ in range(node_count // 2)]
    edge_costs = []
    for u, v in pairs:
        matrix = rng.integers(0, 60, counts[u] * counts[v])
        matrix[rng.random(len(matrix)) < forbidden] = FORBIDDEN
        edge_costs.append([int(c) for c in matrix])
    problem = {"name": f"random{seed}", "nodes": {"costs": costs, "usages": usages, "intervals": intervals},
               "edges": {"nodes": pairs, "costs": edge_costs}}
    if limit:
        low = max(_peaks([min(u) for u in usages], intervals).values(), default=0)
        problem["usage_limit"] = int(low + rng.integers(0, 8))
    return {"problem": problem}


def _peaks(usages: list, intervals: list) -> dict:
    """The summed usage at every integer time point, interval by interval (no shared code)."""
    totals: dict = {}
    for usage, (start, end) in zip(usages, intervals):
        for point in range(start, end):
            totals[point] = totals.get(point, 0) + usage
    return totals


def brute_force(document: dict) -> tuple:
    """The cheapest assignment within the limit by trying every one: (cost, assignment)."""
    problem = document["problem"]
    nodes, edges = problem["nodes"], problem["edges"]
    best = (None, None)
    for assignment in itertools.product(*(range(len(c)) for c in nodes["costs"])):
        usages = [nodes["usages"][i][s] for i, s in enumerate(assignment)]
        if max(_peaks(usages, nodes["intervals"]).values(), default=0) > problem.get("usage_limit", float("inf")):
            continue
        cost = sum(nodes["costs"][i][s] for i, s in enumerate(assignment))
        for (u, v), flat in zip(edges["nodes"], edges["costs"]):
            cost += flat[assignment[u] * len(nodes["costs"][v]) + assignment[v]]
        if best[0] is None or cost < best[0]:
            best = (cost, list(assignment))
    return best


def written(tmp_path, document, name="problem.json") -> str:
    path = tmp_path / name
    path.write_text(json.dumps(document))
    return str(path)


@pytest.mark.parametrize("seed", range(12))
def test_solver_never_beats_brute_force_and_its_bound_never_exceeds_it(tmp_path, seed):
    document = random_problem(seed, node_count=6)
    instance = read_instance(written(tmp_path, document))
    optimum, _ = brute_force(document)
    result = solve(instance, 30.0, seed=seed, rounds=40, exhaustive_limit=0)
    assert optimum is not None and result.cost is not None
    assert result.cost >= optimum
    assert result.bound <= optimum
    if result.bound >= result.cost:  # proven: then it is the optimum
        assert result.cost == optimum
    usages = [document["problem"]["nodes"]["usages"][i][s] for i, s in enumerate(result.solution)]
    assert max(_peaks(usages, document["problem"]["nodes"]["intervals"]).values(), default=0) <= instance.limit


@pytest.mark.parametrize("seed", range(6))
def test_solver_finds_and_proves_the_optimum_of_a_tree_without_limit_or_forbidden_choices(tmp_path, seed):
    document = random_problem(100 + seed, node_count=7, tree=True, limit=False, forbidden=0.0)
    optimum, _ = brute_force(document)
    result = solve(read_instance(written(tmp_path, document)), 30.0, rounds=20, exhaustive_limit=0)
    assert (result.cost, result.bound) == (optimum, optimum)


@pytest.mark.parametrize("seed", range(20))
def test_peak_and_feasibility_agree_with_the_point_by_point_evaluator(tmp_path, seed):
    document = random_problem(200 + seed, node_count=8)
    instance = read_instance(written(tmp_path, document))
    nodes = document["problem"]["nodes"]
    rng = np.random.default_rng(seed)
    solution = [int(rng.integers(len(c))) for c in nodes["costs"]]
    expected = max(_peaks([nodes["usages"][i][s] for i, s in enumerate(solution)], nodes["intervals"]).values(),
                   default=0)
    assert peak_usage(instance, solution) == expected
    assert is_feasible(instance, solution) == (expected <= document["problem"]["usage_limit"])


def test_parallel_edges_and_self_loops_count_as_the_file_says(tmp_path):
    document = random_problem(7, node_count=5)
    problem = document["problem"]
    k = [len(c) for c in problem["nodes"]["costs"]]
    problem["edges"]["nodes"] += [[3, 1], [2, 2]]
    problem["edges"]["costs"] += [list(range(k[3] * k[1])), list(range(k[2] * k[2]))]
    instance = read_instance(written(tmp_path, document))
    optimum, assignment = brute_force(document)
    assert solution_cost(instance, assignment) == optimum


@pytest.mark.parametrize("seed", range(12))
def test_small_instances_are_tried_whole_and_proven(tmp_path, seed):
    document = random_problem(400 + seed, node_count=6)
    optimum, _ = brute_force(document)
    result = solve(read_instance(written(tmp_path, document)), 30.0, seed=seed, rounds=3)
    if optimum < FORBIDDEN:
        assert (result.cost, result.bound, result.rounds) == (optimum, optimum, 0)
        assert solution_cost(read_instance(written(tmp_path, document)), result.solution) == optimum
    else:  # every fitting solution takes a forbidden choice: nothing to prove, the search says what it finds
        assert result.cost >= FORBIDDEN and result.bound <= optimum


def test_an_instance_above_the_exhaustive_limit_is_searched(tmp_path):
    document = random_problem(7, node_count=6)
    instance = read_instance(written(tmp_path, document))
    assert solve(instance, 30.0, rounds=3, exhaustive_limit=1).rounds > 0


def test_example_is_solved_to_its_optimum_which_the_memory_limit_moves():
    result = solve(read_instance(EXAMPLE), 30.0, rounds=20, exhaustive_limit=0)
    document = json.loads(open(EXAMPLE).read())
    assert brute_force(document) == (360, [0, 0, 2, 1, 0])
    assert (result.solution, result.cost) == ([0, 0, 2, 1, 0], 360) and result.bound <= 360
    del document["problem"]["usage_limit"]
    assert brute_force(document)[0] == 330  # [0, 0, 1, 1, 0] peaks at 40, over the limit of 38


def test_gzipped_instance_reads_as_the_plain_one(tmp_path):
    path = tmp_path / "example.json.gz"
    path.write_bytes(gzip.compress(open(EXAMPLE, "rb").read()))
    assert solution_cost(read_instance(path), [0, 0, 2, 1, 0]) == 360


def test_command_prints_progress_then_the_solution_last(capsys):
    assert main(["solve", EXAMPLE, "2", "--json"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0] == "# cost 360 bound 360 after " + lines[0].split(" after ")[1]  # tried whole: proven
    figures = json.loads(lines[-2])
    assert figures["cost"] == 360 and figures["lower_bound"] == 360 and figures["usage_limit"] == 38
    assert figures["rounds"] == 0 and json.loads(lines[-1]) == [0, 0, 2, 1, 0]


def test_command_prints_an_empty_solution_when_nothing_fits(tmp_path, capsys):
    document = json.loads(open(EXAMPLE).read())
    document["problem"]["usage_limit"] = 30
    assert main(["solve", written(tmp_path, document), "2"]) == 1
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[-1] == "[]"
    assert lines[-2] == "# infeasible: the smallest peak found, 35, is above the usage limit 30"


BAD = [
    (lambda d: d.pop("problem"), "has no key problem"),
    (lambda d: d["problem"]["nodes"].pop("usages"), "has no key problem.nodes.usages"),
    (lambda d: d["problem"]["nodes"]["costs"].__setitem__(1, []), "problem.nodes.costs[1]: expected a non-empty list"),
    (lambda d: d["problem"]["nodes"]["costs"].__setitem__(2, [1, "x", 3]), "problem.nodes.costs[2]: expected a list of numbers"),
    (lambda d: d["problem"]["nodes"]["usages"].__setitem__(1, [1]), "problem.nodes.usages[1]: expected 2 numbers, got 1"),
    (lambda d: d["problem"]["nodes"]["usages"].__setitem__(0, [2.5]), "problem.nodes.usages[0]: expected integers, got [2.5]"),
    (lambda d: d["problem"]["nodes"]["intervals"].pop(), "problem.nodes.intervals: expected 5 intervals"),
    (lambda d: d["problem"]["nodes"]["intervals"].__setitem__(0, [1]), "problem.nodes.intervals[0]: expected [start, end]"),
    (lambda d: d["problem"]["edges"]["nodes"].__setitem__(4, [3, 9]), "problem.edges.nodes[4]: expected [u, v], two node indices below 5"),
    (lambda d: d["problem"]["edges"]["costs"].__setitem__(2, [1, 2]), "problem.edges.costs[2]: expected 4 numbers, got 2"),
    (lambda d: d["problem"]["edges"]["costs"].pop(), "problem.edges.costs: expected 5 lists (one per edge), got 4"),
    (lambda d: d["problem"].__setitem__("usage_limit", "big"), "problem.usage_limit: expected a number >= 0"),
    (lambda d: d["problem"]["nodes"]["costs"].__setitem__(0, [-1]), "problem.nodes.costs[0]: expected numbers >= 0"),
]


@pytest.mark.parametrize("spoil, message", BAD, ids=[message for _, message in BAD])
def test_malformed_instance_is_refused_by_key(tmp_path, capsys, spoil, message):
    document = json.loads(open(EXAMPLE).read())
    spoil(document)
    path = written(tmp_path, document)
    with pytest.raises(ConfigError, match=f"^{path}: .*"):
        read_instance(path)
    assert main(["solve", path, "1"]) == 2
    error = capsys.readouterr().err
    assert error.startswith(f"autostrat: error: {path}: ") and message in error


def test_file_that_is_neither_json_nor_gzip_is_refused(tmp_path, capsys):
    path = tmp_path / "broken.json.gz"
    path.write_bytes(b"\x1f\x8b not really gzip")
    assert main(["solve", str(path)]) == 2
    assert capsys.readouterr().err.startswith(f"autostrat: error: {path}: not a readable gzip file")
    plain = tmp_path / "broken.json"
    plain.write_text("{\"problem\": ")
    assert main(["solve", str(plain)]) == 2
    assert capsys.readouterr().err.startswith(f"autostrat: error: {plain}: not valid JSON at line 1")


def test_same_seed_and_rounds_give_the_same_solution_on_one_or_two_workers(tmp_path):
    instance = read_instance(written(tmp_path, random_problem(300, node_count=12)))
    first, again = (solve(instance, 30.0, seed=5, rounds=15, workers=2) for _ in range(2))
    alone = solve(instance, 30.0, seed=5, rounds=15)
    assert (first.solution, first.cost) == (again.solution, again.cost)
    assert first.cost <= alone.cost  # the second worker's best is kept only when better
