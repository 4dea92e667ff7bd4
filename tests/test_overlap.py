"""The schedule of gradient synchronisation overlapped with the backward (`cost.overlap`),
against cases computed by hand, and on a plan (`search.prediction.sync_schedule`)."""

from __future__ import annotations

from autostrat.autodiff import SGD
from autostrat.cost import Hardware
from autostrat.cost.overlap import sync_timeline
from autostrat.models import tutorial_plan
import numpy as np

from autostrat.search.prediction import predict, sync_schedule

# Backward ops of 30, 20 and 40 ns end at 30, 50 and 90; a gradient of 100 bytes after each,
# whose synchronisation takes 20 ns.
OPS, GRADIENTS = [30, 20, 40], [(0, 100, 20), (1, 100, 20), (2, 100, 20)]


def spans(timeline):
    return [(bucket.gradients, bucket.start_ns, bucket.end_ns) for bucket in timeline.buckets]


def test_one_gradient_a_bucket_starts_each_when_it_is_ready_and_the_stream_is_free():
    # 30-50, then the second (ready at 50) 50-70, the third (ready at 90) 90-110.
    timeline = sync_timeline(OPS, GRADIENTS, 100)
    assert spans(timeline) == [((0,), 30, 50), ((1,), 50, 70), ((2,), 90, 110)]
    assert (timeline.end_ns, timeline.backward_ns, timeline.exposed_ns) == (110, 90, 20)


def test_a_bucket_waits_for_its_last_gradient():
    assert spans(sync_timeline(OPS, GRADIENTS, 200)) == [((0, 1), 50, 90), ((2,), 90, 110)]
    everything = sync_timeline(OPS, GRADIENTS, 300)  # one bucket, ready at 90: nothing hidden
    assert spans(everything) == [((0, 1, 2), 90, 150)] and everything.end_ns == 150


def test_a_busy_stream_delays_the_next_bucket_past_the_backward():
    slow = [(0, 100, 70), (1, 100, 70)]  # 30-100, then 100-170 although ready at 50
    assert spans(sync_timeline(OPS, slow, 100)) == [((0,), 30, 100), ((1,), 100, 170)]
    assert sync_timeline(OPS, [(0, 500, 5), (0, 10, 5)], 100).buckets[0].gradients == (0,)  # too big: alone


def test_no_overlap_is_the_backward_then_every_synchronisation():
    serial = sync_timeline(OPS, GRADIENTS, 0)
    assert spans(serial) == [((0, 1, 2), 90, 150)] and serial.end_ns == 150
    assert sync_timeline(OPS, [], 100).end_ns == 90 and sync_timeline(OPS, [], 100).buckets == ()


def test_a_plans_serial_schedule_is_what_its_prediction_charges():
    plan = tutorial_plan(optimizer=SGD())
    phases = predict(plan, Hardware(), plan.byte_phases).phases
    serial = sync_schedule(plan, Hardware(), 0)
    assert serial.end_ns == phases["backward"].time_ns + phases["sync"].communication_ns
    assert sync_schedule(plan, Hardware(), 1).end_ns <= serial.end_ns


# --- the plan's buckets, its prediction, and the runtime's stream ---------------------------

def _trained_ffn(seeded: bool):
    """The tutorial FFN trained with Momentum on 8 local ranks: seeded (dense1 split 2 x 4), or
    propagated from no seed (its gradients synchronised by Slice, ReduceScatter, permutes,
    AllGather and AllReduce: every kind a stream step runs)."""
    from autostrat import reset_auto_parallel_context, set_auto_parallel_context
    from autostrat.autodiff import Momentum
    from autostrat.frontend.train import training_plan
    from autostrat.models import FFN

    set_auto_parallel_context(parallel_mode="auto_parallel", device_num=8)
    net = FFN()
    if seeded:
        net.dense1.matmul.shard(((2, 1), (1, 4)))
    try:
        return training_plan(net, Momentum(0.01, 0.9), steps=2)
    finally:
        reset_auto_parallel_context()


