"""Context parallelism (issue #35) as layouts the search prices: the sequence split over a
``cp`` axis everywhere, and inside attention either the query rows split with K and V
all-gathered (Llama 3's form), the heads split, reached by an all-to-all from the sequence
split (Ulysses), or K and V split like the query rows with their blocks passed around the cp
ring inside the op (ring attention). All three are seeds a user writes; on 8 local ranks each
trains like one device with the bytes counted on the wire equal to the prediction (a ring's
backward too); the search picks the all-gather form by itself where K and V are small (one
key-value head) and the sequence long, and ring attention where the compute hides its sends.
The three forms in one job on 8 MPI ranks: test_mpi.py (configs/cp/llama_cp_train.yaml)"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from autostrat import nn, reset_auto_parallel_context, set_auto_parallel_context
from autostrat.frontend.train import TrainOneStepCell, compare, training_plan
from autostrat.models import LLaMA
from autostrat.layout import Strategy
from autostrat.rules import make_rule
from autostrat.parallel import Layout
from autostrat.search.plan import build_plan
from autostrat.runtime.training import reference_graph, train_locally, train_reference

DP, CP = 2, 4
MESH = Layout((DP, CP), ("dp", "cp"))
# The all-gather form: query rows over cp, K and V whole on the sequence (gathered over cp).
ALL_GATHER = (MESH("dp", "None", "cp", "None"), MESH("dp", "None", "None", "None"), MESH("dp", "None", "None", "None"))
ULYSSES = ((DP, CP, 1, 1),) * 3  # heads over cp: every rank attends over the whole sequence


def _splits(plan, op_type):
    [op] = [op for op in plan.ops.values() if op.op_type == op_type]
    return dict(zip(op.strategy.rule.factors, op.strategy.splits))


def _train_with_sequence_split(attention_seed, fused=True, backward_as_forward=False, **context):
    """A 1-block LLaMA (batch 2, sequence 16) on dp 2 x cp 4: every Dense splits its rows
    (batch x sequence) over the 8 devices, weights whole; the fused attention as
    `attention_seed` says, or (not `fused`) both BatchMatMuls of the unfused one."""
    net = LLaMA(layers=1, hidden=32, ffn=40, heads=4, seq=16, batch=DP, vocab=64, fused_attention=fused)
    block = net.blocks[0]
    try:
        set_auto_parallel_context(parallel_mode="auto_parallel", device_num=DP * CP, gradients_mean=True, **context)
        for dense in (block.attention.query, block.attention.key, block.attention.value, block.attention.projection,
                      block.ffn_gate, block.ffn_up, block.ffn_down):
            dense.matmul.shard(((DP * CP, 1), (1, 1)))
        for primitive in (block.attention.attend,) if fused else (block.attention.scores, block.attention.context):
            primitive.shard(attention_seed)
        cell = TrainOneStepCell(net, nn.Adam(net.trainable_params(), 1e-3))
        plan, values, batches = training_plan(cell, None, net.example_inputs(), 2)
        plan = _backward_as_forward(plan) if backward_as_forward else plan
        run, alone = train_locally(plan, values, batches), train_reference(reference_graph(plan), values, batches)
    finally:
        reset_auto_parallel_context()
    report = compare(plan, run, alone)
    assert report.ok, report.text
    return plan


def _backward_as_forward(plan):
    """`plan` again with the fused attention's gradients run in the forward's strategy (its
    ring too): the plan a user's strategy file could give every op."""
    [forward] = [op.strategy for op in plan.ops.values() if op.op_type == "FlashAttentionScore"]
    strategies = {name: op.strategy for name, op in plan.ops.items()}
    for name, op in plan.ops.items():
        if op.op_type.startswith("FlashAttentionScore") and op.op_type != "FlashAttentionScore":
            strategies[name] = Strategy(op.strategy.rule, forward.splits, plan.device_num, ring=forward.ring)
    return build_plan(plan.graph, plan.device_num, plan.mode, strategies, {name: "seed" for name in strategies}, (),
                      cost_model=plan.cost_model, hardware=plan.hardware, optimizer_shard=plan.optimizer_shard)


