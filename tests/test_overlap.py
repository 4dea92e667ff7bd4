"""The schedule of gradient synchronisation overlapped with the backward (`cost.overlap`),
against cases computed by hand, and on a plan (`search.prediction.sync_schedule`)."""

from __future__ import annotations

from autostrat.autodiff import SGD
from autostrat.cost import Hardware
from autostrat.cost.overlap import sync_timeline
from autostrat.models import tutorial_plan
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
