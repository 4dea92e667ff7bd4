"""cost_model="time": the search minimises the predicted step time, in whole nanoseconds."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from autostrat.autodiff import Adam, Momentum, build_training
from autostrat.cli import main
from autostrat.cost import Hardware, op_cost
from autostrat.frontend import trace
from autostrat.frontend.config import load_config
from autostrat.frontend.run import plan_config
from autostrat.layout import FollowedStrategy
from autostrat.models import FFN
from autostrat.nn import Tensor
from autostrat.redistribution import cost_table
from autostrat.search import SearchOptions, search
from autostrat.search.problem import build_problem
from tests.test_lazy_tables import distinct_tables, planned

ROOT = Path(__file__).parent.parent
TIME = SearchOptions(cost_model="time")
ROUND = dict(device_flops=2e12, device_memory_bandwidth=1e12, intra_server_bandwidth=1e10, inter_server_bandwidth=1e9,
             intra_server_latency=1e-6, inter_server_latency=1e-5)


def choice_of(plan, problem) -> dict[str, int]:
    return {op: problem.candidates[op].index(plan.ops[op].strategy) for op in problem.candidates}


@pytest.mark.parametrize("optimizer", [Momentum(), Adam()], ids=["momentum", "adam"])
@pytest.mark.parametrize("mode", ["auto_parallel", "data_parallel"])
def test_the_objective_is_the_plans_predicted_step_time(optimizer, mode):
    net = FFN()
    net.dense1.matmul.shard(((2, 1), (1, 4)))
    graph = build_training(trace(net, Tensor(shape=(64, 64)), device_num=8), optimizer)
    hardware = Hardware(devices_per_server=4)
    plan = search(graph, 8, replace(TIME, mode=mode, hardware=hardware))
    problem = build_problem(plan.graph, 8, hardware=hardware)
    # Compute of every op (the optimiser's updates on their parameters' first readers) plus
    # every edge's redistribution time: the plan's predicted step, to the nanosecond.
    assert problem.cost(choice_of(plan, problem)) == plan.prediction.step_time_ns
    assert plan.cost_model == "time" and plan.prediction.phases["update"].compute_ns > 0


def test_the_tutorial_under_time_by_hand():
    # Servers of 4 at round speeds (see test_prediction). The partial sum after dense2.matmul,
    # wanted split by the consumer, is 6 144 bytes of ReduceScatter over the 4 devices of a
    # server: in one step, 3 messages of 1 µs + 615 ns; in two steps over halves of the axis,
    # 1 µs + 410 ns (4 096 bytes) and 1 µs + 205 ns (2 048 bytes), which is faster.
    net = FFN()
    net.dense1.matmul.shard(((2, 1), (1, 4)))
    plan = search(trace(net, Tensor(shape=(64, 64)), device_num=8), 8, replace(TIME, hardware=Hardware(**ROUND, devices_per_server=4)))
    [edge] = plan.redistributions
    assert [(step.kind, step.bytes) for step in edge.plan.steps] == [("ReduceScatter", 4096), ("ReduceScatter", 2048)]
    assert plan.total_bytes == 6144 and plan.prediction.communication_ns == 1410 + 1205
    assert plan.prediction.step_time_ns == 180 + 2615  # the compute of test_prediction's plan


def test_a_replicated_weight_pays_its_whole_update():
    graph = build_training(trace(FFN(), Tensor(shape=(64, 64))), Adam())
    hardware = Hardware()
    timed, counted = build_problem(graph, 8, hardware=hardware), build_problem(graph, 8)
    reader = "dense1.matmul"  # the first reader of dense1.weight, whose layout it chooses
    update = graph.ops["optimizer/dense1.weight"]
    dtypes = tuple(graph.tensors[t].dtype for t in update.inputs + update.outputs)
    for index, strategy in enumerate(timed.candidates[reader]):
        own = hardware.compute_nanoseconds(op_cost(strategy, ("float32",) * 3), ("float32",) * 3)
        layout = strategy.input_layouts[1]
        updated = hardware.compute_nanoseconds(op_cost(FollowedStrategy(update.rule, layout), dtypes), dtypes)
        assert timed.costs[reader].comm[index] == own + updated
        assert counted.costs[reader].comm[index] == 0  # bytes: no own cost, as before
    whole = [i for i, s in enumerate(timed.candidates[reader]) if s.input_layouts[1].parts == (1, 1)]
    split = [i for i, s in enumerate(timed.candidates[reader]) if s.input_layouts[1].parts == (8, 1)]
    # Adam over the whole [64, 64] weight on every device: 8 times the work of an eighth.
    assert whole and split and timed.costs[reader].comm[whole[0]] > timed.costs[reader].comm[split[0]]


def test_time_tables_are_lazy_and_exact(monkeypatch):
    lazy_plan, lazy_problem = planned(ROOT / "configs" / "gpt_train.yaml", 8, True, monkeypatch, cost_model="time")
    assert any(t.computed < t.size for t in distinct_tables(lazy_problem))
    lazy_tables = [edge.table.full() for edge in lazy_problem.edges]
    eager_plan, eager_problem = planned(ROOT / "configs" / "gpt_train.yaml", 8, False, monkeypatch, cost_model="time")
    assert eager_plan.to_json() == lazy_plan.to_json()
    for edge, lazy in zip(eager_problem.edges, lazy_tables):
        table = edge.table
        assert table.model is not None
        assert np.array_equal(lazy, cost_table(table.producer_layouts, table.consumer_layouts, table.dtype, table.model))


def test_time_shortens_the_gpt_step_and_bytes_plans_stay_as_they_were():
    config = load_config(ROOT / "configs" / "gpt_train.yaml")
    by_bytes, _ = plan_config(config)
    by_time, _ = plan_config(replace(config, context=replace(config.context, cost_model="time")))
    assert by_time.prediction.step_time_ns < by_bytes.prediction.step_time_ns
    assert by_bytes.total_bytes <= by_time.total_bytes  # each is the better plan of its own objective
    assert by_bytes.cost_model == "bytes" and json.loads(by_bytes.to_json())["cost_model"] == "bytes"
    again, _ = plan_config(replace(config, context=replace(config.context, cost_model="time")))
    assert again.to_json() == by_time.to_json()


def test_search_takes_the_cost_model_on_the_command_line(capsys):
    assert main(["search", "configs/ffn.yaml", "--cost-model", "time"]) == 0
    out = capsys.readouterr().out
    assert "cost model: time; hardware: h100-sxm-80gb: 989.4 TFLOP/s" in out and "predicted step time: " in out
    assert "ReduceScatter(axes (1,) dim 1, 4096B) -> ReduceScatter(axes (0,) dim 1, 2048B); 6144B" in out


def test_cp_sat_refines_the_predicted_time():
    config = load_config(ROOT / "configs" / "ffn.yaml", phase="train", cost_model="time", refine="cpsat")
    plan, _ = plan_config(config)
    refinement = plan.refinement
    assert refinement.unit == "ns" and "ns per device" in refinement.summary()
    assert refinement.result.objective == plan.prediction.step_time_ns <= refinement.before
    assert refinement.result.status == "OPTIMAL"


def test_a_seed_conflict_under_time_is_told_in_nanoseconds():
    from tests.test_search import Diamond

    net = Diamond()
    net.relu.shard(((8, 1),))
    net.sigmoid.shard(((1, 8),))
    plan = search(trace(net, Tensor(shape=(64, 32)), device_num=8), 8, TIME)
    [warning] = [w for w in plan.warnings if w.startswith("seeds of relu and sigmoid disagree")]
    assert warning.endswith(" ns per device is inserted")