def _forward_steps(plan):
    """The collective kinds of the forward's redistributions into attention, per consumer."""
    kinds = {}
    for edge in plan.redistributions:
        if edge.consumer.startswith("blocks.0.attention."):
            kinds.setdefault(edge.consumer.removeprefix("blocks.0.attention."), set()).update(s.kind for s in edge.plan.steps)
    return {consumer: steps for consumer, steps in kinds.items() if steps}


def test_all_gather_form_trains_like_one_device():
    """Query rows split 4 ways with their global numbers in the causal mask; K gathered before
    its rotary embedding (which then runs on the whole sequence), V before attention."""
    plan = _train_with_sequence_split(ALL_GATHER)
    assert _splits(plan, "FlashAttentionScore") == {"b": 2, "n": 1, "s": 4, "d": 1, "t": 1}
    assert _forward_steps(plan) == {"rotary_key": {"AllGather"}, "attend": {"AllGather"}}


@pytest.mark.parametrize("form", ["all-gather", "ulysses"])
def test_unfused_attention_expresses_both_forms(form):
    """The same layouts on the unfused attention: QKᵀ and ·V split the query rows (the causal
    mask, a constant, sliced to the rank's rows; the softmax over whole key rows) or the heads."""
    seed = ((DP, 1, CP, 1), (DP, 1, 1, 1)) if form == "all-gather" else ((DP, CP, 1, 1),) * 2
    plan = _train_with_sequence_split(seed, fused=False)
    softmax = plan.ops["blocks.0.attention.softmax"].strategy.to_tuples()[0]
    assert softmax == ((DP, 1, CP, 1) if form == "all-gather" else (DP, CP, 1, 1))


def test_ulysses_form_trains_like_one_device():
    """Heads split 4 ways: an all-to-all turns the sequence split into a head split before
    attention and another turns it back after; no gather of K or V."""
    plan = _train_with_sequence_split(ULYSSES)
    assert _splits(plan, "FlashAttentionScore") == {"b": 2, "n": 4, "s": 1, "d": 1, "t": 1}
    assert _forward_steps(plan) == {name: {"AllToAll"} for name in ("query_heads", "key_heads", "value_heads",
                                                                    "projection.matmul")}


@pytest.mark.parametrize(("kv_heads", "query_rows"), [(1, 8), (8, 1)])
def test_search_chooses_the_all_gather_form_when_key_and_value_are_small(kv_heads, query_rows):
    """Fully automatic search of the step time, batch 1, sequence 512: with one key-value head
    (multi-query attention) K and V are an eighth of the queries' width, gathering them costs
    less than Megatron's activation all-reduces, and the proven optimum splits the query rows
    over all 8 devices; with 8 key-value heads it does not (the heads split over the devices)."""
    net = LLaMA(layers=1, hidden=32, ffn=64, heads=8, kv_heads=kv_heads, seq=512, batch=1, vocab=64, fused_attention=True)
    try:
        set_auto_parallel_context(parallel_mode="auto_parallel", device_num=8, gradients_mean=True,
                                  search_mode="integer_programming", cost_model="time")
        plan, _, _ = training_plan(TrainOneStepCell(net, nn.Adam(net.trainable_params(), 1e-3)), None, net.example_inputs(), 1)
    finally:
        reset_auto_parallel_context()
    assert _splits(plan, "FlashAttentionScore")["s"] == query_rows


RING = ((DP, 1, CP, 1),) * 3  # K and V split like the query rows: ring attention


