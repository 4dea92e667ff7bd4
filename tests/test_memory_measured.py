"""Memory that matches the run (issue #16): every rank counts the live bytes of its own buffers
as it executes (`executor.RankResult.peak_bytes`), and its peak equals the plan's predicted peak
per device (`search.buffers.plan_peak`; the issue asks for 5 %) on every shipped training config
and on the small GPT; buffers are dropped after their last use."""

from __future__ import annotations

import ast
import math
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from autostrat import nn, reset_auto_parallel_context, set_auto_parallel_context
from autostrat.frontend import trace
from autostrat.frontend.config import load_config
from autostrat.frontend.run import plan_config
from autostrat.frontend.train import TrainOneStepCell, WithLossCell, reference_graph, synthetic_batches, training_plan, world_size
from autostrat.layout import SliceContext
from autostrat.models import FFN, GPT, megatron_seeds, tutorial_plan
from autostrat.autodiff import Adam, Momentum, build_training
from autostrat.runtime import executor, held_memory
from autostrat.runtime.held_memory import HeldBlocks, held_bytes
from autostrat.runtime.executor import execute, graph_values, release_schedule
from autostrat.runtime.local import LocalCluster
from autostrat.runtime.program import lower_programs
from autostrat.runtime.instructions import Compute, Load, Program
from autostrat.runtime.report import memory_line
from autostrat.runtime.training import train_locally
from autostrat.search import SearchOptions, search

ROOT = Path(__file__).resolve().parent.parent
TRAINING_CONFIGS = sorted(path.name for path in (ROOT / "configs").glob("*.yaml")
                          if "optimizer" in yaml.safe_load(path.read_text()) or yaml.safe_load(path.read_text()).get("phase") == "train")
TOLERANCE = 0.05


@pytest.fixture(autouse=True)
def _reset():
    yield
    reset_auto_parallel_context()


def assert_peaks_match(result, what: str, overlapped: bool = False) -> None:
    measured = result.measured_peaks
    per_rank = result.predicted_peaks or (result.predicted_peak,) * len(measured)  # a pipeline's stages differ
    assert min(per_rank, default=0) > 0 and len(measured) > 0, f"{what}: no peak predicted ({per_rank}) or measured ({measured})"
    for rank, (peak, predicted) in enumerate(zip(measured, per_rank)):
        # The prediction follows the rank's buffers (`search.buffers`): equal, not just within
        # the 5 % (kept as the bound a change may never exceed). With the sync in
        # buckets (`overlapped`), an edge's result is held from when the stream finishes it, which
        # the ranks' timing decides, beside what the backward still holds: within 1 %.
        close = abs(peak / predicted - 1) <= 0.01 if overlapped else peak == predicted
        assert close, (f"{what}, rank {rank}: measured peak {peak} bytes, predicted {predicted} "
                       f"(ratio {peak / predicted:.4f}; the issue allows 1 +- {TOLERANCE} at most)")


def test_every_training_config_is_found():
    assert {"gpt_train.yaml", "transformer_stack.yaml"} <= set(TRAINING_CONFIGS)


def updated_bytes(plan) -> int:
    """Per device, the bytes of the parameters and optimiser state a step updates, each in the
    layout it is stored in: what every rank holds all along, so a floor of its peak."""
    return sum(math.prod(plan.layouts[name].slice_shape) * np.dtype(plan.graph.tensors[name].dtype).itemsize
               for name, _ in plan.graph.updates)


@pytest.mark.parametrize("config", TRAINING_CONFIGS)
def test_measured_peak_of_a_training_config_is_within_5_percent(config):
    plan, _ = plan_config(load_config(ROOT / "configs" / config))
    graph = reference_graph(plan)
    result = train_locally(plan, graph_values(graph, {}), synthetic_batches(graph, 2))
    assert len(result.measured_peaks) == world_size(plan)
    assert_peaks_match(result, config, overlapped=bool(plan.bucket_bytes))  # transformer_stack.yaml's buckets
    # Every rank holds at least its parameters and state; and the search's own memory model
    # (what max_device_memory bounds: the per-op model, or a pipeline's stage split model per
    # stage) is within 10 % of what was measured.
    assert min(result.measured_peaks) > updated_bytes(plan) / (1 if plan.pipeline is None else plan.pipeline.split.stages)
    models = search_models(plan)
    group = len(result.measured_peaks) // len(models)  # a stage's ranks are consecutive
    for stage, model in enumerate(models):
        ratio = model / max(result.measured_peaks[stage * group:(stage + 1) * group])
        assert abs(ratio - 1) <= 0.10, f"{config}, stage {stage}: the search's memory model is {ratio:.3f} x the measured peak"