def test_a_plan_with_buckets_is_predicted_on_the_two_stream_schedule():
    from dataclasses import replace

    plan = tutorial_plan(seed=None, optimizer=SGD())
    bucketed = replace(plan, bucket_bytes=300)
    serial, overlapped = sync_schedule(plan, Hardware(), 0), sync_schedule(plan, Hardware(), 300)
    assert bucketed.prediction.overlapped_ns == serial.end_ns - overlapped.end_ns > 0
    assert bucketed.prediction.step_time_ns == plan.prediction.step_time_ns - bucketed.prediction.overlapped_ns
    from autostrat.search.fusion import sync_collectives
    from autostrat.search.prediction import sync_buckets

    assert not any(c.fused for bucket in sync_buckets(bucketed) for c in sync_collectives(bucketed, bucket))
    assert bucketed.prediction.phases == plan.prediction.phases  # nothing fused: the same work and bytes, only hidden
    assert "- overlapped" in bucketed.prediction.lines()[0] and plan.prediction.overlapped_ns == 0
    assert bucketed.to_dict()["bucket_bytes"] == 300 and "bucket_bytes" not in plan.to_dict()
    from autostrat.search.recompute_choice import plan_cost  # what a "time" search compares plans on

    timed = replace(plan, cost_model="time")
    assert plan_cost(replace(timed, bucket_bytes=300)) == plan_cost(timed) - bucketed.prediction.overlapped_ns


def test_buckets_follow_the_gradients_readiness_and_size():
    from autostrat.search.prediction import gradient_bytes, sync_buckets, sync_edges

    plan = tutorial_plan(seed=None, optimizer=SGD())
    edges = sync_edges(plan)
    position = {name: index for index, name in enumerate(plan.graph.ops)}
    ready = [position[plan.graph.tensors[edge.tensor].producer] for edge in edges]
    assert ready == sorted(ready) and len(edges) == 4
    sizes = [gradient_bytes(plan, edge) for edge in edges]  # each device's gradient: 256, 4096, 128, 8192 bytes
    assert sizes == [256, 4096, 128, 8192]
    assert [len(bucket) for bucket in sync_buckets(plan, 4352)] == [2, 1, 1]  # 256 + 4096 fit; 128 + 8192 do not
    assert [len(bucket) for bucket in sync_buckets(plan, 1 << 20)] == [4]


def test_the_stream_runs_the_sync_while_the_backward_does_and_equals_the_serial_run():
    from dataclasses import replace

    from autostrat.runtime.program import lower_programs
    from autostrat.runtime.instructions import Compute
    from autostrat.runtime.stream import SyncStart, SyncWait
    from autostrat.runtime.training import train_locally

    for seeded in (True, False):
        plan, values, batches = _trained_ffn(seeded)
        bucketed = replace(plan, bucket_bytes=300)
        program = lower_programs(bucketed)[0]
        kinds = [type(i).__name__ for i in program.instructions]
        assert kinds.count("SyncStart") == len(sync_buckets_of(bucketed)) and kinds.count("SyncWait") == 4
        assert [c.edge for c in program.communications()] == [c.edge for c in lower_programs(plan)[0].communications()]
        serial, overlapped = train_locally(plan, values, batches), train_locally(bucketed, values, batches)
        assert overlapped.losses == serial.losses  # the same messages and sums, bit for bit
        assert all(np.array_equal(overlapped.parameters[k], serial.parameters[k]) for k in serial.parameters)
        assert overlapped.measured == serial.measured and overlapped.bytes_match
        assert max(overlapped.measured_peaks) <= overlapped.predicted_peak * 1.05
        # The sync's messages leave during the backward: counted before the first update op runs.
        first_update = next(i for i, x in enumerate(program.instructions)
                            if isinstance(x, Compute) and x.op.startswith("optimizer/"))
        last_start = max(i for i, x in enumerate(program.instructions) if isinstance(x, SyncStart))
        assert last_start < first_update and isinstance(program.instructions[first_update - 1], SyncWait)
        assert _sent_before_the_sync_waits(bucketed, values, batches) > _sent_before_the_sync_waits(plan, values, batches)


