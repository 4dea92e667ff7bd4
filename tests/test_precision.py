"""Precision (`search.precision`): bytes per trained parameter as Megatron-LM's distributed
optimizer keeps them, 16-bit plans priced in 16 bits, and runs refusing what they cannot execute."""

from __future__ import annotations

import json
import math
from fractions import Fraction

import pytest

from autostrat.autodiff import Adam, build_training
from autostrat.cli import main
from autostrat.cost import Hardware
from autostrat.errors import ConfigError
from autostrat.frontend import trace
from autostrat.frontend.config import load_config
from autostrat.frontend.context import ParallelContext
from autostrat.frontend.run import plan_config
from autostrat.models import FFN, tutorial_plan
from autostrat.nn import Tensor
from autostrat.search import SearchOptions, search
from autostrat.search.memory import model_state_bytes, tensor_bytes
from autostrat.search.optimizer_shard import OptimizerShard
from autostrat.search.pipeline import MODEL_MARGIN
from autostrat.search.plan import build_plan
from autostrat.search.prediction import compute_ns
from autostrat.search.problem import build_problem

FFN_PARAMETERS = 2 * 64 * 64 + 2 * 64  # two [64, 64] weights, two [64] biases
# Megatron-LM's "Distributed Optimizer" table: bytes per parameter, the part not sharded and
# the part sharded over d data-parallel ranks.
MEGATRON = {"fp16": (4, 16), "bf16": (6, 12), "fp32": (8, 8)}


def ffn_adam_problem(precision: str, shard: int | None):
    """The tutorial FFN's Adam step on 8 devices, its optimiser sharded `shard` ways (None: off)."""
    graph = build_training(trace(FFN(), Tensor(shape=(64, 64)), device_num=8), Adam())
    sharding = None if shard is None else OptimizerShard(shard_size=shard, threshold_bytes=0)
    return build_problem(graph, 8, optimizer_shard=sharding, precision=precision)


def whole(problem) -> dict[str, int]:
    """Per op the candidate using every input whole (data parallel over nothing: each device
    holds every parameter and gradient whole), so a device holds FFN_PARAMETERS of each."""
    return {op: next(index for index, s in enumerate(candidates)
                     if not s.at_rest and all(layout.slice_shape == layout.shape for layout in s.input_layouts))
            for op, candidates in problem.candidates.items()}