def search_models(plan) -> tuple[int, ...]:
    """The search's memory model of `plan`, per stage (one for a plan without stages)."""
    return plan.pipeline.split.peak_bytes if plan.pipeline is not None else (plan.prediction.model_peak_bytes,)


def test_the_measuring_module_reads_nothing_of_the_prediction():
    """The measurement (`runtime.held_memory`) imports numpy and the standard library only: no
    bookkeeping (`cost.live_bytes`), no plan, no search."""
    tree = ast.parse((ROOT / "autostrat" / "runtime" / "held_memory.py").read_text())
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert imported == {"__future__", "tracemalloc", "numpy"}, imported


def test_held_memory_is_what_tracemalloc_traces_in_numpys_domain(monkeypatch):
    """On one rank alone in the process, the arrays the rank holds at each sample are exactly
    numpy's allocations tracemalloc traces beyond those alive before the step (the whole
    arrays the run slices from)."""
    plan = tutorial_plan(seed=None, device_num=1, optimizer=Adam())
    program = lower_programs(plan)[0]
    values = graph_values(plan.graph, {}) | synthetic_batches(plan.graph, 1)[0]
    traced, note = [], held_memory.HeldMemory.note

    def both(memory, held: int):
        note(memory, held)
        traced.append(held_memory.numpy_traced_bytes())

    monkeypatch.setattr(held_memory.HeldMemory, "note", both)
    tracemalloc.start()
    try:
        before = held_memory.numpy_traced_bytes()
        [result] = LocalCluster(1).run(lambda backend: execute(program, backend, values))
    finally:
        tracemalloc.stop()
    assert result.peak_bytes > 0 and max(traced) - before == result.peak_bytes, (max(traced) - before, result.peak_bytes)


def _seed(net, seeds: dict) -> None:
    for name, (strategy, _) in seeds.items():
        primitive = net
        for part in name.split("."):
            primitive = primitive[int(part)] if part.isdigit() else getattr(primitive, part)
        primitive.shard(strategy)


GPT_CASES = [  # (name, parallel mode, device_num, megatron model parallel or 0 for no seeds, extra context)
    ("megatron-tp4-dp2", "auto_parallel", 8, 4, {}),
    ("megatron-tp2", "auto_parallel", 2, 2, {}),
    ("data-parallel", "data_parallel", 8, 0, {}),
    ("unseeded", "auto_parallel", 4, 0, {}),
    ("megatron-tp4-dp2-optimizer-sharding", "auto_parallel", 8, 4,
     {"enable_parallel_optimizer": True, "parallel_optimizer_config": {"parallel_optimizer_threshold": 0}}),
    ("data-parallel-optimizer-sharding", "data_parallel", 8, 0,
     {"enable_parallel_optimizer": True, "parallel_optimizer_config": {"parallel_optimizer_threshold": 0}}),
]