def _sent_before_the_sync_waits(plan, values, batches) -> int:
    """Messages rank 0 has sent when it reaches its first "sync" instruction (a `SyncWait` or a
    blocking step): with buckets, the stream's are among them (begun during the backward)."""
    from autostrat.runtime.local import LocalCluster
    from autostrat.runtime.program import lower_programs
    from autostrat.runtime.instructions import Communicate
    from autostrat.runtime.stream import SyncWait
    from autostrat.runtime.training import train_rank

    programs, counts = lower_programs(plan), []
    first = next(i for i, x in enumerate(programs[0].instructions)
                 if isinstance(x, SyncWait) or (isinstance(x, Communicate) and x.phase == "sync"))

    def rank(backend):
        seen = lambda index, _: index == first and counts.append(len(backend.sent))  # noqa: E731
        return train_rank(programs[backend.rank], backend, values, batches[:1],
                          on_instruction=seen if backend.rank == 0 else None)

    LocalCluster(plan.device_num).run(rank)
    return counts[0]


def sync_buckets_of(plan):
    from autostrat.search.prediction import sync_buckets

    return [bucket for bucket in sync_buckets(plan) if bucket]


def test_bucket_sizes_come_from_the_context_or_mindspores_comm_fusion_and_bad_ones_are_refused():
    import pytest

    from autostrat import get_auto_parallel_context, reset_auto_parallel_context, set_auto_parallel_context
    from autostrat.errors import ConfigError
    from autostrat.frontend.context import ParallelContext

    try:
        set_auto_parallel_context(comm_fusion={"allreduce": {"mode": "size", "config": 2}})
        assert get_auto_parallel_context("bucket_bytes") == 2 << 20
        assert ParallelContext(bucket_bytes=4096).search_options().bucket_bytes == 4096
        with pytest.raises(ConfigError, match="comm_fusion asks for buckets of 1048576 bytes and bucket_bytes for 5: give one"):
            set_auto_parallel_context(comm_fusion={"allreduce": {"mode": "size", "config": 1}}, bucket_bytes=5)
        with pytest.raises(ConfigError, match="allreduce's config in mode 'size' is the bucket size in MB"):
            set_auto_parallel_context(comm_fusion={"allreduce": {"mode": "size", "config": "big"}})
        with pytest.raises(ConfigError, match=r"bucket_bytes must be a whole number of bytes >= 0 \(0: gradient"):
            set_auto_parallel_context(bucket_bytes=-1)
    finally:
        reset_auto_parallel_context()


def test_a_bucket_whose_update_comes_before_its_last_gradient_is_refused():
    import pytest

    from autostrat.errors import RuntimeBackendError
    from autostrat.runtime.bucketing import bucketed
    from autostrat.runtime.instructions import Communicate, Compute

    def made(name):
        return Compute(name, "Neg", (), (name + ":0",), (), None)

    def synchronised(gradient):
        return Communicate("AllReduce", gradient, gradient + "'", (0, 1), (), (), "sum", (0, 0), 4, gradient, "sync")

    program = [made("a"), synchronised("a:0"), made("b"), synchronised("b:0")]
    assert len(bucketed(program, [["a:0"], ["b:0"]])) == 6  # a bucket each: both start in time
    with pytest.raises(RuntimeBackendError, match="edge a:0: its update runs before the last gradient of its bucket is made"):
        bucketed(program, [["a:0", "b:0"]])


def test_the_stream_moved_from_inside_a_blocking_wait_keeps_its_messages_off_the_waiting_instruction():
    import time

    from autostrat.runtime.instructions import Communicate
    from autostrat.runtime.local import LocalCluster
    from autostrat.runtime.stream import SyncStream

    step = Communicate("AllReduce", "g", "g>u", (0, 1), (), (), "sum", (0, 0), 8, "g -> u", "sync")

    def run(backend):
        stream = SyncStream(backend, lambda step, messages: sum(m.bytes for m in messages))
        stream.start((step,), {"g": np.full(2, backend.rank + 1.0)})
        before = len(backend.sent)
        while stream.busy:  # as `mpi.settle` runs it between polls of a blocking instruction's messages
            stream.progress_idle()
            time.sleep(0)
        idle = backend.sent[before:]
        results, traffic = stream.wait((step,))
        return results["g>u"].tolist(), idle, traffic

    for reduced, idle, traffic in LocalCluster(2).run(run):
        assert reduced == [3.0, 3.0] and idle == [] and traffic == [16]  # its two ring messages of 8 bytes, the second sent inside the wait
