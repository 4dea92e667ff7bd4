"""Brute force over every choice of a small search problem, all choices at once (numpy).

The oracles of the solver tests (test_refine, test_sharing, test_coarsen) enumerate every
combination of candidates. Evaluating `SearchProblem.cost` once per combination took most of
the suite's solver-test time (about 0.35 ms each, tens of thousands per case); here each op's
costs, each edge's table and each tensor's bytes are looked up for every combination in one
indexing step. This is a second, independent reading of the cost model's rules (own costs plus
every edge, readers of one tensor in one layout paying once): `test_brute_force.py` checks it
against `SearchProblem.cost` and `memory.peak_bytes` on every random case.
"""

from __future__ import annotations

import numpy as np


def every_choice(problem) -> np.ndarray:
    """Every combination of candidate indices, one row each, ops in `problem.candidates`' order
    and rows in `itertools.product`'s order (the last op varies fastest).

    Example:
        >>> from types import SimpleNamespace
        >>> every_choice(SimpleNamespace(candidates={"a": (0, 1), "b": (0, 1, 2)})).tolist()
        [[0, 0], [0, 1], [0, 2], [1, 0], [1, 1], [1, 2]]
    """
    sizes = [len(candidates) for candidates in problem.candidates.values()]
    return np.indices(sizes).reshape(len(sizes), -1).T


def choice_at(problem, row: np.ndarray) -> dict[str, int]:
    """The choice (op -> candidate index) of one row of `every_choice`."""
    return {op: int(index) for op, index in zip(problem.candidates, row)}


def costs(problem, choices: np.ndarray, shared: bool = True) -> np.ndarray:
    """The cost of every row of `choices`: the ops' own costs plus every edge's table entry;
    with `shared`, of the readers of one tensor from one producer that want it in one layout
    only the first (in edge order) pays, unless the edge synchronises gradients or reads a
    parameter its producer keeps sharded at rest (each such reader pays its own gather)."""
    column = {op: index for index, op in enumerate(problem.candidates)}
    total = np.zeros(len(choices))  # summed as floats and truncated once, as `SearchProblem.cost` sums
    for op, index in column.items():
        total += np.asarray(problem.costs[op].comm, dtype=float)[choices[:, index]]
    paid_keys: dict[tuple, list[np.ndarray]] = {}  # (tensor, producer) -> wanted-layout ids of the readers that paid
    ids: dict = {}  # normalised layout -> its id, for this call's comparisons
    for edge in problem.edges:
        producer, consumer = choices[:, column[edge.producer]], choices[:, column[edge.consumer]]
        table = np.array([[edge.table[i, j] for j in range(len(problem.candidates[edge.consumer]))]
                          for i in range(len(problem.candidates[edge.producer]))], dtype=float)
        pays = np.ones(len(choices), dtype=bool)
        if shared and not edge.sync:
            resting = np.array([edge.from_input and edge.output_index in candidate.at_rest
                                for candidate in problem.candidates[edge.producer]])[producer]
            wanted = _layout_ids(problem, edge, ids)[consumer]
            earlier = paid_keys.setdefault((edge.tensor, edge.producer), [])
            for key in earlier:
                pays &= resting | (key != wanted)
            earlier.append(np.where(resting, -1, wanted))
        total += np.where(pays, table[producer, consumer], 0)
    assert np.isfinite(total).all(), "a choice with no redistribution path: brute force over finite costs only"
    return total.astype(np.int64)


def _layout_ids(problem, edge, ids: dict) -> np.ndarray:
    """Per candidate of the edge's consumer, an id of the (normalised) layout it wants the
    tensor in: equal ids for equal layouts, across the edges sharing `ids`."""
    wanted = [candidate.input_layouts[edge.input_index].normalized() for candidate in problem.candidates[edge.consumer]]
    return np.array([ids.setdefault(layout, len(ids)) for layout in wanted], dtype=np.int64)


def peaks(problem, choices: np.ndarray) -> np.ndarray:
    """The per-device peak of every row of `choices`: the resident tensors' bytes plus the
    largest sum of activations live at one step (`memory.tensor_bytes`, `memory.live_sets`)."""
    from autostrat.search.memory import live_sets, tensor_bytes

    column = {op: index for index, op in enumerate(problem.candidates)}
    resident, activations = tensor_bytes(problem)

    def held(item) -> np.ndarray:
        return np.asarray(item.bytes, dtype=np.int64)[choices[:, column[item.owner]]]

    base = sum((held(item) for item in resident), np.zeros(len(choices), dtype=np.int64))
    sizes = [held(item) for item in activations]
    live = np.zeros(len(choices), dtype=np.int64)
    for step in live_sets(problem, activations):
        live = np.maximum(live, sum((sizes[i] for i in step), np.zeros(len(choices), dtype=np.int64)))
    return base + live
