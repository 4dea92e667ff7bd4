"""`autostrat estimate`: a given Megatron-style plan priced by the search's own machinery."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autostrat.autodiff import op_phase
from autostrat.cli import main
from autostrat.frontend.config import load_config
from autostrat.frontend.run import plan_config

ROOT = Path(__file__).resolve().parent.parent
SMALL = ROOT / "configs" / "estimate" / "gpt_small.yaml"  # GPT 2 x 64, heads 8, seq 16, vocab 128; tp 2 pp 2 dp 2
SMALL_TEXT = SMALL.read_text()


def _estimate(tmp_path, capsys, text: str = SMALL_TEXT) -> tuple[dict, str]:
    config, out = tmp_path / "plan.yaml", tmp_path / "estimate.json"
    config.write_text(text)
    assert main(["estimate", str(config), "--json", str(out)]) == 0
    return json.loads(out.read_text()), capsys.readouterr().out


def test_throughput_and_mfu_follow_from_the_step_time_by_hand(tmp_path, capsys):
    figures, text = _estimate(tmp_path, capsys)
    step = figures["step_time_s"]
    assert step > 0 and figures["device_num"] == 8
    assert figures["tokens_per_s_per_device"] == pytest.approx(8 * 16 / step / 8, rel=1e-12)
    b, s, l, h, v = 8, 16, 2, 64, 128  # Korthikanti et al.'s formula by hand
    flops = 72 * b * s * l * h * h * (1 + s / (6 * h) + v / (16 * l * h))
    assert figures["model_flops_per_step"] == round(flops)
    assert figures["model_tflops_per_device"] == pytest.approx(flops / step / 8 / 1e12, rel=1e-9)
    assert figures["mfu"] == pytest.approx(flops / step / 8 / 312e12, rel=1e-9)  # a100-80gb, 16-bit (bf16)
    assert sum(figures["phases_s"].values()) == pytest.approx(step, rel=1e-12)
    assert "72·B·s·l·h²·(1 + s/6h + V/16lh) with B=8, s=16, l=2, h=64, V=128" in text
    assert [stage["stage"] for stage in figures["stages"]] == [0, 1]


def _seeded_config_text() -> str:
    """The small plan written as an ordinary search config: Megatron's TP 2 x DP 2 seeds by
    hand (a Dense weight is [out, in]; the embedding and LM head split the vocabulary; the norms,
    residual adds and biases after a row-split product by rows over dp only), 2 stages, 4 micro-batches, both blocks recomputed,
    Adam's state split over the replicas with no size threshold."""
    column, row = "[[2, 1], [2, 1]]", "[[2, 2], [1, 2]]"
    seeds = {"attention.query": column, "attention.key": column, "attention.value": column,
             "attention.projection": row, "ffn1": column, "ffn2": row}
    lines = [f"  blocks.{i}.{op}.matmul: {strategy}" for i in range(2) for op, strategy in seeds.items()]
    between = {"ln1.layer_norm": "[[2, 1], [1], [1]]", "attention.projection.bias_add": "[[2, 1], [1]]",
               "residual1": "[[2, 1], [2, 1]]", "ln2.layer_norm": "[[2, 1], [1], [1]]", "ffn2.bias_add": "[[2, 1], [1]]",
               "residual2": "[[2, 1], [2, 1]]"}  # between the tensor-parallel regions: whole on the tp devices
    lines += [f"  blocks.{i}.{op}: {strategy}" for i in range(2) for op, strategy in between.items()]
    lines += ["  embedding.gather: {layout: {device_matrix: [2, 2], alias_name: [dp, tp]}, in: [[tp, None], [dp, None]]}",
              f"  lm_head.matmul: {column}"]  # the vocabulary over tp, the table on the inner axis
    return "\n".join([
        "parallel_mode: auto_parallel", "device_num: 8", "pipeline_stages: 2", "micro_size: 4", "gradients_mean: true",
        "hardware: a100-80gb", "precision: bf16", "optimizer: {name: adam}", "enable_parallel_optimizer: true",
        "parallel_optimizer_config: {parallel_optimizer_threshold: 0}",
        "model: {name: GPT, params: {layers: 2, hidden: 64, heads: 8, seq: 16, vocab: 128, batch: 8}}",
        "inputs: [{shape: [8, 16], dtype: int32}, {shape: [128], dtype: int32}]",
        "recompute: [blocks.0, blocks.1]", "strategies:", *lines, ""])


