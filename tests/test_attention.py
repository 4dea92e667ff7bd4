"""Fused attention (issue #35): the blockwise kernel with the running-softmax merge equals plain
softmax attention, the merge of any split of the keys equals attention over all keys, the
kernel meets its JAX translation, and the rule refuses what it does not support. The oracle
(test_oracle.py) and the finite differences (test_gradients.py) cover the op as every op."""

from __future__ import annotations

import numpy as np
import pytest

from autostrat.errors import RuleError
from autostrat.rules import get_op, make_rule
from autostrat.runtime.kernels import run_kernel
from autostrat.runtime.kernels.attention import blockwise_attention, merge_partial_attention, partial_attention
from autostrat.runtime.reference_jax import FORWARD
from tests.oracle import random_inputs


def plain_attention(query, key, value, scale, causal, query_offset=0):
    """softmax(query key^T * scale + mask) value, all keys at once."""
    scores = np.einsum("bnsd,bntd->bnst", query, key) * scale
    if causal:
        rows = query_offset + np.arange(query.shape[2])[:, None]
        scores = np.where(np.arange(key.shape[2])[None, :] <= rows, scores, -np.inf)
    weights = np.exp(scores - scores.max(axis=-1, keepdims=True))
    return np.einsum("bnst,bntd->bnsd", weights / weights.sum(axis=-1, keepdims=True), value)


def _qkv(rng, batch, heads, seq_q, seq_k, dim, dtype=np.float32):
    shapes = [(batch, heads, seq_q, dim), (batch, heads, seq_k, dim), (batch, heads, seq_k, dim)]
    return [rng.standard_normal(shape).astype(dtype) * 2 for shape in shapes]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("block", [1, 3, 4, 7, 16, 40])
def test_blockwise_equals_plain_attention(causal, block):
    """Block sizes that divide the key sequence (16 of 16) and that do not (3, 7 of 13)."""
    rng = np.random.default_rng(block + 100 * causal)
    for seq_q, seq_k in ((13, 13), (16, 16), (5, 11)):
        query, key, value = _qkv(rng, 2, 3, seq_q, seq_k, 4)
        got = blockwise_attention(query, key, value, 0.5, causal, block=block)
        expected = plain_attention(query.astype(np.float64), key, value, 0.5, causal)
        assert got.dtype == np.float32
        np.testing.assert_allclose(got, expected, rtol=2e-6, atol=2e-6, err_msg=f"{seq_q}x{seq_k} block {block}")


@pytest.mark.parametrize("causal", [False, True])
def test_merging_any_split_of_the_keys_equals_attention_over_all_keys(causal):
    """Random cut points (and a piece order that is not the key order): merge is exact whatever
    the split, as ring attention needs when blocks arrive from other ranks."""
    rng = np.random.default_rng(3 + causal)
    query, key, value = _qkv(rng, 2, 2, 9, 9, 5, np.float64)
    for _ in range(10):
        cuts = np.sort(rng.choice(np.arange(1, 9), size=rng.integers(1, 5), replace=False))
        pieces = list(zip([0, *cuts], [*cuts, 9]))
        rng.shuffle(pieces)
        total = None
        for start, stop in pieces:
            part = partial_attention(query, key[:, :, start:stop], value[:, :, start:stop], 0.7, causal, 0, start)
            total = part if total is None else merge_partial_attention(total, part)
        np.testing.assert_allclose(total[2] / total[1], plain_attention(query, key, value, 0.7, causal), rtol=1e-12, atol=1e-12)


def test_causal_rows_with_an_offset_see_only_earlier_keys():
    """A rank holding query rows 4..7 of 8 masks with their global numbers, not 0..3."""
    query, key, value = _qkv(np.random.default_rng(9), 1, 1, 8, 8, 4, np.float64)
    held = blockwise_attention(query[:, :, 4:], key, value, 1.0, True, query_offset=4, block=3)
    np.testing.assert_allclose(held, plain_attention(query, key, value, 1.0, True)[:, :, 4:], rtol=1e-12)


def test_kernels_equal_the_jax_translation():
    rng = np.random.default_rng(5)
    for example in get_op("FlashAttentionScore").examples:
        inputs = random_inputs(example, rng)
        [expected] = run_kernel("FlashAttentionScore", inputs, example.attrs)
        got = np.asarray(FORWARD["FlashAttentionScore"](*inputs, **example.attrs))
        np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-12, err_msg=f"{example.shapes} {example.attrs}")


