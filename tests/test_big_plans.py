"""Issue #33's fast paths for big plans (126 layers on 16 384 devices: benchmarks/big_plans.py)
keep results exact: each against the slow path it replaces, on small models."""

from __future__ import annotations

import gc
import json
import os
from pathlib import Path

import numpy as np

import pytest

from autostrat import cli
from autostrat.errors import ConfigError
from autostrat.io import OutputPath, write_files_atomically
from autostrat.frontend.config import load_config
from autostrat.frontend.run import plan_config
from autostrat.models.gpt import causal_mask
from autostrat.redistribution.algorithms import plan_with_algorithms
from autostrat.rules.notation import _parsed, parse_equation
from autostrat.search import plan as plan_module
from autostrat.search.op_candidates import can_be_partial

ROOT = Path(__file__).parent.parent


class _EveryEdgeAlone:
    """`shared_plans.PlanMemo` without its memo: every edge and writeback planned by itself."""

    def __init__(self, model, timing, cost_model):
        self.model, self.timing, self.cost_model = model, timing, cost_model

    def __call__(self, src, dst, dtype):
        return plan_with_algorithms(src, dst, dtype, self.model, self.timing, self.cost_model)


def _training_plan():
    return plan_config(load_config(ROOT / "configs" / "gpt_train.yaml"))[0]


def test_repeated_edges_share_one_plan_and_plan_as_each_alone(monkeypatch):
    shared = _training_plan()
    monkeypatch.setattr(plan_module, "PlanMemo", _EveryEdgeAlone)
    alone = _training_plan()
    assert shared.to_json() == alone.to_json() and shared.table() == alone.table()
    assert shared.to_json() == json.dumps(shared.to_dict(), indent=1) + "\n"  # chunks, shared primitives: the same text
    plans = [edge.plan for edge in shared.redistributions if not edge.shares] + [w.plan for w in shared.writebacks]
    assert len({id(plan) for plan in plans}) < len(plans)  # the two layers' edges share plans
    assert len({id(edge.plan) for edge in alone.redistributions if not edge.shares}) == sum(
        not edge.shares for edge in alone.redistributions)


def test_bytes_into_an_op_sum_its_edges():
    plan = _training_plan()
    sums = [sum(edge.cost for edge in plan.redistributions if edge.consumer == name) for name in plan.ops]
    assert [plan.bytes_into(name) for name in plan.ops] == sums and any(sums)


def test_a_search_never_makes_the_causal_mask_and_a_run_reads_the_eager_one():
    config = load_config(ROOT / "configs" / "llama_train.yaml")
    plan_config(config)
    masks = [block.attention.causal_mask for block in config.net.blocks]
    assert all(mask._data is None and mask.has_data for mask in masks)
    eager = np.triu(np.full((16, 16), -1e9, np.float32), k=1)
    assert all(np.array_equal(mask.asnumpy(), eager) for mask in masks)
    assert masks[0].asnumpy() is causal_mask(16) and not masks[0].asnumpy().flags.writeable


def test_an_equation_parses_once_as_it_parses_fresh():
    for equation in ("m k, k n -> m n", "(a b) c -> a b c", "b s h, h -> b s h", "1 n -> n"):
        assert parse_equation(equation) == _parsed.__wrapped__(equation) == parse_equation(equation)
    for _ in range(2):  # an error is raised every time, never remembered as a result
        try:
            parse_equation("m m -> m")
        except ValueError as error:
            assert "appears twice" in str(error)
        else:
            raise AssertionError("a repeated factor parsed")


def test_plan_commands_pause_the_collector_and_restore_it(monkeypatch, capsys):
    seen = []
    monkeypatch.setattr(cli, "candidates_text", lambda *args: seen.append(gc.isenabled()) or "")
    assert gc.isenabled() and cli.main(["candidates", "--device-num", "8"]) == 0
    assert seen == [False] and gc.isenabled()