@pytest.mark.filterwarnings("ignore:seeds of .* disagree")  # a row-split product's output resolved for the ops after it
def test_the_estimate_is_the_searchs_prediction_of_the_same_plan(tmp_path, capsys):
    figures, _ = _estimate(tmp_path, capsys)
    search_config = tmp_path / "search.yaml"
    search_config.write_text(_seeded_config_text())
    plan, _ = plan_config(load_config(search_config))
    assert figures["step_time_s"] == plan.pipeline.step_time_ns / 1e9
    assert [stage["peak_bytes"] for stage in figures["stages"]] == list(plan.pipeline.peak_bytes)
    assert figures["peak_bytes_per_device"] == max(plan.pipeline.peak_bytes)
    assert figures["bubble"] == plan.pipeline.split.bubble


def test_each_stage_s_kinds_sum_to_its_peak_and_zero_1_shrinks_the_optimiser_state(tmp_path, capsys):
    sharded, _ = _estimate(tmp_path, capsys)
    whole, _ = _estimate(tmp_path, capsys, SMALL_TEXT.replace("zero: 1", "zero: 0"))
    kinds = ("parameters", "gradients", "optimizer_state", "activations", "communication_buffers")
    for stage in sharded["stages"] + whole["stages"]:
        assert sum(stage[kind] for kind in kinds) == stage["peak_bytes"]
        assert stage["parameters"] > 0 and stage["gradients"] > 0 and stage["activations"] > 0
    for with_zero, without in zip(sharded["stages"], whole["stages"]):
        assert with_zero["optimizer_state"] < without["optimizer_state"]
        assert with_zero["parameters"] == without["parameters"]


def test_a_plan_without_stages_reports_the_search_s_phases(tmp_path, capsys):
    text = SMALL_TEXT.replace("pp: 2", "pp: 1").replace("global_batch: 8", "global_batch: 2")
    figures, out = _estimate(tmp_path, capsys, text)
    assert list(figures["phases_s"]) == ["forward", "backward", "sync", "update"]
    assert figures["bubble"] == 0.0 and figures["plan"]["micro_batches"] == 1 and len(figures["stages"]) == 1
    assert "tokens/s per device:" in out and "peak memory per device, by stage" in out


def test_llama_counts_six_n_plus_attention(tmp_path, capsys):
    text = (f"model: {{hf_config: {ROOT / 'configs/models/llama-tiny.json'}, params: {{seq: 16}}}}\n"
            "global_batch: 4\nplan: {tp: 4, dp: 2, micro_batch: 2}\n")
    figures, out = _estimate(tmp_path, capsys, text)
    # llama-tiny: hidden 64, 8 heads over 4 kv heads (kv width 32), FFN 96, vocab 128, 2 layers.
    weights = 2 * (64 * 64 + 2 * 64 * 32 + 64 * 64 + 3 * 64 * 96) + 64 * 128
    assert figures["model_flops_per_step"] == 6 * weights * 4 * 16 + 12 * 2 * 64 * 16 * 4 * 16
    assert "6·N·B·s + 12·l·h·s·B·s" in out