def test_rule_splits_batch_heads_and_query_rows_keeps_keys_and_head_dim_whole():
    rule = make_rule("FlashAttentionScore", [(2, 4, 8, 16), (2, 4, 8, 16), (2, 4, 8, 16)], head_num=4, sparse_mode=2)
    assert str(rule) == "b n s d, b n t d, b n t d -> b n s d; need-replication d t; ring t over s; causal t <= s"
    grad = make_rule("FlashAttentionScoreKeyValueGrad", [(2, 4, 8, 16)] * 4, head_num=4)
    assert str(grad) == "b n s d, b n t d, b n t d, b n s d -> b n t d, b n t d; reduction s; need-replication d t; ring t over s"


_SHAPES = [(2, 4, 8, 16)] * 3


@pytest.mark.parametrize(("shapes", "attrs", "message"), [
    (_SHAPES, {"head_num": 4, "input_layout": "BSH"}, "only input_layout 'BNSD' is supported, got 'BSH'"),
    (_SHAPES, {"head_num": 4, "sparse_mode": 3}, r"sparse_mode must be 0 \(no mask\) or 2 \(leftUpCausal\), got 3"),
    (_SHAPES, {"head_num": 4, "keep_prob": 0.9}, "got keep_prob 0.9, pre_tokens 2147483647"),
    (_SHAPES, {"head_num": 4, "next_tokens": 0}, "next_tokens 0"),
    (_SHAPES, {"head_num": 2}, "head_num must be the query's heads 4, got 2"),
    ([(2, 4, 8, 16), (2, 2, 8, 16), (2, 2, 8, 16)], {"head_num": 4}, r"key, value \[b, n, t, d\], got \[\[2, 4, 8, 16\], \[2, 2, 8, 16\]"),
])
def test_rule_errors(shapes, attrs, message):
    with pytest.raises(RuleError, match=message):
        make_rule("FlashAttentionScore", shapes, **attrs)


