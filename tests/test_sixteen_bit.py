"""16-bit training on ranks (issue #33): parameters, activations and communication in fp16 or
bf16, fp32 main copies and optimiser state, checked against JAX's mixed-precision step."""

from __future__ import annotations

import warnings
from pathlib import Path

import ml_dtypes  # noqa: F401  (numpy's "bfloat16")
import numpy as np
import pytest

from autostrat.autodiff import Adam, Momentum, build_training
from autostrat.cli import main
from autostrat.errors import ConfigError
from autostrat.frontend import trace
from autostrat.frontend.config import load_config
from autostrat.frontend.context import ParallelContext
from autostrat.frontend.run import plan_config
from autostrat.frontend.train import synthetic_batches
from autostrat.models import FFN
from autostrat.nn import Tensor
from autostrat.runtime.executor import graph_values
from autostrat.runtime.job import make_job, own_slices
from autostrat.runtime.local import LocalCluster, run_job_locally
from autostrat.runtime.program import lower_programs
from autostrat.runtime.training import reference_graph, train_locally, train_rank
from autostrat.runtime.reference import UNIT_ROUNDOFF
from autostrat.search import SearchOptions, search
from autostrat.search.precision import main_name
from tests.test_mpi import assert_nothing_left, assert_peaks_within, run

ROOT = Path(__file__).resolve().parent.parent


def ffn_plan(precision: str, optimizer=None):
    """The tutorial FFN's training step on 8 devices, dense1 split 2 x 4, in `precision`."""
    net = FFN()
    net.dense1.matmul.shard(((2, 1), (1, 4)))
    graph = build_training(trace(net, Tensor(shape=(64, 64)), device_num=8), optimizer or Momentum(0.01, 0.9))
    return search(graph, 8, SearchOptions(precision=precision))


def llama_config(tmp_path, precision: str, loss_scale: float = 1.0) -> Path:
    """configs/llama_train.yaml in `precision` (its model file found from anywhere)."""
    text = (ROOT / "configs/llama_train.yaml").read_text().replace("models/llama-tiny.json", str(ROOT / "configs/models/llama-tiny.json"))
    path = tmp_path / f"llama_{precision}.yaml"
    path.write_text(text + f"\nprecision: {precision}\nloss_scale: {loss_scale}\n")
    return path


def test_sixteen_bits_move_half_the_bytes_and_bf16_syncs_its_fp32_gradients():
    """Counted at the send call: activations (the forward's ReduceScatter, the loss assembled)
    in 16 bits under both; the gradient synchronisation in fp16 under fp16, in fp32 under bf16
    (Megatron's fp32 gradient buffer); each run's bytes and peak as its plan predicts."""
    measured = {}
    for precision in ("fp32", "fp16", "bf16"):
        plan = ffn_plan(precision)
        graph = reference_graph(plan)
        result = train_locally(plan, graph_values(graph, {}), synthetic_batches(graph, 1))
        assert result.bytes_match and set(result.measured_peaks) == {result.predicted_peak}, precision
        measured[precision] = result.measured[0]
    for phase in ("forward", "output"):
        assert measured["fp16"][phase] == measured["bf16"][phase] == measured["fp32"][phase] // 2 > 0
    assert measured["fp16"]["sync"] * 2 == measured["bf16"]["sync"] == measured["fp32"]["sync"] > 0


def test_a_rank_keeps_fp32_main_copies_and_its_sixteen_bit_parameters_are_them_rounded():
    plan = ffn_plan("bf16", Adam())
    graph = reference_graph(plan)
    values, batches = graph_values(graph, {}), synthetic_batches(graph, 2)
    programs = lower_programs(plan)
    slices = LocalCluster(8).run(lambda backend: train_rank(programs[backend.rank], backend, values, batches).slices)[5]
    weight, main = slices["dense1.weight"], slices[main_name("dense1.weight")]
    assert weight.dtype == np.dtype("bfloat16") and main.dtype == np.float32 and slices["moment1.dense1.weight"].dtype == np.float32
    assert np.array_equal(weight, main.astype("bfloat16"))
    assert not np.array_equal(main, main.astype("bfloat16").astype(np.float32))  # it keeps bits the 16-bit copy lacks


def test_fp16_with_a_loss_scale_trains_the_tiny_llama_on_local_ranks_like_the_reference(tmp_path):
    config = load_config(llama_config(tmp_path, "fp16", 1024), phase="train")
    plan, _ = plan_config(config, 8)
    job = make_job(plan, steps=1, loss_scale=config.context.loss_scale)
    check = run_job_locally(job)
    assert check.bytes_match and check.results_match, check.text
    assert "fp16 mixed precision" in check.text and "limit 0.03125" in check.text
    assert_peaks_within(check.text, 8, tolerance=0.0)