@pytest.mark.parametrize("change, message", [
    (("pp: 2, vp: 1", "pp: 1, vp: 2"), "plan.vp: virtual stages interleave a pipeline: expected 1 with pp 1, got 2"),
    (("pp: 2, vp: 1", "pp: 2, vp: 3"), "plan.pp: each of the pp · vp model stages holds at least one of the 2 layers: "
                                       "expected at most 2 stages, got 6"),
    (("cp: 1", "cp: 2"), "plan.cp: 2 is not yet expressible"),
    (("ep: 1", "ep: 2"), "plan.ep: expert parallelism needs a mixture-of-experts model, got GPT without experts"),
    (("cp: 1, ep: 1", "cp: 2, ep: 2"), "plan.ep: 2 is not yet expressible (expert parallelism splits whole sequences' tokens: cp must be 1)"),
    (("zero: 1", "zero: 2"), "plan.zero: 2 is not yet expressible"),
    (("zero: 1", "zero: 3"), "plan.zero: 3 is not yet expressible"),
    (("sequence_parallel: false", "sequence_parallel: 1"), "plan.sequence_parallel: expected true or false, got 1"),
    (("micro_batch: 1", "micro_batch: 1, pipelines: 2"), "plan.pipelines: unknown key; a plan has tp, pp, vp"),
    (("tp: 2", "tp: 3"), "plan.tp: expected a divisor of the model's 8 attention heads (Megatron splits whole heads), got 3"),
    (("tp: 2", "tp: '2'"), "plan.tp: expected a positive integer, got '2'"),
    (("recompute: full", "recompute: some"), "plan.recompute: expected one of none, full, selective, got 'some'"),
    (("global_batch: 8", "global_batch: 7"), "global_batch: expected a multiple of dp × micro_batch = 2, got 7"),
    (("global_batch: 8", "global_batch: 8\nmicro_size: 2"), "micro_size: the plan section decides it"),
    (("global_batch: 8", "global_batch: 8\ndevice_num: 16"), "device_num: the plan section decides it; leave it out"),
    (("global_batch: 8", "global_batch: 8\nstrategies: {}"), "strategies: the plan section decides it; leave it out"),
    (("vocab: 128}", "vocab: 128, batch: 4}"), "model.params.batch: the global batch comes from global_batch (8); got 4"),
])
def test_a_bad_or_inexpressible_plan_is_an_error_naming_the_key(tmp_path, capsys, change, message):
    config, out = tmp_path / "plan.yaml", tmp_path / "estimate.json"
    assert change[0] in SMALL_TEXT
    config.write_text(SMALL_TEXT.replace(*change))
    assert main(["estimate", str(config), "--json", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"autostrat: error: {config}: ") and message in err and "Traceback" not in err
    assert not out.exists()  # nothing written, not even in part


def test_json_is_written_whole_or_not_at_all(tmp_path, capsys):
    config, out = tmp_path / "plan.yaml", tmp_path / "estimate.json"
    out.write_text("the previous estimate")
    config.write_text(SMALL_TEXT.replace("cp: 1", "cp: 4"))
    assert main(["estimate", str(config), "--json", str(out)]) == 2
    assert out.read_text() == "the previous estimate"  # a failed estimate leaves the old file as it was
    config.write_text(SMALL_TEXT)
    assert main(["estimate", str(config), "--json", str(out)]) == 0
    assert json.loads(out.read_text())["plan"]["tp"] == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["estimate.json", "plan.yaml"]  # no temporary file left
    capsys.readouterr()
    assert main(["estimate", str(config), "--json", "-"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["device_num"] == 8 and "step time:" in captured.err


def _forward_kinds(plan, consumer: str) -> set[str]:
    return {step.kind for edge in plan.redistributions if edge.consumer == consumer for step in edge.plan.steps}


def test_sequence_parallelism_and_selective_recompute_hold_fewer_activations(tmp_path):
    from autostrat.report.estimate import estimate

    base = SMALL_TEXT.replace("pp: 2", "pp: 1").replace("global_batch: 8", "global_batch: 2").replace("zero: 1", "zero: 0")
    found = {}
    for parallel, recompute in (("false", "none"), ("false", "selective"), ("true", "selective"), ("false", "full")):
        path = tmp_path / f"{parallel}_{recompute}.yaml"
        path.write_text(base.replace("sequence_parallel: false, recompute: full",
                                     f"sequence_parallel: {parallel}, recompute: {recompute}"))
        found[parallel, recompute] = estimate(path)
    most = {key: value.memory[0].most_activation_bytes for key, value in found.items()}
    assert most["false", "full"] < most["true", "selective"] < most["false", "selective"] < most["false", "none"]
    steps = {key: value.step_time_s for key, value in found.items()}
    assert steps["false", "none"] < steps["false", "selective"] < steps["false", "full"]  # recomputing costs time
    # Sequence parallelism: the row-split product's partial output is reduce-scattered onto the
    # residual's rows, and the next column-split product's input gathered.
    plan = found["true", "selective"].plan
    assert "ReduceScatter" in _forward_kinds(plan, "blocks.0.attention.projection.bias_add")
    assert "AllGather" in _forward_kinds(plan, "blocks.0.ffn1.matmul")
    assert plan.ops["blocks.0.ln2.layer_norm"].strategy.to_tuples()[0] == (4, 1)
    assert "AllGather" not in _forward_kinds(found["false", "selective"].plan, "blocks.0.ffn1.matmul")
    # Without it, as Megatron: the partial output all-reduced, the residual whole on the tp devices.
    plain = found["false", "selective"].plan
    assert _forward_kinds(plain, "blocks.0.attention.projection.bias_add") == {"AllReduce"}
    for op in ("residual1", "ln2.layer_norm", "residual2"):
        assert plain.ops[f"blocks.0.{op}"].strategy.to_tuples()[0] == (2, 1)  # rows over dp 2 only


def test_the_vocabulary_is_split_over_tp_as_megatron_does():
    from autostrat.report.estimate import estimate

    plan = estimate(SMALL).plan
    assert plan.ops["embedding.gather"].strategy.to_tuples() == ((2, 1), (2, 1))  # table rows over tp, ids over dp
    assert plan.ops["lm_head.matmul"].strategy.to_tuples() == ((2, 1), (2, 1))  # logits' columns over tp
    gather, head = (plan.ops[name].strategy.input_layouts[index] for name, index in (("embedding.gather", 0), ("lm_head.matmul", 1)))
    assert gather.slice_shape == head.slice_shape == (64, 64)  # both hold half the 128-row table


def test_a_tied_tables_gradient_is_computed_on_its_own_vocabulary_rows(tmp_path):
    """The small plan with a tied table, dp 1 as the published pipeline rows: the lookup's
    gradient on the first stage is the tp-th of the table's rows, as Megatron's
    VocabParallelEmbedding computes it, and so is the table's gradient the first stage holds at
    its peak (before, the lookup's partial gradient of all 128 rows: twice that)."""
    from autostrat.report.estimate import estimate
    from autostrat.search.stage_buffers import stage_peak_buffers

    path = tmp_path / "tied.yaml"
    path.write_text(SMALL_TEXT.replace("vocab: 128}", "vocab: 128, tie_embeddings: true}").replace("dp: 2", "dp: 1")
                    .replace("zero: 1", "zero: 0"))
    plan = estimate(path).plan
    assert plan.pipeline.op_stages["optimizer/embedding.embedding_table"] == 0  # updated where it is looked up
    for tensor in ("bprop/embedding.gather/gather_grad:0", "grad/embedding.embedding_table"):
        assert plan.layouts[tensor].slice_shape == (64, 64) and not plan.layouts[tensor].partial  # 128 rows over tp 2
    [(first, _), _] = stage_peak_buffers(plan, lambda key: False)
    table = [size for key, size in first if key.startswith(("grad/embedding.embedding_table", "bprop/embedding.gather/"))]
    assert table == [64 * 64 * 4]  # its rows, fp32, once


def test_a_sequence_parallel_plan_with_selective_recompute_trains_like_one_device(tmp_path):
    from autostrat.report.estimate import given_plan_config
    from tests.test_recompute import assert_trains_like_one_device

    path = tmp_path / "sp.yaml"
    path.write_text(SMALL_TEXT.replace("precision: bf16", "precision: fp32").replace("pp: 2", "pp: 1")
                    .replace("global_batch: 8", "global_batch: 2").replace("zero: 1", "zero: 0")
                    .replace("sequence_parallel: false, recompute: full", "sequence_parallel: true, recompute: selective"))
    config, _ = given_plan_config(path)
    with pytest.warns(UserWarning, match="seeds of .* disagree"):  # the AllGathers sequence parallelism trades for
        plan, _ = plan_config(config)
    # The backward gathers each norm's output again for the weight gradient, as Megatron's does:
    # its own AllGather, sent in the backward, not the forward's copy kept.
    assert plan.backward_regathers
    readers = [edge for edge in plan.redistributions if edge.tensor == "blocks.0.ln2.layer_norm:0"]
    phases = {(op_phase(edge.consumer), edge.shares is None, tuple(step.kind for step in edge.plan.steps)) for edge in readers}
    assert ("forward", True, ("AllGather",)) in phases and ("backward", True, ("AllGather",)) in phases
    assert "blocks.0.ln1.layer_norm:0" in {edge.tensor for edge in plan.regathered()}
    # Each weight gradient is the device's part of the weight, as Megatron's (seeded: left to
    # propagation, a column-split product's was the whole weight's, partial over tp).
    products = ("attention.query", "attention.key", "attention.value", "attention.projection", "ffn1", "ffn2")
    for forward in [f"blocks.1.{product}.matmul" for product in products] + ["lm_head.matmul"]:
        weight_gradient = f"bprop/{forward}/mat_mul_1"
        [gradient], weight = plan.graph.ops[weight_gradient].outputs, plan.graph.ops[forward].inputs[1]
        assert plan.ops[weight_gradient].origin == "seed"
        assert plan.layouts[gradient].slice_shape == plan.layouts[weight].slice_shape
    assert_trains_like_one_device(plan)


def test_virtual_stages_estimate_megatrons_interleaved_schedule(tmp_path, capsys):
    """plan.vp 2: the pipeline runs interleaved_1f1b with 2 model stages per rank (4 on 2 ranks,
    a block each), its phases sum to the simulated step, and it predicts less bubble than vp 1."""
    from autostrat.report.estimate import estimate, given_plan_config

    four = SMALL_TEXT.replace("layers: 2", "layers: 4")
    plain, _ = _estimate(tmp_path, capsys, four)
    figures, _ = _estimate(tmp_path, capsys, four.replace("vp: 1", "vp: 2"))
    plan, _ = given_plan_config(tmp_path / "plan.yaml")
    assert plan.context.pipeline_schedule_chunks() == ("interleaved_1f1b", 2)
    found = estimate(tmp_path / "plan.yaml")
    assert found.plan.pipeline.stages == 4 and found.plan.pipeline.chunks == 2
    assert sum(found.phases_ns.values()) == found.plan.pipeline.step_time_ns
    assert figures["bubble"] < plain["bubble"]
    stages = found.plan.pipeline.op_stages  # Megatron's even split: block i on model stage i, the head on the last
    assert [stages[f"blocks.{i}.ffn1.matmul"] for i in range(4)] == [0, 1, 2, 3]
    assert stages["embedding.gather"] == 0 and stages["lm_head.matmul"] == stages["loss.reduce_mean"] == 3

CONTEXT_TEXT = ("precision: fp32\nmodel:\n  name: LLaMA\n"
                "  params: {layers: 2, hidden: 32, ffn: 48, heads: 4, kv_heads: 2, seq: 16, vocab: 64, fused_attention: true}\n"
                "global_batch: 2\nplan: {tp: 2, dp: 2, cp: 2, micro_batch: 1}\n")


@pytest.mark.filterwarnings("ignore:seeds of .* disagree")  # a row-split product's output resolved for the ops after it
def test_a_context_parallel_plan_trains_like_one_device(tmp_path):
    """tp 2 x dp 2 x cp 2: each sequence's rows on 2 devices, the fused attention's query rows
    split over cp with K and V gathered; the run equals one device, bytes counted = predicted."""
    from autostrat.frontend.train import compare, synthetic_batches
    from autostrat.report.estimate import estimate_of, given_plan_config
    from autostrat.runtime.executor import graph_values
    from autostrat.runtime.training import reference_graph, train_locally, train_reference

    path = tmp_path / "cp.yaml"
    path.write_text(CONTEXT_TEXT)
    config, given = given_plan_config(path)
    plan, _ = plan_config(config)
    assert given.device_num == 8 and estimate_of(plan, config.net, given).to_dict()["plan"]["cp"] == 2
    attend = plan.ops["blocks.1.attention.attend"].strategy
    assert dict(zip(attend.rule.factors, attend.splits)) == {"b": 2, "n": 2, "s": 2, "d": 1, "t": 1}
    for tensor in ("key", "value"):  # grouped K and V gathered over cp (axis 1 of [dp, cp, tp]) before their repeat
        [edge] = [edge for edge in plan.redistributions if edge.consumer == f"blocks.1.attention.expand_{tensor}"]
        assert [(step.kind, step.axes) for step in edge.plan.steps] == [("AllGather", (1,))]
    assert plan.ops["blocks.1.ffn_up.matmul"].strategy.to_tuples() == ((4, 1), (2, 1))  # rows over dp x cp
    values, batches = graph_values(plan.graph, {}), synthetic_batches(plan.graph, 2)
    report = compare(plan, train_locally(plan, values, batches), train_reference(reference_graph(plan), values, batches))
    assert report.ok, report.text


@pytest.mark.parametrize("change, message", [
    (("micro_batch: 1", "micro_batch: 2"), "plan.cp: 2 is not yet expressible (context parallelism splits one sequence "
                                           "per data-parallel rank: micro_batch must be 1)"),
    (("cp: 2", "cp: 3"), "plan.cp: expected a divisor of the sequence length 16, got 3"),
    ((", fused_attention: true", ""), "plan.cp: 2 is not yet expressible for LLaMA without fused attention"),
])
def test_a_context_parallel_plan_that_cannot_be_expressed_is_an_error(tmp_path, capsys, change, message):
    config = tmp_path / "cp.yaml"
    assert change[0] in CONTEXT_TEXT
    config.write_text(CONTEXT_TEXT.replace(*change).replace("global_batch: 2", "global_batch: 4"))
    assert main(["estimate", str(config)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"autostrat: error: {config}: ") and message in err and "Traceback" not in err
