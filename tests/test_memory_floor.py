"""Issue #33 item 6: the plan-space search's memory floor (`report.memory_floor`) is a lower bound
on the peak `autostrat estimate` predicts, for GPT and LLaMA blocks, every recompute, sequence
parallelism, pipelines with and without interleaving, and schedules that split the backward;
and it is close to the peak where activations weigh (no recompute), so that it prunes."""

from __future__ import annotations

from pathlib import Path

import pytest

from autostrat.frontend.config import config_from_data
from autostrat.frontend.yaml_text import parse_config_text
from autostrat.models.gpt import GPT
from autostrat.models.llama import LLaMA
from autostrat.report.estimate import GivenPlan, estimate_given, search_keys
from autostrat.report.memory_floor import LayerActivations, block_weights, peak_floor
from autostrat.report.plan_space import plan_candidates, search_plan_space

MODELS = {
    "gpt-dropout": "name: GPT\n  params: {layers: 4, hidden: 128, heads: 8, seq: 128, vocab: 128, dropout: [0.1, 0.1, 0.0]}",
    "llama-gqa": "name: LLaMA\n  params: {layers: 4, hidden: 128, ffn: 256, heads: 8, kv_heads: 4, seq: 128, vocab: 128, "
                 "attention_dropout: 0.1}",
    "llama-fused": "name: LLaMA\n  params: {layers: 4, hidden: 128, ffn: 256, heads: 8, kv_heads: 4, seq: 128, vocab: 128, "
                   "fused_attention: true}",
}


def _floor_and_peak(tmp_path: Path, text: str):
    """For the plan-space config `text` (global batch 4): a GivenPlan's (floor, estimated peak)."""
    path = tmp_path / "floor.yaml"
    path.write_text(text)
    data = parse_config_text(text, path)
    net = config_from_data(search_keys(dict(data), path, 4) | {"device_num": 4}, text, path, 1, example_inputs=True).net
    weights, layer, schedule = block_weights(net), LayerActivations.of(net), data.get("pipeline_schedule", "1f1b")

    def priced(given: GivenPlan) -> tuple[int, int]:
        peak = max(stage.peak_bytes for stage in estimate_given(dict(data), text, path, given).memory)
        return peak_floor(given, weights, data["precision"], layer, net.seq, schedule), peak

    return priced


def _floors_and_peaks(tmp_path: Path, model: str, schedule: str, precision: str = "bf16", step: int = 3):
    """Every `step`-th candidate on 4 devices (global batch 4) of `model`: its floor and its estimated peak."""
    text = f"hardware: a100-80gb\nprecision: {precision}\nglobal_batch: 4\npipeline_schedule: {schedule}\nmodel:\n  {MODELS[model]}\n"
    priced = _floor_and_peak(tmp_path, text)
    return [(given, *priced(given)) for given in plan_candidates(4, 4, 4, 8)[::step]]


@pytest.mark.parametrize("model, schedule, precision", [
    ("gpt-dropout", "1f1b", "bf16"), ("llama-gqa", "1f1b", "bf16"), ("llama-fused", "1f1b", "fp32"),
    ("gpt-dropout", "zero_bubble_h1", "bf16"), ("llama-gqa", "gpipe", "bf16")])
def test_the_floor_is_below_every_peak_and_near_it_without_recompute(tmp_path, model, schedule, precision):
    found = _floors_and_peaks(tmp_path, model, schedule, precision, step=4 if schedule == "1f1b" else 7)
    assert [(given, floor) for given, floor, peak in found if floor > peak] == []
    assert {given.recompute for given, _, _ in found} == {"none", "selective", "full"}
    assert any(given.vp > 1 for given, _, _ in found) and any(given.sequence_parallel for given, _, _ in found)
    without = [floor / peak for given, floor, peak in found if given.recompute == "none"]
    assert min(without) > 0.6  # activations counted, not only the weights (0.65-0.94 measured)