@pytest.mark.slow
def test_bf16_tiny_llama_trains_on_8_mpi_ranks_like_the_mixed_precision_reference(tmp_path):
    code, out, err, run_dir, _ = run(tmp_path, str(llama_config(tmp_path, "bf16")), "--steps", "1", timeout=180)
    assert code == 0, err
    assert "1 training step(s)" in out and "bytes: measured = predicted on every rank" in out
    assert ": OK" in out and "JAX" in out and "bf16 mixed precision" in out
    assert_nothing_left(run_dir, 8)
    assert_peaks_within(out, 8, tolerance=0.0)


def test_fp16_without_a_loss_scale_is_refused_before_anything_runs(tmp_path, capsys):
    config = llama_config(tmp_path, "fp16")
    assert main(["run", str(config), "--run-dir", str(tmp_path / "run")]) == 2
    assert capsys.readouterr().err == (f"autostrat: error: {config}: precision 'fp16' runs with a loss_scale above 1 (e.g. "
                                       f"loss_scale: 1024), got loss_scale 1: unscaled fp16 gradients lose their bits in "
                                       f"float16's subnormals\n")
    assert not (tmp_path / "run").exists()


def test_sixteen_bits_with_pipeline_stages_are_refused_before_anything_runs(tmp_path, capsys):
    config = tmp_path / "gpt_pipeline_bf16.yaml"
    config.write_text((ROOT / "configs/gpt_pipeline.yaml").read_text() + "\nprecision: bf16\n")
    assert main(["run", str(config), "--run-dir", str(tmp_path / "run")]) == 2
    assert capsys.readouterr().err == (f"autostrat: error: {config}: precision 'bf16' runs without pipeline stages "
                                       f"(pipeline_stages 1); got pipeline stages: run it in precision fp32, or plan it "
                                       f"without stages\n")
    assert not (tmp_path / "run").exists()


def test_a_loss_scale_in_fp32_is_a_config_error():
    with pytest.raises(ConfigError, match=r"^loss_scale scales a 16-bit run's gradients \(precision fp16 or bf16\); "
                                          r"got loss_scale 8 with precision 'fp32'$"):
        ParallelContext(loss_scale=8)


def test_a_loss_scale_below_one_is_a_config_error():
    with pytest.raises(ConfigError, match=r"^loss_scale must be a finite number >= 1 \(a power of two keeps the scaling "
                                          r"exact\); got 0.5$"):
        ParallelContext(precision="fp16", loss_scale=0.5)


def test_main_copies_accumulate_updates_below_the_sixteen_bit_spacing_as_the_reference():
    """Momentum at a learning rate whose steps are mostly below bf16's spacing: each main copy's
    update over two steps (main copy minus its start) equals the reference's within one bf16
    unit roundoff of its largest element. (Restarting a main copy from its 16-bit weight at each
    step, which loses the first step's small updates, is off by about 0.4 of it.)"""
    plan = ffn_plan("bf16", Momentum(1e-5, 0.9))
    job = make_job(plan, steps=2)
    program = job.programs[0]
    slices = LocalCluster(8).run(lambda backend: train_rank(job.programs[backend.rank], backend, job.values, job.batches).slices)[0]
    expected = own_slices(program, job.final)
    for parameter in ("dense1.weight", "dense2.weight"):
        main = main_name(parameter)
        start = own_slices(program, {main: np.asarray(job.values[parameter]).astype("bfloat16").astype(np.float32)})[main]
        moved, reference = slices[main] - start, expected[main] - start
        assert np.max(np.abs(moved - reference)) <= UNIT_ROUNDOFF["bf16"] * np.max(np.abs(reference)), parameter
        assert np.mean(slices[parameter].astype(np.float32) == start) > 0.05  # 16-bit weights that did not move, main copies that did


def test_an_fp16_step_whose_scaled_gradients_overflow_fails_its_check():
    """A loss scale too large for fp16 (gradients past 65504 become infinite, the step NaN): the
    check fails, NaN against NaN included, rather than passing a comparison NaN never loses."""
    plan = ffn_plan("fp16", Adam())
    with warnings.catch_warnings():  # numpy's overflow warnings, from the ranks' threads
        warnings.simplefilter("ignore", RuntimeWarning)
        check = run_job_locally(make_job(plan, 1, loss_scale=2.0**15))
    assert check.bytes_match and not check.results_match
    assert "(relative inf, limit 0.03125): FAILED" in check.text
