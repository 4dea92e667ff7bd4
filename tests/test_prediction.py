"""A plan's predicted step time, bytes per phase and peak memory per device."""

from __future__ import annotations

import importlib
import json
import random
from dataclasses import replace

import pytest

from autostrat.autodiff import Adam, Momentum, build_training
from autostrat.cost import Hardware
from autostrat.errors import InfeasibleError
from autostrat.frontend import trace
from autostrat.frontend.train import synthetic_batches
from autostrat.models import FFN
from autostrat.nn import Tensor
from autostrat.runtime.executor import graph_values
from autostrat.runtime.training import train_locally
from autostrat.search import SearchOptions, search
from autostrat.search.memory import peak_bytes
from autostrat.search.plan import build_plan
from autostrat.search.problem import build_problem
from autostrat.search.search import follow_parameters

# Round numbers: float32 ops run at 1 TFLOP/s (half of device_flops), 1 byte of memory traffic
# per ps, 1 µs and 10 GB/s inside a server, 10 µs and 1 GB/s across.
ROUND = dict(device_flops=2e12, device_memory_bandwidth=1e12, intra_server_bandwidth=1e10, inter_server_bandwidth=1e9,
             intra_server_latency=1e-6, inter_server_latency=1e-5)


def tutorial_plan(hardware: Hardware):
    net = FFN()
    net.dense1.matmul.shard(((2, 1), (1, 4)))
    return replace(search(trace(net, Tensor(shape=(64, 64)), device_num=8), 8), hardware=hardware)


def test_the_tutorial_plan_on_two_servers_of_four_by_hand():
    plan = tutorial_plan(Hardware(**ROUND, devices_per_server=4))
    # Per device, float32: each MatMul [32, 64] x [64, 16] (or [32, 16] x [16, 64]) is 65 536 flops
    # (66 ns) and 3 584 elements read and written (14 336 bytes, 15 ns); each BiasAdd and the ReLU
    # 512 flops (1 ns) and 4 160 or 4 096 bytes (5 ns).
    assert plan.prediction.phases["forward"].compute_ns == 2 * (66 + 15) + 3 * (1 + 5)
    # The one redistribution, a ReduceScatter of 6 144 bytes over the 4 devices of a server:
    # 3 ring messages of 1 µs and 6 144 bytes at 10 GB/s.
    [edge] = plan.redistributions
    assert edge.plan.cost == 6144 and plan.prediction.phases["forward"].communication_ns == 3 * 1000 + 615
    assert plan.prediction.step_time_ns == 180 + 3615
    assert plan.prediction.phases["forward"].bytes == plan.total_bytes == 6144


def test_a_group_across_servers_pays_the_network():
    # Servers of 2: the ReduceScatter's group of 4 spans two servers, so each message and byte
    # goes at the network's speed.
    plan = tutorial_plan(Hardware(**ROUND, devices_per_server=2))
    assert plan.prediction.phases["forward"].communication_ns == 3 * 10_000 + 6144


def training_graph(optimizer):
    return build_training(trace(FFN(), Tensor(shape=(64, 64))), optimizer)


@pytest.mark.parametrize("optimizer", [Momentum(), Adam()], ids=["momentum", "adam"])
def test_the_predicted_peak_is_what_every_rank_measures_on_random_choices(optimizer):
    """Random strategies of the FFN's training step: every rank's peak, measured from the arrays
    it holds (`runtime.held_memory`), equals the plan's prediction; the solver's per-op model,
    which leaves the redistributed copies out, is never above it."""
    graph = training_graph(optimizer)
    problem = build_problem(graph, 8)
    rng = random.Random(7)
    for _ in range(4):
        choice = {op: rng.randrange(len(options)) for op, options in problem.candidates.items()}
        strategies = {op: problem.candidates[op][index] for op, index in choice.items()}
        origins = dict.fromkeys(graph.ops, "chosen")
        for name, (strategy, _) in follow_parameters(graph, strategies, 8).items():
            strategies[name] = strategy
        plan = build_plan(graph, 8, "auto_parallel", strategies, origins, ())
        measured = train_locally(plan, graph_values(plan.graph, {}), synthetic_batches(plan.graph, 1)).measured_peaks
        assert set(measured) == {plan.prediction.peak_bytes}, (choice, measured, plan.prediction.peak_bytes)
        assert 0 < peak_bytes(problem, choice) <= min(measured), (choice, peak_bytes(problem, choice), measured)


def test_every_phase_is_predicted_and_its_bytes_are_what_the_busiest_rank_sends():
    """Per phase, the prediction's bytes and the plan's `phase_bytes` (two sums of the plan's
    own edge costs) both equal what the busiest rank's sends counted (`runtime.wire`)."""
    plan = search(training_graph(Momentum()), 8, SearchOptions(mode="data_parallel"))
    phases = plan.prediction.phases
    assert list(phases) == ["forward", "backward", "sync", "update"]
    measured = train_locally(plan, graph_values(plan.graph, {}), synthetic_batches(plan.graph, 1)).measured
    sent = {phase: max(rank[phase] for rank in measured) for phase in phases}
    assert sent["sync"] > 0 and {name: phase.bytes for name, phase in phases.items()} == sent == plan.phase_bytes()
    assert phases["sync"].communication_ns > 0 and phases["sync"].compute_ns == 0
    assert phases["update"].compute_ns > 0  # the optimiser's updates compute too


def test_the_table_and_the_json_carry_the_prediction():
    plan = tutorial_plan(Hardware())
    text = plan.table()
    assert "cost model: bytes; hardware: 989.4 TFLOP/s (16-bit)" in text
    assert f"predicted step time: {plan.prediction.step_time_ns / 1000:.3f} us" in text
    assert f"peak memory per device: {plan.prediction.peak_bytes} bytes" in text
    data = json.loads(plan.to_json())
    assert list(data)[-3:] == ["cost_model", "hardware", "predicted"]
    assert data["predicted"]["step_time_ns"] == plan.prediction.step_time_ns
    assert data["predicted"]["phases"]["forward"]["bytes"] == 6144
    assert data["hardware"]["devices_per_server"] == 8


def test_the_budget_retry_never_asks_below_what_the_parameters_need(monkeypatch):
    """Plans made to peak far over the budget (their copies, say): the retry tightens the
    solver's budget, down to the bytes the parameters and state alone need and never below,
    then says no plan fits."""
    search_module = importlib.import_module("autostrat.search.search")
    from autostrat.search.memory import resident_floor

    graph = training_graph(Momentum())
    floor = resident_floor(build_problem(graph, 8))
    prediction_module = importlib.import_module("autostrat.search.prediction")
    asked, solve, plan_peak = [], search_module.refine, prediction_module.plan_peak

    def recorded(problem, choice, time_limit, workers, budget, *args, **kwargs):
        asked.append(budget)
        return solve(problem, choice, time_limit, workers, budget, *args, **kwargs)

    monkeypatch.setattr(search_module, "refine", recorded)
    monkeypatch.setattr(prediction_module, "plan_peak", lambda plan: 100 * plan_peak(plan))
    budget = 200_000
    with pytest.raises(InfeasibleError, match=f"no plan found whose run fits max_device_memory = {budget:,} bytes per device"):
        search(graph, 8, SearchOptions(max_device_memory=budget, refine_time_limit=120))
    assert asked[0] == budget and min(asked) == floor and len(asked) >= 2, (asked, floor)