def test_activations_scale_with_the_micro_batches_a_schedule_keeps_in_flight():
    # One block a stage, activations only (no weights): 1F1B's first device keeps pp micro-batches
    # in flight, GPipe's all of them, the last device one; interleaving keeps more on its chunks.
    layer = LayerActivations(stream=8, heads=0, mlp=0, scores=0, attention_dropout=False, hidden_dropout=False)
    kept = layer.kept_bytes(16, 1, False, "none", "bf16")  # 4 stream tensors of 16 tokens x 8, 2 bytes
    floor = {schedule: peak_floor(GivenPlan(1, 4, 1, "none", 0, 1, 8), [0] * 4, "bf16", layer, 16, schedule)
             for schedule in ("1f1b", "gpipe")}
    assert kept == 4 * 16 * 8 * 2 and floor == {"1f1b": 4 * kept, "gpipe": 8 * kept}
    interleaved = peak_floor(GivenPlan(1, 2, 1, "none", 0, 1, 8, vp=2), [0] * 4, "bf16", layer, 16)
    assert interleaved > 2 * kept


def test_the_weights_gradient_sums_count_once_a_backward_made_them():
    # No activations: the loads, and with micro-batches the sums (4 bytes each in bf16: its fp32 gradient buffer).
    one, many = (peak_floor(GivenPlan(2, 1, 1, "none", 0, micro_batch, 4), [1000] * 2, "bf16", None, 16) for micro_batch in (4, 1))
    assert one == 2 * 500 * 14 and many == 2 * 500 * 18


def test_under_zero_the_sums_count_as_shards_but_whole_where_sequence_parallelism_seeds_them():
    # tp 2, dp 2, ZeRO 1, 4 micro-batches, no activations: 1000 elements a device; loads 2 + 12/2
    # bytes each; sums 4 bytes each, split over dp unless the weight gradients are seeded (SP).
    layer = LayerActivations(stream=0, heads=0, mlp=0, scores=0, attention_dropout=False, hidden_dropout=False)
    floors = [peak_floor(GivenPlan(2, 1, 2, "none", 1, 1, 8, sequence_parallel), [1000] * 2, "bf16", layer, 16)
              for sequence_parallel in (False, True)]
    assert floors == [1000 * (2 + 6) + 1000 * 4 // 2, 1000 * (2 + 6) + 1000 * 4]


def test_the_shape_of_llama_and_gpt_blocks():
    gpt = LayerActivations.of(GPT(layers=1, hidden=32, heads=4, seq=8, batch=2, vocab=64))
    llama = LayerActivations.of(LLaMA(layers=1, hidden=32, ffn=48, heads=4, kv_heads=2, seq=8, vocab=64, fused_attention=True))
    assert (gpt.heads, gpt.mlp, gpt.scores) == (4 * 32, 2 * 128, 4 * 8)
    assert (llama.heads, llama.mlp, llama.scores) == (32 + 16 + 16 + 32, 3 * 48, 0)
    assert LayerActivations.of(LLaMA(layers=2, hidden=32, ffn=48, heads=4, seq=8, vocab=64, experts=4)) is None


def test_a_search_prunes_by_activations_what_the_weights_alone_would_price(tmp_path):
    # 2 devices, sequences of 1024: the weights fit 80 GiB everywhere, the kept activations do not (no recompute).
    path = tmp_path / "space.yaml"
    path.write_text("hardware: a100-80gb\nprecision: bf16\ndevice_num: 2\nglobal_batch: 2\nmax_device_memory: 600MB\n"
                    "model:\n  name: GPT\n  params: {layers: 3, hidden: 1024, heads: 8, seq: 1024, vocab: 1024}\n")
    found = search_plan_space(path)
    pruned = [one for one in found.priced if one.reason.startswith("pruned: its memory floor")]
    assert pruned and all(one.bound > found.budget for one in pruned)
    assert {one.given.recompute for one in pruned} >= {"none"}
    assert found.best.peak_bytes <= found.budget


@pytest.mark.parametrize("tp, zero, sequence_parallel", [(1, 0, False), (1, 1, False), (2, 1, True)])
def test_the_floor_holds_where_the_weights_and_their_sums_dominate(tmp_path, tp, zero, sequence_parallel):
    # Short sequences, wide blocks, 2 micro-batches on dp 2: under ZeRO a sum may be a shard's
    # (a floor counting them whole was 76.0 MB against a 66.6 MB peak at tp 1), except the
    # weight gradients sequence parallelism seeds, which are summed whole (counted so: closer).
    text = ("hardware: a100-80gb\nprecision: bf16\nglobal_batch: 4\n"
            "model:\n  name: GPT\n  params: {layers: 4, hidden: 512, heads: 8, seq: 16, vocab: 128}\n")
    floor, peak = _floor_and_peak(tmp_path, text)(GivenPlan(tp, 2, 2, "none", zero, 1, 4, sequence_parallel))
    assert 0.7 * peak < floor <= peak
