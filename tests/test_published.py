"""benchmarks/published.py's fit table and benchmarks/activation_terms.py's term-by-term
activations, against figures computed by hand from the paper's formulas."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

from activation_terms import TERMS, kept_at_backward, paper_bytes, terms_table  # noqa: E402
from published import efficiency_table  # noqa: E402

from autostrat.cost import PROFILES  # noqa: E402
from autostrat.report.estimate import estimate  # noqa: E402

SHAPE = {"s": 2048, "b": 4, "h": 6144, "a": 64}  # Korthikanti et al.'s 22B row


@pytest.mark.parametrize("t", [1, 8])
def test_the_terms_sum_to_table_2_without_sequence_parallelism(t):
    s, b, h, a = SHAPE.values()
    total = sum(paper_bytes(term, s, b, h, a, t, False, False) for term in TERMS)
    assert total == pytest.approx(s * b * h * (10 + 24 / t + 5 * a * s / (h * t)), rel=1e-12)


def test_the_terms_sum_to_table_2_with_sequence_parallelism_and_selective_recompute():
    s, b, h, a = SHAPE.values()
    assert sum(paper_bytes(term, s, b, h, a, 8, True, True) for term in TERMS) == pytest.approx(34 * s * b * h / 8, rel=1e-12)


def test_the_fit_table_prices_each_factor_on_the_two_point_model():
    # T(e) = 1 s / e + 0.5 s against 2 s published: at e = 0.5, 2.5 s (+25 %); at the shipped factor 1 / e + 0.5.
    table = efficiency_table({("X", "full"): (1.0, 0.5, 2.0)}, 0.5, {("X", "full"): 1.1})
    shipped = 1 / PROFILES["a100-80gb"].matmul_efficiency + 0.5
    lines = table.splitlines()
    assert lines[1].split()[-4:] == [f"{(shipped / 2 - 1):+.1%}", "2.5", "+25.0%", "+10.0%"]
    assert lines[2].split() == ["MARE", f"{abs(shipped / 2 - 1):.2%}", "25.00%", "10.00%"]


@pytest.mark.parametrize("t,sequence_parallel", [(1, False), (2, False), (2, True)])
def test_a_small_gpt_layer_keeps_the_paper_terms(tmp_path, t, sequence_parallel):
    # GPT 2 x 64, 8 heads, seq 16, 2 sequences a micro-batch, tp t, bf16, Megatron's dropout 0.1:
    # a layer keeps, in s·b·h bytes, the paper's 10 + 24/t + 5·a·s/(h·t) without SP (2-byte
    # values, 1-byte masks: 34·s·b·h + 5·a·s²·b on one device); with SP + selective the paper's
    # 34/t: every term a t-th, the LayerNorm outputs too (their shards; the backward gathers them
    # again, as Megatron's does), and no gathered copy kept for the backward.
    config = tmp_path / "plan.yaml"
    recompute = "selective" if sequence_parallel else "none"
    config.write_text("hardware: a100-80gb\nprecision: bf16\nmodel: {name: GPT, params: {layers: 2, hidden: 64, heads: 8, "
                      f"seq: 16, vocab: 128, dropout: [0.1, 0.1, 0.1]}}}}\nglobal_batch: 2\nplan: {{tp: {t}, pp: 1, dp: 1, "
                      f"sequence_parallel: {str(sequence_parallel).lower()}, recompute: {recompute}, micro_batch: 2}}\n")
    table = terms_table(estimate(config).plan, {"s": 16, "b": 2, "h": 64, "a": 8}, t, sequence_parallel, sequence_parallel)
    total = table.splitlines()[-1].split()
    a, s, h = 8, 16, 64
    expected = (34 / t, 0.0) if sequence_parallel else (10 + 24 / t + 5 * a * s / (h * t), 0.0)
    assert (float(total[3]), float(total[4])) == pytest.approx(expected, abs=1e-3)


def test_a_gpt_layer_with_dropout_keeps_34_sbh_plus_5_as2b_bytes(tmp_path):
    # One device, bf16, dropout 0.1: every activation of layer 1 held when the backward starts
    # (its op outputs, and the residual stream layer 0 hands it), by hand: 34·s·b·h + 5·a·s²·b.
    s, b, h, a = 16, 2, 64, 8
    config = tmp_path / "plan.yaml"
    config.write_text(f"hardware: a100-80gb\nprecision: bf16\nmodel: {{name: GPT, params: {{layers: 2, hidden: {h}, heads: {a}, "
                      f"seq: {s}, vocab: 128, dropout: [0.1, 0.1, 0.1]}}}}\nglobal_batch: {b}\nplan: {{tp: 1, pp: 1, dp: 1, "
                      f"sequence_parallel: false, recompute: none, micro_batch: {b}}}\n")
    kept = kept_at_backward(estimate(config).plan)
    layer = {key: size for key, size in kept.items()
             if key == "blocks.0.residual2:0" or (key.startswith("blocks.1.") and ":" in key and ">" not in key)}
    assert sum(layer.values()) == 34 * s * b * h + 5 * a * s * s * b, sorted(layer)