def test_text_in_chunks_is_written_as_the_whole_text(tmp_path, capfdbinary):
    chunks = ["{", '"a": ', "[1, 2]", "}", "\n"]
    write_files_atomically({tmp_path / "chunks.json": iter(chunks), tmp_path / "text.json": "".join(chunks)})
    assert (tmp_path / "chunks.json").read_bytes() == (tmp_path / "text.json").read_bytes() == b'{"a": [1, 2]}\n'
    write_files_atomically({OutputPath("-", "--out", stdout=True): iter(chunks)})
    assert capfdbinary.readouterr().out == b'{"a": [1, 2]}\n'
    with pytest.raises(ConfigError, match="not encodable as UTF-8"):
        write_files_atomically({tmp_path / "bad.json": iter(["{", "\udc80", "}"])})
    assert sorted(os.listdir(tmp_path)) == ["chunks.json", "text.json"]  # no temporary, no half-written file


def test_partial_sums_answered_from_earlier_calls_as_fresh():
    graph = _training_plan().graph
    seen: dict = {}
    shared = [can_be_partial(graph, tensor, seen) for tensor in graph.tensors]
    assert shared == [can_be_partial(graph, tensor) for tensor in graph.tensors] and any(shared) and not all(shared)


def test_recomputed_ops_found_from_the_backward_reads_once_as_scanned_per_unit():
    from autostrat.autodiff import build_backward
    from autostrat.autodiff.recompute import _copied, _units, recompute_cells
    from autostrat.frontend import trace
    from autostrat.models import GPT

    net = GPT(layers=2, hidden=16, heads=2, seq=4, batch=2, vocab=32)
    traced = trace(net, *net.example_inputs())
    graph, forward, cells = build_backward(traced), set(traced.ops), ("blocks.0", "blocks.1.ffn1")
    read_back = {graph.tensors[t].producer for name, op in graph.ops.items() if name not in forward for t in op.inputs}
    units = _units(graph, cells, forward)
    for inside in units.values():
        scanned = {graph.tensors[t].producer for name, op in graph.ops.items() if name not in forward
                   for t in op.inputs if graph.tensors[t].producer in inside}  # the slow scan, per unit
        found, stack = set(), list(scanned)
        while stack:
            name = stack.pop()
            if name not in found:
                found.add(name)
                stack += [p for t in graph.ops[name].inputs if (p := graph.tensors[t].producer) in inside]
        assert _copied(graph, inside, read_back) == found and found
    copies = [name.removeprefix("recompute/") for name in recompute_cells(graph, cells, forward).ops if name.startswith("recompute/")]
    for inside in units.values():  # each unit's copies in forward order
        assert [name for name in copies if name in inside] == [name for name in graph.ops if name in inside and name in copies]
    assert len(copies) > len(units)


def test_searches_within_the_coarse_bound_cost_what_unbounded_ones_do():
    from autostrat.cost import dtype_size
    from autostrat.redistribution.memo import clear_memos
    from autostrat.redistribution.planner import _coarse_bound, redistribution_cost
    from autostrat.redistribution.solving import solve_cost, solve_layouts
    from tests.test_scale import random_pairs

    clear_memos()  # the bounded searches run cold, not on answers the unbounded ones left
    producers, consumers, pairs = random_pairs(1024, 12, seed=33)
    bounded = [redistribution_cost(producers[i], consumers[j]) for i, j in pairs]
    bounds = [_coarse_bound(producers[i].normalized(), consumers[j].normalized(), dtype_size("float32")) for i, j in pairs]
    clear_memos()
    unbounded = [solve_layouts(producers[i], consumers[j], dtype_size("float32"), None, solve_cost)[1][1] for i, j in pairs]
    assert bounded == unbounded
    assert all(bound >= cost for bound, cost in zip(bounds, unbounded)) and sum(bound < float("inf") for bound in bounds) >= 3
