"""Ring attention (issue #35): the bytes its kernels send, counted at each send on the wire,
equal `cost.ring`'s prediction for every ring candidate of the three ops; its time overlaps the
sends with the compute; a ring is written as MindSpore does (K and V split as the query rows)
and anything else is refused by message. The oracle (test_oracle.py) checks that each ring
candidate computes what one device does; test_context_parallel.py trains with it."""

from __future__ import annotations

import numpy as np
import pytest

from autostrat.cost.ring import ring_bytes, ring_nanoseconds
from autostrat.errors import LayoutError
from autostrat.layout import DeviceMatrix, Strategy, split_tensor
from autostrat.rules import make_rule
from autostrat.cost import AlphaBeta
from autostrat.runtime.local import LocalCluster
from autostrat.runtime.ring import Ring, run_ring_kernel
from autostrat.strategies import generate_strategies

SHAPE = (2, 2, 8, 4)
OPS = {"FlashAttentionScore": 3, "FlashAttentionScoreQueryGrad": 4, "FlashAttentionScoreKeyValueGrad": 4}


def _sent(strategy, inputs, attrs) -> list[int]:
    """The bytes each rank sent running `strategy`'s ring kernel."""
    pieces = [split_tensor(array, layout) for array, layout in zip(inputs, strategy.input_layouts)]

    def rank_run(backend):
        run_ring_kernel(strategy.rule.op_type, [p[backend.rank] for p in pieces], attrs, strategy.slice_context(backend.rank),
                        Ring(backend, strategy.ring_group(backend.rank)))
        return sum(message.bytes for message in backend.sent)
    return LocalCluster(strategy.device_num).run(rank_run)


@pytest.mark.parametrize("op_type", sorted(OPS))
def test_bytes_counted_on_the_wire_equal_the_prediction(op_type):
    attrs = {"head_num": 2, "sparse_mode": 2}
    rule = make_rule(op_type, [SHAPE] * OPS[op_type], **attrs)
    inputs = [np.random.default_rng(1).standard_normal(SHAPE).astype(np.float32) for _ in range(OPS[op_type])]
    rings = [s for n in (2, 4, 8) for s in generate_strategies(rule, n) if s.ring]
    assert len(rings) >= 6
    for strategy in rings:
        assert _sent(strategy, inputs, attrs) == [ring_bytes(strategy, "float32")] * strategy.device_num, str(strategy)


def test_the_sends_overlap_the_compute():
    """Sends shorter than the compute of the other blocks add nothing; longer ones are waited
    for after the first block; without a ring the time is the compute's."""
    rule = make_rule("FlashAttentionScore", [SHAPE] * 3, head_num=2)
    ring = Strategy.from_tuples(rule, ((1, 1, 4, 1),) * 3, 4)
    model = AlphaBeta(DeviceMatrix((4,)), latency=(0.0,), bandwidth=(1e9,))
    sends = ring_bytes(ring, "float32")  # nanoseconds at 1 byte per nanosecond
    assert ring_nanoseconds(ring, 100 * sends, "float32", model) == 100 * sends
    assert ring_nanoseconds(ring, 4000, "float32", model) == 1000 + max(3000, sends)
    assert ring_nanoseconds(Strategy.from_tuples(rule, ((1, 1, 4, 1), (1, 1, 1, 1), (1, 1, 1, 1)), 4), 4000, "float32", model) == 4000


def test_a_ring_is_written_with_key_and_value_split_as_the_query_rows():
    rule = make_rule("FlashAttentionScore", [SHAPE] * 3, head_num=2)
    ring = Strategy.from_tuples(rule, ((2, 1, 4, 1),) * 3, 8)
    assert ring.ring and ring.splits == (2, 1, 4, 1, 1) and ring.to_tuples() == ((2, 1, 4, 1),) * 3
    assert ring in generate_strategies(rule, 8) and Strategy.from_tuples(rule, ring.to_tuples(), 8) == ring


@pytest.mark.parametrize(("tuples", "message"), [
    (((1, 1, 4, 1), (1, 1, 2, 1), (1, 1, 2, 1)), "a ring strategy splits every dim of factor 't' as factor 's' is split"),
    (((1, 1, 4, 1), (1, 1, 4, 1), (1, 1, 1, 1)), "a ring strategy splits every dim of factor 't' as factor 's' is split"),
    (((1, 1, 1, 1), (1, 1, 4, 1), (1, 1, 4, 1)), "a ring strategy splits every dim of factor 't' as factor 's' is split"),
])
def test_ring_errors(tuples, message):
    rule = make_rule("FlashAttentionScore", [SHAPE] * 3, head_num=2)
    with pytest.raises(LayoutError, match=message):
        Strategy.from_tuples(rule, tuples, 4)


def test_only_an_op_with_a_ring_pair_and_a_split_carrier_rings():
    with pytest.raises(LayoutError, match="only an op with a ring pair has ring strategies"):
        Strategy(make_rule("MatMul", [(4, 4), (4, 4)]), (2, 1, 1), 2, ring=True)
    with pytest.raises(LayoutError, match="a ring over factor 's' needs it split"):
        Strategy(make_rule("FlashAttentionScore", [SHAPE] * 3, head_num=2), (2, 1, 1, 1, 1), 2, ring=True)


def test_a_ring_pair_is_a_need_replication_factor_and_a_splittable_one():
    from autostrat.errors import RuleError
    from autostrat.rules.rule import Rule, RuleSpec
    with pytest.raises(RuleError, match="a ring pair is a need-replication factor and a splittable one of 'a b -> a', got 'b a'"):
        Rule.build("ReduceSum", RuleSpec("a b -> a", ring="b a"), [(2, 2)])


def test_a_ring_inside_a_pipeline_stage_is_refused():
    from autostrat.autodiff import SGD, build_training
    from autostrat.errors import RuntimeBackendError
    from autostrat.frontend import trace
    from autostrat.models import LLaMA
    from autostrat.runtime.stage_program import lower_stage_programs
    from autostrat.search import SearchOptions
    from autostrat.search.pipeline import plan_pipeline

    net = LLaMA(layers=2, hidden=16, ffn=16, heads=2, seq=8, batch=2, vocab=16, fused_attention=True)
    net.blocks[0].attention.attend.shard(((1, 1, 2, 1),) * 3)
    plan = plan_pipeline(build_training(trace(net, *net.example_inputs(), device_num=2), SGD()), 4, 2, 2, SearchOptions())
    with pytest.raises(RuntimeBackendError, match="op blocks.0.attention.attend: a ring strategy .ring attention. does not run "
                                                  "inside a pipeline stage yet"):
        lower_stage_programs(plan)