@pytest.mark.parametrize("name,mode,device_num,model_parallel,context", GPT_CASES, ids=[case[0] for case in GPT_CASES])
def test_measured_peak_of_a_small_gpt_is_within_5_percent(name, mode, device_num, model_parallel, context):
    net = GPT(layers=2, hidden=64, heads=4, seq=16, batch=8)
    set_auto_parallel_context(parallel_mode=mode, device_num=device_num, **context)
    if model_parallel:
        _seed(net, megatron_seeds(2, model_parallel, data_parallel=device_num // model_parallel))
    cell = TrainOneStepCell(net, nn.Adam(net.trainable_params(), 1e-3))
    plan, values, batches = training_plan(cell, None, net.example_inputs(), 2)
    assert_peaks_match(train_locally(plan, values, batches), f"GPT {name} on {device_num}")


def test_measured_peak_of_a_recomputed_gpt_is_within_5_percent():
    net = GPT(layers=2, hidden=64, heads=4, seq=16, batch=8)
    for block in net.blocks:
        block.recompute()
    set_auto_parallel_context(parallel_mode="auto_parallel", device_num=8)
    _seed(net, megatron_seeds(2, 4, data_parallel=2))
    plan, values, batches = training_plan(TrainOneStepCell(net, nn.Adam(net.trainable_params(), 1e-3)), None, net.example_inputs(), 2)
    assert any(name.startswith("recompute/") for name in plan.graph.ops)
    assert_peaks_match(train_locally(plan, values, batches), "GPT with recomputed blocks")


@pytest.mark.parametrize("recompute", [False, True], ids=["kept", "recomputed"])
def test_measured_peak_of_a_gpt_with_dropout_equals_the_prediction(recompute):
    """Megatron's dropout 0.1: each Dropout's 1-byte mask is a buffer the model counts until its
    DropoutGrad, or, in a recomputed block, from its recomputation."""
    net = GPT(layers=2, hidden=64, heads=4, seq=16, batch=8, dropout=(0.1, 0.1, 0.1))
    for block in net.blocks if recompute else ():
        block.recompute()
    set_auto_parallel_context(parallel_mode="auto_parallel", device_num=8)
    _seed(net, megatron_seeds(2, 4, data_parallel=2))
    plan, values, batches = training_plan(TrainOneStepCell(net, nn.Adam(net.trainable_params(), 1e-3)), None, net.example_inputs(), 2)
    assert any(info.dtype == "bool" for info in plan.graph.tensors.values())
    assert_peaks_match(train_locally(plan, values, batches), f"GPT with dropout{', recomputed' if recompute else ''}")


def _relu_program(shape=(4, 8)) -> Program:
    """x -> ReLU -> y -> ReLU -> z on one rank: three buffers of the same size."""
    whole = tuple((0, size) for size in shape)
    context = SliceContext((whole,), (shape,), (whole,), (shape,))
    instructions = (Load("x", whole), Compute("a", "ReLU", ("x",), ("y",), (), context),
                    Compute("b", "ReLU", ("y",), ("z",), (), context))
    return Program(0, 1, (), instructions, ("x",), (("z", "z"),))


def test_a_buffer_is_dropped_after_its_last_use():
    program = _relu_program()
    assert release_schedule(program) == ((), ("x",), ("y",))
    values = {"x": np.ones((4, 8), np.float32)}
    [result] = LocalCluster(1).run(lambda backend: execute(program, backend, values))
    # x and y are live while the first ReLU runs, y and z while the second does; never all three.
    assert result.peak_bytes == 2 * 4 * 8 * 4 < 3 * 4 * 8 * 4


def test_an_update_writes_over_its_parameter_and_an_allreduce_over_its_operand():
    whole = ((0, 8),)
    context = SliceContext((whole, whole), ((8,), (8,)), (whole,), ((8,),))
    instructions = (Load("w", whole), Load("g", whole),
                    Compute("optimizer/w", "ApplyGradientDescent", ("w", "g"), ("w_new",), (("learning_rate", 0.1),), context))
    program = Program(0, 1, (), instructions, ("g",), (), (("w", "w_new"),))
    values = {"w": np.ones(8, np.float32), "g": np.ones(8, np.float32)}
    [result] = LocalCluster(1).run(lambda backend: execute(program, backend, values))
    assert result.peak_bytes == 2 * 8 * 4  # w and g; the new w takes the old one's place
    np.testing.assert_allclose(result.updated["w"], 0.9)


def test_measured_peak_is_below_the_sum_of_every_buffer(monkeypatch):
    """The tutorial FFN's training step: keeping every buffer (no release) holds strictly more
    than the run, which drops them."""
    set_auto_parallel_context(parallel_mode="auto_parallel", device_num=8)
    net = FFN()
    net.dense1.matmul.shard(((2, 1), (1, 4)))
    loss = WithLossCell(net, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"))
    cell = TrainOneStepCell(loss, nn.Momentum(net.trainable_params(), 0.01, 0.9))
    plan, values, batches = training_plan(cell, None, (nn.Tensor(shape=(64, 64)), nn.Tensor(shape=(64,), dtype="int32")), 1)
    programs = lower_programs(plan)

    def peaks():
        results = LocalCluster(8).run(lambda backend: execute(programs[backend.rank], backend, values | batches[0], resident={}))
        return [result.peak_bytes for result in results]

    freed = peaks()
    monkeypatch.setattr(executor, "release_schedule", lambda program: ((),) * len(program.instructions))
    kept = peaks()
    assert all(0 < a < b for a, b in zip(freed, kept)), (freed, kept)


def test_the_report_line_groups_ranks_and_flags_a_difference():
    assert memory_line(100, [100, 100, 103]) == ("peak memory per device (bytes): predicted 100; measured (arrays held) rank 0-1 100, "
                                                 "rank 2 103; measured/predicted 1.000..1.030: within 5 %")
    assert memory_line(100, [94]).endswith("0.940..0.940: differs by more than 5 %")
    assert memory_line(100, [100, 100]).endswith("measured (arrays held) rank 0-1 100; measured/predicted 1.000..1.000: equal")


@pytest.mark.parametrize("optimizer", ["momentum", "adam"])
def test_measured_peak_of_the_tutorial_is_within_5_percent(optimizer):
    plan = tutorial_plan(optimizer=Momentum(0.01, 0.9) if optimizer == "momentum" else Adam())
    result = train_locally(plan, graph_values(plan.graph, {}), synthetic_batches(plan.graph, 2))
    assert_peaks_match(result, f"the tutorial FFN with {optimizer}")
    # The search's per-op model leaves the redistributed copies out (0.90 of the measured peak
    # with Momentum, 0.92 with Adam): never above the run; a budget is checked on the exact peak.
    assert 0.85 < plan.prediction.model_peak_bytes / max(result.measured_peaks) <= 1


@pytest.mark.parametrize("optimizer", ["momentum", "adam"])
def test_a_budget_just_under_the_tutorials_exact_peak_gives_a_plan_whose_run_fits(optimizer):
    """The per-op model puts the tutorial's plan under a budget 1 byte below its exact peak (it
    leaves the redistributed copies out); the search checks the plan's exact peak, finds it
    over and solves again: the plan it returns, run, peaks within the budget."""
    make = (lambda: Momentum(0.01, 0.9)) if optimizer == "momentum" else Adam
    free = tutorial_plan(optimizer=make())
    budget = free.prediction.peak_bytes - 1
    assert free.prediction.model_peak_bytes <= budget
    net = FFN()
    net.dense1.matmul.shard(((2, 1), (1, 4)))  # the tutorial's seed
    plan = search(build_training(trace(net, nn.Tensor(shape=(64, 64)), device_num=8), make()), 8,
                  SearchOptions(max_device_memory=budget))
    result = train_locally(plan, graph_values(plan.graph, {}), synthetic_batches(plan.graph, 2))
    assert_peaks_match(result, f"the tutorial FFN with {optimizer} under {budget:,} bytes")
    assert max(result.measured_peaks) <= budget, (result.measured_peaks, budget)


@given(st.lists(st.tuples(st.sampled_from(["add", "remove"]), st.integers(0, 5), st.integers(0, 2)), max_size=40),
       st.lists(st.tuples(st.integers(0, 5), st.integers(0, 2)), max_size=4))
def test_held_blocks_kept_as_arrays_come_and_go_are_what_a_walk_of_them_finds(steps, extra):
    # Six blocks, each seen as itself, a view, or a view of a view; an array added twice holds
    # its block until removed twice; the fast count against held_bytes over the arrays held.
    blocks = [np.zeros(4 * (number + 1), np.float32) for number in range(6)]
    views = [[block, block[1:], block[1:][::2]] for block in blocks]
    kept, held = HeldBlocks(), []
    for action, number, view in steps:
        array = views[number][view]
        if action == "add":
            kept.add(array)
            held.append(array)
        elif any(one is array for one in held):
            kept.remove(array)
            held.pop(next(index for index, one in enumerate(held) if one is array))
        assert kept.total == held_bytes(held)
    group = [views[number][view] for number, view in extra]
    assert kept.bytes_with(group, [np.float32(1)]) == held_bytes(held, group, [np.float32(1)])
