"""Precision in the memory model (`search.precision`): bytes per trained parameter as
Megatron-LM's distributed optimizer keeps them, and runs refusing what they cannot execute."""

from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path

import pytest

from autostrat.autodiff import Adam, build_training
from autostrat.cli import main
from autostrat.errors import ConfigError
from autostrat.frontend import trace
from autostrat.frontend.config import load_config
from autostrat.frontend.context import ParallelContext
from autostrat.frontend.run import plan_config
from autostrat.models import FFN
from autostrat.nn import Tensor
from autostrat.search import SearchOptions, search
from autostrat.search.memory import model_state_bytes, tensor_bytes
from autostrat.search.optimizer_shard import OptimizerShard
from autostrat.search.pipeline import MODEL_MARGIN
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


def test_sixteen_bits_change_only_memory_and_say_so():
    graph = build_training(trace(FFN(), Tensor(shape=(64, 64)), device_num=8), Adam())
    fp32, bf16 = search(graph, 8, SearchOptions()), search(graph, 8, SearchOptions(precision="bf16"))
    assert [op.strategy for op in bf16.ops.values()] == [op.strategy for op in fp32.ops.values()]
    assert bf16.total_bytes == fp32.total_bytes and bf16.prediction.step_time_ns == fp32.prediction.step_time_ns
    assert bf16.prediction.model_peak_bytes < fp32.prediction.model_peak_bytes  # activations halve, +2 B per parameter
    assert "precision" not in fp32.to_dict() and bf16.to_dict()["precision"] == "bf16"
    assert "precision: bf16 (parameters, gradients and fp32 main copies" in bf16.table()


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


def test_run_refuses_a_precision_it_cannot_execute(tmp_path, capsys):
    config = tmp_path / "ffn_bf16.yaml"
    config.write_text(Path("configs/ffn.yaml").read_text() + "\nprecision: bf16\n")
    assert main(["run", str(config), "--run-dir", str(tmp_path / "run")]) == 2
    assert capsys.readouterr().err == (f"autostrat: error: {config}: precision 'bf16' can be searched and reported but "
                                       f"not run: runs execute fp32 only (supported: fp32)\n")
    assert not (tmp_path / "run").exists()


def test_lowering_a_sixteen_bit_plan_for_ranks_is_refused():
    from autostrat.runtime.program import lower_programs

    graph = build_training(trace(FFN(), Tensor(shape=(64, 64)), device_num=8), Adam())
    with pytest.raises(ConfigError, match=r"^precision 'fp16' can be searched and reported but not run"):
        lower_programs(search(graph, 8, SearchOptions(precision="fp16")))