def test_mindspore_names():
    """``ops.FlashAttentionScore(head_num, keep_prob, scale_value, ..., input_layout, sparse_mode)``
    and ``ops.flash_attention_score(query, key, value, head_num, ...)``, as MindSpore orders them."""
    from autostrat import nn, ops

    query, key, value = _qkv(np.random.default_rng(2), 1, 2, 5, 5, 4)
    expected = plain_attention(query, key, value, 0.5, True)
    primitive = ops.FlashAttentionScore(2, scale_value=0.5, input_layout="BNSD", sparse_mode=2)
    got = primitive(nn.Tensor(query), nn.Tensor(key), nn.Tensor(value)).asnumpy()
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
    functional = ops.flash_attention_score(nn.Tensor(query), nn.Tensor(key), nn.Tensor(value), 2, scale_value=0.5, sparse_mode=2)
    np.testing.assert_allclose(functional.asnumpy(), expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kv_heads", [4, 2], ids=["mha", "gqa"])
def test_fused_llama_loss_equals_the_unfused_one(kv_heads):
    """The same weights give the same loss with attention as one FlashAttentionScore op (K and V
    repeated for grouped queries) as with BatchMatMul, mask, Softmax, BatchMatMul."""
    from autostrat import nn
    from autostrat.models import LLaMA

    sizes = dict(layers=2, hidden=32, ffn=40, heads=4, kv_heads=kv_heads, seq=8, batch=2, vocab=64)
    unfused, fused = LLaMA(**sizes), LLaMA(**sizes, fused_attention=True)
    rng = np.random.default_rng(6)
    weights = dict(fused.parameters_and_names())
    assert sorted(weights) == sorted(name for name, _ in unfused.parameters_and_names())
    for name, parameter in unfused.parameters_and_names():
        parameter.set_data(rng.standard_normal(parameter.shape).astype(np.float32) * 0.3)
        weights[name].set_data(parameter.asnumpy())
    ids, labels = (nn.Tensor(t.asnumpy()) for t in unfused.example_inputs(with_data=True, seed=3))
    expected = float(unfused(ids, labels).asnumpy())
    assert float(fused(ids, labels).asnumpy()) == pytest.approx(expected, rel=1e-5)


def test_fused_llama_trains_on_8_ranks_like_one_device_with_query_rows_split():
    """DP 2 x TP 2 Megatron seeds and the fused op's query rows split in two besides: each rank's
    causal mask uses its rows' global numbers. (The backward's strategies are the search's choice;
    the oracle checks the key/value grad with its rows split, a reduction.)"""
    from autostrat import nn, reset_auto_parallel_context, set_auto_parallel_context
    from autostrat.frontend.train import TrainOneStepCell, compare, training_plan
    from autostrat.models import LLaMA, llama_megatron_seeds
    from autostrat.runtime.training import reference_graph, train_locally, train_reference
    from tests.test_training import _seed_gpt

    net = LLaMA(layers=1, hidden=32, ffn=40, heads=4, kv_heads=2, seq=8, batch=4, vocab=64, fused_attention=True)
    try:
        set_auto_parallel_context(parallel_mode="auto_parallel", device_num=8, gradients_mean=True)
        _seed_gpt(net, llama_megatron_seeds(1, 2, data_parallel=2))
        net.blocks[0].attention.attend.shard(((2, 2, 2, 1), (2, 2, 1, 1), (2, 2, 1, 1)))
        plan, values, batches = training_plan(TrainOneStepCell(net, nn.Adam(net.trainable_params(), 1e-3)), None, net.example_inputs(), 2)
        run, alone = train_locally(plan, values, batches), train_reference(reference_graph(plan), values, batches)
    finally:
        reset_auto_parallel_context()
    report = compare(plan, run, alone)
    assert report.ok, report.text
    splits = {op.op_type: dict(zip(op.strategy.rule.factors, op.strategy.splits)) for op in plan.ops.values()
              if op.op_type.startswith("FlashAttentionScore")}
    assert splits["FlashAttentionScore"] == {"b": 2, "n": 2, "s": 2, "d": 1, "t": 1}


def test_fused_attention_costs_the_flops_of_its_unfused_products():
    # Forward: QKᵀ and PV, two BatchMatMuls of 2·b·n·s·t·d flops each; the query gradient three
    # such products, the key and value gradient four. Heads split over 2 devices halves each.
    from autostrat.cost import op_cost
    from autostrat.layout import Strategy

    b, n, s, t, d = 2, 4, 8, 6, 16
    fused = make_rule("FlashAttentionScore", [(b, n, s, d), (b, n, t, d), (b, n, t, d)], head_num=n)
    scores = make_rule("BatchMatMul", [(b, n, s, d), (b, n, t, d)], transpose_b=True)
    context = make_rule("BatchMatMul", [(b, n, s, t), (b, n, t, d)])
    heads = lambda rule: Strategy(rule, tuple(2 if f == rule.factors[1] else 1 for f in rule.factors), 2)  # noqa: E731
    unfused = op_cost(heads(scores)).flops_per_device + op_cost(heads(context)).flops_per_device
    assert op_cost(heads(fused)).flops_per_device == unfused == 2 * 2 * b * n * s * t * d // 2
    grads = {name: make_rule(name, [(b, n, s, d), (b, n, t, d), (b, n, t, d), (b, n, s, d)], head_num=n)
             for name in ("FlashAttentionScoreQueryGrad", "FlashAttentionScoreKeyValueGrad")}
    assert [op_cost(heads(rule)).flops_per_device for rule in grads.values()] == [3 * unfused // 2, 4 * unfused // 2]


@pytest.mark.parametrize("op_type", ["FlashAttentionScore", "FlashAttentionScoreQueryGrad", "FlashAttentionScoreKeyValueGrad"])
def test_causal_attention_costs_the_busiest_rank_s_visible_scores(op_type):
    """Causal: each device computes the scores its rows see (the mask's lower triangle, counted
    here from the mask itself), and the step waits for the device with the most: the one holding
    the last rows. Rows over 1, 2 and 4 devices, 8 rows and 6 or 8 keys."""
    from autostrat.cost import op_cost
    from autostrat.layout import Strategy

    for seq_q, seq_k in ((8, 8), (8, 6)):
        shapes = [(2, 2, seq_q, 4), (2, 2, seq_k, 4), (2, 2, seq_k, 4), (2, 2, seq_q, 4)][:3 if op_type == "FlashAttentionScore" else 4]
        causal, full = (make_rule(op_type, shapes, head_num=2, sparse_mode=mode) for mode in (2, 0))
        visible = np.tril(np.ones((seq_q, seq_k)))  # row i sees keys 0..i
        for rows in (1, 2, 4):
            splits = tuple(rows if f == "s" else 1 for f in causal.factors)
            busiest = max(block.sum() for block in np.split(visible, rows))
            flops = op_cost(Strategy(causal, splits, rows)).flops_per_device
            assert flops * seq_q * seq_k == op_cost(Strategy(full, splits, rows)).flops_per_device * busiest * rows
