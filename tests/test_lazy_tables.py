"""Lazy cost tables are exact: every entry they compute equals the eager table's, the plans
they lead to are byte-identical, and propagation computes a small share of the entries."""

from __future__ import annotations

import importlib
from pathlib import Path

import numpy as np
import pytest

from autostrat.frontend.config import load_config
from autostrat.frontend.run import plan_config
from autostrat.redistribution import LazyCostTable, cost_table
from autostrat.redistribution.memo import clear_memos
from autostrat.rules import make_rule
from autostrat.search import problem as problem_module
from autostrat.search import problem_edges
from autostrat.strategies import generate_strategies

# `autostrat.search.search` is the function re-exported by the package; the module is wanted here.
search_module = importlib.import_module("autostrat.search.search")
CONFIGS = sorted((Path(__file__).parent.parent / "configs").glob("*.yaml"))


def planned(path: Path, device_num: int, lazy: bool, monkeypatch, **overrides):
    """The plan of a shipped config and the problem it was searched on, every memo cleared
    first so that the lazy and the eager runs compute their entries independently."""
    found = []

    def build(*args, **kwargs):
        found.append(problem_module.build_problem(*args, lazy=lazy, **kwargs))
        return found[-1]

    monkeypatch.setattr(search_module, "build_problem", build)
    clear_memos()
    problem_edges.edge_table.cache_clear()
    plan, _ = plan_config(load_config(path, **overrides), device_num)
    return plan, found[0]


def distinct_tables(problem) -> list[LazyCostTable]:
    return list({id(edge.table): edge.table for edge in problem.edges}.values())


# Every config at 8 devices; at 16 those whose eager tables fill in seconds (the GPTs' take
# 20-30 s each, llama_train's 227 s, deepseek_train's 73 s: `tests/test_scale.py` checks lazy
# entries at 64 and 1024 devices on random pairs).
LARGE = ("deepseek_train", "gpt", "gpt_train", "llama_train", "moe_train", "transformer_stack")
CASES = [(path, 8) for path in CONFIGS] + [(path, 16) for path in CONFIGS if path.stem not in LARGE]


@pytest.mark.parametrize(("path", "device_num"), CASES, ids=[f"{path.stem}-{n}" for path, n in CASES])
def test_lazy_tables_and_plans_equal_the_eager_ones(path, device_num, monkeypatch):
    lazy_plan, lazy_problem = planned(path, device_num, True, monkeypatch)
    assert any(t.computed < t.size for t in distinct_tables(lazy_problem))  # the search left entries out
    lazy_tables = [edge.table.full() for edge in lazy_problem.edges]
    eager_plan, eager_problem = planned(path, device_num, False, monkeypatch)
    assert eager_plan.to_json() == lazy_plan.to_json()
    assert eager_plan.total_bytes == lazy_plan.total_bytes
    assert len(eager_problem.edges) == len(lazy_problem.edges)
    for edge, lazy in zip(eager_problem.edges, lazy_tables):
        table = edge.table
        # A pipeline's sync tables weigh 1/m (a micro-batch graph: `problem.build_problem`).
        eager = cost_table(table.producer_layouts, table.consumer_layouts, table.dtype) * table.scale
        assert np.array_equal(table.full(), eager)  # the eager run filled it in one `cost_table` call
        assert np.array_equal(lazy, eager), f"{edge.tensor} -> {edge.consumer}[{edge.input_index}]"


def test_lazy_rows_and_columns_of_a_64_device_table_equal_the_eager_table():
    shape = (4096, 4096)  # the tutorial MatMul edge, as in benchmarks/redistribution.py
    candidates = generate_strategies(make_rule("MatMul", [shape, shape]), 64)
    producers, consumers = [s.output_layouts[0] for s in candidates], [s.input_layouts[0] for s in candidates]
    clear_memos()
    table = LazyCostTable(producers, consumers)
    rng = np.random.default_rng(14)
    rows = rng.choice(table.shape[0], 3, replace=False)
    columns = rng.choice(table.shape[1], 2, replace=False)
    read_rows = {int(i): table[i, :] for i in rows}
    read_columns = {int(j): table[:, j] for j in columns}
    single = table[int(rows[0]), int(columns[0])]
    assert table.computed == 3 * table.shape[1] + 2 * table.shape[0] - 6 < table.size
    clear_memos()  # the eager table is priced afresh, not read from the lazy one's memo
    eager = cost_table(producers, consumers)
    for i, row in read_rows.items():
        assert np.array_equal(row, eager[i, :])
    for j, column in read_columns.items():
        assert np.array_equal(column, eager[:, j])
    assert single == eager[rows[0], columns[0]]
    assert np.array_equal(table.full(), eager) and np.array_equal(np.asarray(table), eager)


def test_single_entries_read_before_and_after_they_are_known_equal_the_eager_table():
    shape = (64, 64)
    candidates = generate_strategies(make_rule("MatMul", [shape, shape]), 8)
    producers, consumers = [s.output_layouts[0] for s in candidates], [s.input_layouts[0] for s in candidates]
    eager = cost_table(producers, consumers)
    table = LazyCostTable(producers, consumers)
    keys = [(0, 0), (1, 2), (np.int64(2), np.int64(1)), (-1, -2), (np.int32(3), 4)]
    first = [table[key] for key in keys]  # computed on reading
    computed = table.computed
    again = [table[key] for key in keys]  # known: read without filling
    assert table.computed == computed == len(keys)
    assert first == again == [float(eager[key]) for key in keys] and all(type(value) is float for value in again)
    table[1, :]
    assert [table[1, j] for j in range(table.shape[1])] == [float(value) for value in eager[1, :]]


def test_lazy_table_reads_copies_and_its_full_table_is_read_only():
    shape = (64, 64)
    candidates = generate_strategies(make_rule("MatMul", [shape, shape]), 4)
    table = LazyCostTable([s.output_layouts[0] for s in candidates], [s.input_layouts[0] for s in candidates])
    row = table[1]
    row[:] = -1.0
    assert (table[1, :] >= 0).all() and table.computed == table.shape[1]
    with pytest.raises(ValueError):
        table.full()[0, 0] = 1.0
    assert table[np.ix_([0, 1], [0])].shape == (2, 1)  # any other index reads the full table


@pytest.mark.slow
def test_propagation_computes_a_small_share_of_the_entries(monkeypatch):
    # Every divisor a candidate split (mesh "full"): the tables of 64 devices at their largest.
    _, problem = planned(CONFIGS[[p.stem for p in CONFIGS].index("gpt")], 64, True, monkeypatch, mesh="full")
    tables = distinct_tables(problem)
    computed, size = sum(t.computed for t in tables), sum(t.size for t in tables)
    # Measured: 3208 of 405925 entries (0.8 %) of 31 distinct tables over 75 edges; 2246
    # redistribution searches, where the eager tables took 35506.
    assert computed / size < 0.02