@pytest.mark.parametrize("precision", ["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("shard", [None, 1, 2, 4, 8])
def test_bytes_per_parameter_are_megatrons_table(precision, shard):
    problem = ffn_adam_problem(precision, shard)
    fixed, sharded = MEGATRON[precision]
    expected = fixed + Fraction(sharded, shard or 1)
    assert Fraction(model_state_bytes(problem, whole(problem)), FFN_PARAMETERS) == expected


def sixteen_bit_plan(plan, precision: str):
    """`plan` (a searched plan) with its strategies kept, built again in `precision`."""
    strategies = {name: op.strategy for name, op in plan.ops.items()}
    origins = {name: op.origin for name, op in plan.ops.items()}
    return build_plan(plan.graph, plan.device_num, plan.mode, strategies, origins, (), precision=precision)


def test_a_matmul_runs_at_the_sixteen_bit_peak_reading_two_bytes_per_element():
    # dense1 ((2, 1), (1, 4)) on 8 devices: x [32, 64] @ w [64, 16] -> [32, 16] per device.
    plan = tutorial_plan(optimizer=Adam())
    flops, elements = 2 * 32 * 64 * 16, 32 * 64 + 64 * 16 + 32 * 16
    for precision, rate, itemsize in (("fp32", 989_400_000_000_000 // 2, 4), ("bf16", 989_400_000_000_000, 2),
                                      ("fp16", 989_400_000_000_000, 2)):
        expected = math.ceil(Fraction(flops * 10**9, rate)) + math.ceil(Fraction(elements * itemsize * 10**9, 3_350_000_000_000))
        assert compute_ns(sixteen_bit_plan(plan, precision), "dense1.matmul", Hardware()) == expected, precision


def test_a_bf16_weight_gradient_gemm_runs_at_the_sixteen_bit_peak_into_its_fp32_buffer():
    # bprop/dense1.matmul/mat_mul_1 computes grad/dense1.weight, kept in fp32 under bf16: read and
    # written at its size, computed at the 16-bit rate as fp16's is (the same flops and inputs).
    plan = tutorial_plan(optimizer=Adam())
    name = "bprop/dense1.matmul/mat_mul_1"
    assert plan.graph.ops[name].outputs == ("grad/dense1.weight",)
    read = sum(math.prod(layout.slice_shape) for layout in plan.ops[name].strategy.input_layouts)
    written = math.prod(plan.layouts["grad/dense1.weight"].slice_shape)

    def memory_ns(gradient_bytes):  # 16-bit inputs
        return math.ceil(Fraction((read * 2 + written * gradient_bytes) * 10**9, 3_350_000_000_000))

    bf16, fp16 = (compute_ns(sixteen_bit_plan(plan, precision), name, Hardware()) for precision in ("bf16", "fp16"))
    assert bf16 - memory_ns(4) == fp16 - memory_ns(2) > 0  # one flop time: the 16-bit rate's


def test_an_allreduce_of_sixteen_bit_activations_sends_half_the_fp32_bytes():
    # dense1 row parallel over 8 devices leaves its [64, 64] output partial; the whole-tensor
    # bias add AllReduces it: 2 (g - 1) / g of 64 x 64 elements, 4 bytes each in fp32, 2 in 16 bits.
    net = FFN()
    net.dense1.matmul.shard(((1, 8), (8, 1)))
    net.dense1.bias_add.shard(((1, 1), (1,)))
    graph = build_training(trace(net, Tensor(shape=(64, 64)), device_num=8), Adam())
    fp32 = search(graph, 8, SearchOptions())
    for precision, itemsize in (("fp32", 4), ("bf16", 2), ("fp16", 2)):
        plan = sixteen_bit_plan(fp32, precision)
        edge = next(edge for edge in plan.redistributions if edge.tensor == "dense1.matmul:0")
        assert str(edge.plan).startswith("AllReduce") and edge.cost == 2 * 7 * 64 * 64 * itemsize // 8, precision


@pytest.mark.parametrize("precision, itemsize", [("fp32", 4), ("fp16", 2), ("bf16", 4)])
def test_gradient_synchronisation_travels_in_fp16_under_fp16_and_in_fp32_under_bf16(precision, itemsize):
    # The tutorial's dense1.weight [64, 64] split (1, 4) on 8 devices: a [64, 16] gradient slice
    # AllReduced over the 2 replicas, 2 (2 - 1) / 2 of 1024 elements; its forward ReduceScatter of
    # the [64, 64] output over 4 devices sends 3/4 of a [32, 64] slice, in 16 bits under both.
    plan = sixteen_bit_plan(tutorial_plan(optimizer=Adam()), precision)
    edges = {edge.tensor: edge for edge in plan.redistributions}
    assert str(edges["grad/dense1.weight"].plan).startswith("AllReduce")
    assert edges["grad/dense1.weight"].cost == 64 * 16 * itemsize
    assert edges["dense2.matmul:0"].cost == 3 * 32 * 64 * (4 if precision == "fp32" else 2) // 4
    assert plan.phase_bytes()["sync"] == sum(edge.cost for edge in plan.redistributions if plan.edge_phase(edge) == "sync")


def test_sixteen_bits_price_the_plan_in_sixteen_bits_and_say_so():
    graph = build_training(trace(FFN(), Tensor(shape=(64, 64)), device_num=8), Adam())
    fp32, bf16 = search(graph, 8, SearchOptions()), search(graph, 8, SearchOptions(precision="bf16"))
    assert bf16.prediction.step_time_ns < fp32.prediction.step_time_ns
    assert sixteen_bit_plan(fp32, "bf16").prediction.step_time_ns < fp32.prediction.step_time_ns
    assert bf16.prediction.model_peak_bytes < fp32.prediction.model_peak_bytes  # activations halve, +2 B per parameter
    assert "precision" not in fp32.to_dict() and bf16.to_dict()["precision"] == "bf16"
    assert ("precision: bf16 (parameters, gradients and fp32 main copies as Megatron's distributed optimizer keeps "
            "them, activations in 16 bits; compute at the 16-bit peak, communication at the sizes kept)") in bf16.table()


@pytest.mark.parametrize("precision, gradient", [("fp16", 2), ("bf16", 4)])
def test_activations_count_two_bytes_and_gradients_as_the_precision_keeps_them(precision, gradient):
    fp32, half = ffn_adam_problem("fp32", None), ffn_adam_problem(precision, None)
    pairs = list(zip(tensor_bytes(fp32)[1], tensor_bytes(half)[1]))
    gradients = {"grad/dense1.weight", "grad/dense1.bias", "grad/dense2.weight", "grad/dense2.bias"}
    assert {item.tensor for item, _ in pairs} >= gradients | {"x", "dense1.matmul:0", "dense2.bias_add:0"}
    for wide, narrow in pairs:
        assert narrow.tensor == wide.tensor
        if wide.tensor in gradients:
            assert narrow.bytes == tuple(size * gradient // 4 for size in wide.bytes)
        elif not wide.tensor.startswith("optimizer/"):  # the optimiser's own scalars stay fp32
            assert narrow.bytes == tuple(size // 2 for size in wide.bytes), wide.tensor


def test_a_pipeline_splits_model_follows_its_stage_peaks_in_sixteen_bits():
    fp32, _ = plan_config(load_config("configs/gpt_pipeline.yaml"))
    bf16, _ = plan_config(load_config("configs/gpt_pipeline.yaml", precision="bf16"))
    assert bf16.pipeline.peak_bytes != fp32.pipeline.peak_bytes and bf16.pipeline.split.bounds == fp32.pipeline.split.bounds
    for model, exact in zip(bf16.pipeline.split.peak_bytes, bf16.pipeline.peak_bytes):
        assert abs(model - exact) <= exact * MODEL_MARGIN / 100, (model, exact)


def test_an_unknown_precision_is_a_config_error():
    with pytest.raises(ConfigError, match=r"^precision must be one of fp32, fp16, bf16; got 'fp8'$"):
        ParallelContext(precision="fp8")


def test_search_and_report_take_the_precision_and_say_it(tmp_path, capsys):
    out, page, again = tmp_path / "plan.json", tmp_path / "plan.html", tmp_path / "again.html"
    assert main(["search", "configs/ffn.yaml", "--phase", "train", "--precision", "fp16", "--out", str(out),
                 "--report", str(page)]) == 0
    assert "precision: fp16 (parameters, gradients" in capsys.readouterr().out
    plan = json.loads(out.read_text())
    assert plan["precision"] == "fp16" and plan["source"]["options"]["precision"] == "fp16"
    assert main(["report", str(out), "-o", str(again)]) == 0  # planned again from the plan's source
    for html in (page, again):
        assert "cost model bytes, precision fp16 (memory: parameters, gradients" in html.read_text()
