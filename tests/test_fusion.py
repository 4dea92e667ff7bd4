"""Fused buckets (`search.fusion`, `runtime.stream.FusedAllReduce`): a bucket's AllReduces over
one group run as one collective, priced with one latency, and run so on local ranks."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from autostrat import reset_auto_parallel_context, set_auto_parallel_context
from autostrat.autodiff import SGD
from autostrat.layout import DeviceMatrix, Layout, TensorMap
from autostrat.models import FFN
from autostrat.redistribution import plan_redistribution
from autostrat.search.fusion import sync_collectives
from autostrat.search.prediction import sync_edges, sync_schedule

# The default profile (H100 servers of 8): α 2 µs and β 450 GB/s inside a server.
ALPHA_NS, BETA = 2000, 450e9


def _data_parallel_ffn(device_num: int = 4):
    """The tutorial FFN trained with SGD, data parallel on `device_num` devices: its gradients
    dense2.bias (AllGathered), dense2.weight, dense1.bias and dense1.weight (AllReduced over all
    the devices; the weights 64 x 64 fp32, 16 384 bytes each)."""
    from autostrat.frontend.train import training_plan

    set_auto_parallel_context(parallel_mode="data_parallel", device_num=device_num)
    try:
        return training_plan(FFN(), SGD(0.01), steps=3)
    finally:
        reset_auto_parallel_context()


def _ring_allreduce_ns(group: int, local_bytes: int) -> int:
    """One ring AllReduce inside a server, by hand: 2(g-1) messages of α, 2(g-1)/g of the bytes over β."""
    return 2 * (group - 1) * ALPHA_NS + math.ceil(2 * (group - 1) * local_bytes / group / BETA * 1e9)


def test_k_fused_equal_gradients_cost_one_collective_of_k_times_the_bytes():
    plan = _data_parallel_ffn()[0]
    edges = {edge.tensor: edge for edge in sync_edges(plan)}
    weights = [edges["grad/dense2.weight"], edges["grad/dense1.weight"]]  # two equal gradients of 16 384 bytes
    model = plan.hardware.alpha_beta(4)
    (fused,) = sync_collectives(plan, weights)
    assert fused.fused and fused.algorithm == "ring" and fused.local_bytes == 2 * 16384
    assert fused.nanoseconds(model) == _ring_allreduce_ns(4, 2 * 16384) == 12110  # 12 000 of latency, once
    assert sum(edge.plan.nanoseconds(model) for edge in weights) == 2 * _ring_allreduce_ns(4, 16384) == 24110
    assert fused.bytes == 2 * 3 * 2 * 16384 // 4
    # On the plan: one bucket of all four: the AllGather of dense2.bias (3 messages, 192 bytes)
    # and one AllReduce of the three others' 33 024 bytes.
    bucketed = replace(plan, bucket_bytes=1 << 20)
    gather = 3 * ALPHA_NS + math.ceil(192 / BETA * 1e9)
    (bucket,) = sync_schedule(bucketed, plan.hardware, 1 << 20).buckets
    assert bucket.end_ns - bucket.start_ns == gather + _ring_allreduce_ns(4, 33024) == 18112
    sync = bucketed.prediction.phases["sync"]
    assert (sync.communication_ns, sync.bytes) == (18112, 192 + 3 * 33024 // 2)
    assert plan.prediction.phases["sync"].communication_ns == gather + 3 * 12000 + 55 + 1 + 55  # unfused: 3 latencies


def test_gradients_over_other_groups_or_of_other_steps_are_not_fused():
    plan = _data_parallel_ffn()[0]
    edges = {edge.tensor: edge for edge in sync_edges(plan)}

    def over(axis: int, tensor: str):  # the edge's gradient AllReduced over device axis `axis` of a 2 x 2 matrix
        src = Layout(DeviceMatrix((2, 2)), TensorMap((-1, -1)), (64, 64), partial=(axis,))
        return replace(edges[tensor], plan=plan_redistribution(src, src.with_partial(())))

    first, second, third = over(0, "grad/dense2.weight"), over(1, "grad/dense1.weight"), over(0, "grad/dense1.bias")
    assert first.plan.steps[0].groups != second.plan.steps[0].groups
    collectives = sync_collectives(plan, [first, second, third, edges["grad/dense2.bias"]])
    assert [[edge.tensor for edge in c.edges] for c in collectives] == [
        ["grad/dense2.weight", "grad/dense1.bias"], ["grad/dense1.weight"], ["grad/dense2.bias"]]  # the AllGather alone
    assert [c.fused for c in collectives] == [True, False, False]


def test_a_fused_bucket_trains_equal_to_one_device_and_sends_what_was_predicted():
    from autostrat.runtime.program import lower_programs
    from autostrat.runtime.stream import FusedAllReduce, SyncStart
    from autostrat.runtime.training import reference_graph, train_locally, train_single_device

    plan, values, batches = _data_parallel_ffn()
    bucketed = replace(plan, bucket_bytes=1 << 20)
    program = lower_programs(bucketed)[0]
    (start,) = [i for i in program.instructions if isinstance(i, SyncStart)]
    fused = [step for step in start.steps if isinstance(step, FusedAllReduce)]
    assert len(fused) == 1 and len(fused[0].steps) == 3
    assert [c.kind for c in program.communications() if c.phase == "sync"] == ["AllReduce", "AllGather"]
    run, unfused = train_locally(bucketed, values, batches), train_locally(plan, values, batches)
    alone = train_single_device(reference_graph(plan), values, batches)
    assert run.losses == pytest.approx(alone.losses, rel=1e-6)
    for name, value in alone.parameters.items():  # equal to float32 rounding of sums in another order, as unfused
        scale = float(np.abs(value).max())
        worst, unfused_worst = (float(np.abs(r.parameters[name] - value).max()) for r in (run, unfused))
        assert worst <= 2e-6 * scale, (name, worst, unfused_worst, scale)
    # Counted where sent, per rank and instruction, against the plan's; the busiest rank's sync
    # bytes are the prediction's: 192 gathered and 3/2 x 33 024 in the fused ring.
    assert run.bytes_match and max(measured["sync"] for measured in run.measured) == 192 + 3 * 33024 // 2
    assert bucketed.prediction.phases["sync"].bytes == 192 + 3 * 33024 // 2
    assert max(m["sync"] for m in unfused.measured) == plan.prediction.phases["sync"].bytes  # the same bytes, 3 rings fewer


def test_a_fused_collective_survives_the_job_file(tmp_path):
    from autostrat.runtime.job import make_job
    from autostrat.runtime.job_file import load_job, save_job

    plan, _, _ = _data_parallel_ffn(2)
    job = make_job(replace(plan, bucket_bytes=1 << 20), 1)
    loaded = load_job(tmp_path, save_job(job, tmp_path))
    assert loaded.programs == job.programs


@pytest.mark.parametrize("algorithm", ["ring", "doubling", "hierarchical:2"])
def test_a_fused_allreduce_sums_each_piece_and_sends_what_each_member_is_predicted(algorithm):
    # 4 local ranks (2 servers of 2 for the hierarchical), pieces of 5 and 2 float32 elements:
    # 7 cut unevenly into 4 (ring) or 2 (hierarchical) chunks, so members send unequal bytes.
    from autostrat.runtime.local import LocalCluster
    from autostrat.runtime.program import member_bytes
    from autostrat.runtime.instructions import Communicate
    from autostrat.runtime.stream import FusedAllReduce, SyncStream

    group = (0, 1, 2, 3)
    steps = tuple(Communicate("AllReduce", key, key + "'", group, (), (), "sum", (0, 0), 0, key, "sync", algorithm)
                  for key in ("a", "b"))

    def run(backend):
        fused = FusedAllReduce(steps, algorithm, member_bytes("AllReduce", algorithm, 28, group, backend.rank, 4))
        stream = SyncStream(backend, lambda step, messages: (step.predicted, sum(m.bytes for m in messages)))
        pieces = {"a": np.arange(5, dtype=np.float32).reshape(5, 1) + backend.rank, "b": np.full(2, 10.0 * backend.rank, np.float32)}
        stream.start((fused,), pieces)
        return stream.wait((fused,))

    sends = []
    for written, traffic in LocalCluster(4).run(run):
        np.testing.assert_array_equal(written["a'"], 4 * np.arange(5, dtype=np.float32).reshape(5, 1) + 6)
        np.testing.assert_array_equal(written["b'"], np.full(2, 60.0, np.float32))
        [(predicted, sent)] = traffic  # one collective, one record
        assert predicted == sent > 0
        sends.append(sent)
    assert len(set(sends)) > 1 or algorithm == "doubling"  # uneven chunks: each member's own count
