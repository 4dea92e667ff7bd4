"""The virtual clock of a pipeline run (`runtime.pipeline_clock`, issue #34): composed along the
messages on hand-made traces whose bubble is known by hand, a rank's clock stopped in its
receives and outside its passes (a fake thread clock), its errors by message, and the traces
the runner records on local ranks: one row per message the rank's schedule sends or receives."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from autostrat.errors import RuntimeBackendError
from autostrat.runtime import pipeline_clock
from autostrat.runtime.pipeline_clock import END, NONE, RECV, SEND, PassClock, virtual_bubbles

ACTIVATION, GRADIENT = 0, 1  # the hand-made traces' tags


def _gpipe_two_stages(first: float = 1.0) -> list[np.ndarray]:
    """GPipe on 2 stages, 2 micro-batches, F = 1 s and B = 2 s on each, stage 0's first forward
    `first` seconds. Drawn by hand at first = 1: stage 1 runs F0 at 1-2, B0 2-4 (sends g0 at 4),
    F1 4-5, B1 5-7 (g1 at 7); stage 0 F0 0-1, F1 1-2, waits for g0 until 4, B0 4-6, waits for g1
    until 7, B1 7-9. Span 9, busy 6 a stage: bubble 1/3 on each (GPipe's (p - 1)(F + B) over
    m (F + B) plus it: 3 / 9). A longer first forward delays all of it: span first + 8."""
    stage0 = [(SEND, 1, ACTIVATION, first), (SEND, 1, ACTIVATION, first + 1), (RECV, 1, GRADIENT, first + 1),
              (RECV, 1, GRADIENT, first + 3), (END, 0, 0, first + 5)]
    stage1 = [(RECV, 0, ACTIVATION, 0.0), (SEND, 0, GRADIENT, 3.0), (RECV, 0, ACTIVATION, 3.0), (SEND, 0, GRADIENT, 6.0),
              (END, 0, 0, 6.0)]
    return [np.array(stage0), np.array(stage1)]


def test_the_clock_composed_along_the_messages_gives_the_bubble_drawn_by_hand():
    """Ignoring the stamps (each rank's span its own busy seconds) would give 0; stage 0 waiting
    only for its own clock, 1/3 would need its receives to wait for nothing."""
    assert virtual_bubbles(_gpipe_two_stages()) == pytest.approx((1 / 3, 1 / 3))


def _gpipe_two_stages_slowed(rank: int, row: int, seconds: float) -> list[np.ndarray]:
    """`_gpipe_two_stages` with the segment before `row` of `rank`'s trace `seconds` longer."""
    traces = _gpipe_two_stages()
    traces[rank][row:, 3] += seconds
    return traces


def test_a_run_is_its_median_step_per_segment_and_padding_rows_are_ignored():
    """Three steps, each with another pass preempted (stage 0's first forward 4 s longer, stage
    1's first backward, stage 0's last backward): every step's bubble is above 1/3, so a median of
    whole steps would be too; per segment each preemption is in one step of three: 1/3. Of two
    steps the higher of the two middle segments counts (here every preempted one: span 13)."""
    steps = [_gpipe_two_stages_slowed(0, 0, 4.0), _gpipe_two_stages_slowed(1, 1, 4.0), _gpipe_two_stages_slowed(0, 4, 4.0)]
    assert all(np.mean(virtual_bubbles(step)) > 1 / 3 + 0.05 for step in steps)
    padding = np.array([(NONE, 0, 0, 0.0)])
    traces = [np.concatenate([steps[0][rank], steps[1][rank], padding, steps[2][rank]]) for rank in (0, 1)]
    assert virtual_bubbles(traces) == pytest.approx((1 / 3, 1 / 3))
    normal, preempted = _gpipe_two_stages(), _gpipe_two_stages(first=5.0)
    assert virtual_bubbles([np.concatenate([normal[rank], preempted[rank]]) for rank in (0, 1)]) == pytest.approx((3 / 13, 7 / 13))


def test_steps_exchanging_other_messages_are_refused():
    normal = _gpipe_two_stages()
    other = [trace.copy() for trace in normal]
    other[1][0, 2] = 5  # stage 1's first receive on another tag
    with pytest.raises(RuntimeBackendError, match=r"^virtual clock: rank 1's steps must send and receive the same messages in the "
                                                  r"same order; got 2 different sequences$"):
        virtual_bubbles([np.concatenate([normal[rank], other[rank]]) for rank in (0, 1)])


def test_a_later_send_stamp_than_the_receivers_clock_sets_the_clock():
    """Stage 1's message leaves at 5 s; stage 0, idle since 1 s, resumes at 5: span 6."""
    stage0 = np.array([(RECV, 1, 0, 1.0), (END, 0, 0, 2.0)])
    stage1 = np.array([(SEND, 0, 0, 5.0), (END, 0, 0, 6.0)])
    assert virtual_bubbles([stage0, stage1]) == pytest.approx((1 - 2 / 6, 0.0))


def test_the_pass_clock_stops_in_receives_and_outside_passes(monkeypatch):
    """A fake thread clock: the pass runs 10-12, waits in a receive 12-20 (CPU a spinning wait
    burns, left out), runs 20-21; a send outside a pass (the update's) leaves no row."""
    ticks = iter([10.0, 11.0, 12.0, 20.0, 21.0])
    monkeypatch.setattr(pipeline_clock.time, "thread_time", lambda: next(ticks))
    clock = PassClock()
    clock.begin()  # 10
    clock.sending(1, 3)  # 11: 1 s into the pass
    clock.waiting(1, 4)  # 12
    clock.received()  # 20
    assert clock.end() == pytest.approx(3.0)  # 21: the pass ran 2 + 1 s
    clock.sending(1, 5)
    clock.close_step()
    assert clock.trace().tolist() == [[SEND, 1, 3, 1.0], [RECV, 1, 4, 2.0], [END, 0, 0, 3.0]]


def test_a_receive_no_rank_sent_is_refused():
    stage0 = np.array([(RECV, 1, 7, 0.0), (END, 0, 0, 1.0)])
    stage1 = np.array([(END, 0, 0, 1.0)])
    with pytest.raises(RuntimeBackendError, match=r"^virtual clock, step 0: rank 0 receives from rank 1 with tag 7 a message "
                                                  r"that rank never sent; every receive must match a send$"):
        virtual_bubbles([stage0, stage1])


def test_traces_of_unequal_steps_are_refused():
    with pytest.raises(RuntimeBackendError, match=r"^virtual clock: every rank's trace must hold the same steps; got \[2, 1\]$"):
        virtual_bubbles([np.array([(END, 0, 0, 1.0), (END, 0, 0, 1.0)]), np.array([(END, 0, 0, 1.0)])])


def test_a_trace_not_ending_with_a_step_is_refused():
    with pytest.raises(RuntimeBackendError, match=r"^virtual clock: rank 1's trace must end with a step's end; got 1 rows after it$"):
        virtual_bubbles([np.array([(END, 0, 0, 1.0)]), np.array([(END, 0, 0, 1.0), (SEND, 0, 0, 1.0)])])


def test_a_paused_clock_leaves_the_pause_out_of_the_pass_and_outside_a_pass_does_nothing(monkeypatch):
    """A fake thread clock: the pass runs 10-11, is paused 11-15 (a memory sample), sends at 16,
    ends at 17: 3 s; a pause and a resume outside a pass change nothing."""
    ticks = iter([10.0, 11.0, 15.0, 16.0, 17.0])
    monkeypatch.setattr(pipeline_clock.time, "thread_time", lambda: next(ticks))
    clock = PassClock()
    clock.pause(); clock.resume()  # nothing read: outside a pass
    clock.begin()  # 10
    clock.pause()  # 11
    clock.resume()  # 15
    clock.sending(1, 3)  # 16: 2 s into the pass
    assert clock.end() == pytest.approx(3.0)  # 17
    clock.close_step()
    assert clock.trace().tolist() == [[SEND, 1, 3, 2.0], [END, 0, 0, 3.0]]


def _local_1f1b_runs(steps: int = 3):
    """1F1B on 2 device groups of one rank, 4 micro-batches, `steps` steps on local ranks: (programs, runs)."""
    from autostrat import nn, reset_auto_parallel_context, set_auto_parallel_context
    from autostrat.frontend.train import training_plan
    from autostrat.models import TransformerStack
    from autostrat.runtime.local import LocalCluster
    from autostrat.runtime.pipeline import pipeline_values, train_stage
    from autostrat.runtime.stage_program import lower_stage_programs

    reset_auto_parallel_context()
    set_auto_parallel_context(parallel_mode="auto_parallel", device_num=2, pipeline_stages=2, pipeline_schedule="1f1b")
    net = TransformerStack(layers=2, hidden=16, heads=2, seq=4, batch=8)
    cell = nn.TrainOneStepCell(nn.PipelineCell(net, micro_size=4), nn.SGD(net.trainable_params(), 0.1))
    try:
        plan, values, batches = training_plan(cell, None, net.example_inputs(), steps=steps)
    finally:
        reset_auto_parallel_context()
    programs, values = lower_stage_programs(plan), pipeline_values(plan, values)
    return programs, LocalCluster(2).run(lambda backend: train_stage(programs[backend.rank], backend, values, batches))


def test_the_runner_traces_every_message_of_its_passes_after_the_warm_up_step():
    """Each rank's trace holds, per step after the first, a row per Send and Recv of the slots its
    order ran (in that order) and the step's end; the composed bubble lies strictly between 0 and 1."""
    from autostrat.runtime.pipeline import SLOT_OF, trace_rows
    from autostrat.runtime.instructions import Recv, Send

    programs, runs = _local_1f1b_runs()
    for program, run in zip(programs, runs):
        kinds = [SEND if isinstance(i, Send) else RECV for part in program.order()
                 for i in program.chunks[part.chunk].instructions(SLOT_OF[part.kind]) if isinstance(i, (Send, Recv))]
        assert kinds, program.rank
        assert run.trace[:, 0].tolist() == 2 * (kinds + [END]) and len(run.trace) == trace_rows(program, 2)
        assert np.all(np.diff(run.trace[: len(kinds) + 1, 3]) >= 0)  # the busy seconds only grow within a step
    assert all(0 < bubble < 1 for bubble in virtual_bubbles([run.trace for run in runs]))


def test_the_runner_leaves_its_memory_samples_out_of_the_passes(monkeypatch):
    """A fake thread clock, one per rank's thread, that only the held-memory samples advance (1 s
    each): every pass then ran 0 s, every trace row stands at 0. Charged to the passes, each would
    take a second per instruction it ran (GPipe's 24 % of its passes' CPU seconds on MPI)."""
    from autostrat.runtime.held_memory import HeldMemory

    seconds, sample = {}, HeldMemory.sample

    def sample_for_a_second(memory, *groups):
        seconds[threading.get_ident()] = seconds.get(threading.get_ident(), 0.0) + 1.0
        sample(memory, *groups)

    monkeypatch.setattr(pipeline_clock.time, "thread_time", lambda: seconds.get(threading.get_ident(), 0.0))
    monkeypatch.setattr(HeldMemory, "sample", sample_for_a_second)
    _, runs = _local_1f1b_runs(steps=2)
    assert len(seconds) == 2 and min(seconds.values()) > 0  # both ranks sampled
    for run in runs:
        assert run.trace[:, 3].tolist() == [0.0] * len(run.trace), run.rank
        assert run.part_seconds == (0.0, 0.0, 0.0), run.rank