def test_ring_form_trains_like_one_device():
    """Ring attention: K and V stay split over cp like the query rows, no gather into the op;
    its blocks go around the ring inside it, counted on the wire at each send and equal to the
    plan's prediction (`_train_with_sequence_split` compares)."""
    plan = _train_with_sequence_split(RING)
    attend = plan.ops["blocks.0.attention.attend"].strategy
    assert attend.ring and _splits(plan, "FlashAttentionScore") == {"b": 2, "n": 1, "s": 4, "d": 1, "t": 1}
    assert "attend" not in _forward_steps(plan)
    grads = [op.strategy for name, op in plan.ops.items() if name.startswith("bprop/blocks.0.attention.attend/")]
    assert plan.ring_bytes == {"blocks.0.attention.attend": 3 * 2 * (1 * 4 * 4 * 8) * 4}  # K and V blocks of b h s/cp d, 3 steps
    assert len(grads) == 2 and not any(grad.ring for grad in grads)  # the backward gathers K and V (cheaper here)


def test_ring_backward_trains_like_one_device():
    """Both gradients as rings too: the query gradient passes K and V around once, the key and
    value gradient twice with the running dK and dV, which go home at the end; every rank's
    messages counted at each send equal the plan's prediction (`cost.ring`)."""
    plan = _train_with_sequence_split(RING, backward_as_forward=True)
    block = 1 * 4 * 4 * 8 * 4  # bytes of one rank's K (or V, dK, dV) block: b h s/cp d in fp32
    assert plan.ring_bytes == {"blocks.0.attention.attend": 3 * 2 * block,
                               "bprop/blocks.0.attention.attend/flash_attention_score_query_grad": 3 * 2 * block,
                               "bprop/blocks.0.attention.attend/flash_attention_score_key_value_grad": (2 * 3 + 4) * 2 * block}


@pytest.mark.parametrize(("device_flops", "ring"), [(1e9, True), (1e12, False)])
def test_search_chooses_ring_attention_where_the_compute_hides_its_sends(device_flops, ring):
    """Fully automatic search of the step time, one head (nothing but the query rows to split),
    batch 1, sequence 256: on a device slow enough that attention's compute hides the ring's
    sends, the proven optimum passes K and V around the ring in all three attention ops (the
    all-gather form would wait for its gather); on a fast one the ring's many messages cost more
    than one gather shared by the three ops, and it gathers."""
    net = LLaMA(layers=1, hidden=16, ffn=32, heads=1, kv_heads=1, seq=256, batch=1, vocab=32, fused_attention=True)
    try:
        set_auto_parallel_context(parallel_mode="auto_parallel", device_num=8, gradients_mean=True, device_flops=device_flops,
                                  search_mode="integer_programming", cost_model="time")
        plan, _, _ = training_plan(TrainOneStepCell(net, nn.Adam(net.trainable_params(), 1e-3)), None, net.example_inputs(), 1)
    finally:
        reset_auto_parallel_context()
    attention = [op.strategy for op in plan.ops.values() if op.op_type.startswith("FlashAttentionScore")]
    assert len(attention) == 3 and all(s.split("s") == 8 and s.ring == ring for s in attention)


def test_the_cp_benchmarks_attention_work_is_the_busiest_ranks_causal_share():
    # benchmarks/context_parallel.py's work(cp) for a contiguous split, against cost.op_cost's
    # causal work of the device holding the last rows of a cp-times longer sequence over cp devices.
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
    from context_parallel import attention_work

    from autostrat.cost.op_cost import causal_work

    rows = 1024
    one = causal_work(Strategy(make_rule("FlashAttentionScore", [(1, 1, rows, 1)] * 3, head_num=1, sparse_mode=2), (1,) * 5, 1))
    for cp in (2, 4, 8):
        rule = make_rule("FlashAttentionScore", [(1, 1, rows * cp, 1)] * 3, head_num=1, sparse_mode=2)
        busiest = causal_work(Strategy(rule, (1, 1, cp, 1, 1), cp))
        assert busiest / one == pytest.approx(attention_work(cp, balanced=False), rel=2e-3)
        assert attention_work(cp, balanced=True) == cp
