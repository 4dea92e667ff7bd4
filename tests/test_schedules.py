"""Pipeline schedules (`search.schedules`): the simulated step against the published closed forms
on uniform stages, against the stage split's slot model, and on any stage times against a
longest path over the dependency graph written here; peak activations against the published
figures; orders that are not a schedule's, or deadlock, raise naming the instruction."""

from __future__ import annotations

import graphlib
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autostrat.errors import ConfigError
from autostrat.search.schedule_simulation import StageTimes, check_orders, simulate
from autostrat.search.schedules import SCHEDULE_ORDERS, Instruction, Schedule, schedule_orders
from autostrat.search.schedule_split import priced_split
from autostrat.search.stages import UnitCosts

_TIMES = st.integers(1, 9)


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(["gpipe", "1f1b"]), st.integers(1, 8), st.integers(1, 24), _TIMES, _TIMES, st.integers(0, 9))
def test_gpipe_and_1f1b_take_m_plus_p_minus_1_whole_backwards(name, p, m, forward, backward, weight):
    run = simulate(schedule_orders(name, p, m), StageTimes.uniform(p, forward, backward, weight))
    whole = forward + backward + weight  # their backward includes the weight gradient
    assert run.step_ns == m * whole + (p - 1) * whole
    assert run.idle_ns == ((p - 1) * whole,) * p
    assert run.bubble == pytest.approx((p - 1) / (m + p - 1))


@settings(max_examples=150, deadline=None)
@given(st.integers(1, 8), st.integers(1, 4), st.integers(1, 4), _TIMES, _TIMES, st.integers(0, 9))
def test_interleaved_1f1b_divides_the_bubble_by_the_chunks(p, groups, v, forward, backward, weight):
    m = groups * p
    run = simulate(schedule_orders("interleaved_1f1b", p, m, v), StageTimes.uniform(p * v, forward, backward, weight))
    whole = v * (forward + backward + weight)  # one device's F + B over its v chunks
    assert run.step_ns == m * whole + (p - 1) * whole / v


@settings(max_examples=150, deadline=None)
@given(st.integers(1, 8), st.integers(0, 16), _TIMES, _TIMES, st.integers(0, 9))
def test_zero_bubble_h1_bubble_is_p_minus_1_times_f_plus_b_minus_w(p, extra, forward, backward, weight):
    """Qi et al.'s ZB-H1 bubble, (p - 1)(F + B - W) (the issue's (p - 1)(F + B - 2W) is ZB-H2's),
    where it holds: at least p micro-batches and a weight gradient no longer than a forward or
    an input gradient (found by simulating: with a longer W the delayed W passes overflow the
    drain's waits and the step is longer)."""
    m, weight = p + extra, min(weight, forward, backward)
    run = simulate(schedule_orders("zero_bubble_h1", p, m), StageTimes.uniform(p, forward, backward, weight))
    assert run.step_ns == m * (forward + backward + weight) + (p - 1) * (forward + backward - weight)
    if forward == backward == weight:  # the paper's bubble rate with equal F, B, W
        assert run.bubble == pytest.approx((p - 1) / (3 * m + p - 1))


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 8), st.integers(0, 8), _TIMES)
def test_zbv_at_equal_times_takes_the_least_step_any_order_allows(p, extra, chunk_pass):
    """ZB-V at F = B = W (per chunk `chunk_pass`) and m >= 2p: device p - 1 starts after p - 1
    chunk forwards, then is never idle; every device holds 2p micro-batch chunks at most, 1F1B's
    first device's p micro-batches (the paper's "1x")."""
    m = 2 * p + extra
    run = simulate(schedule_orders("zbv", p, m), StageTimes.uniform(2 * p, chunk_pass, chunk_pass, chunk_pass))
    assert run.step_ns == m * 6 * chunk_pass + (p - 1) * chunk_pass
    assert run.idle_ns[p - 1] == (p - 1) * chunk_pass
    assert run.peak_activations == (2 * p,) * p


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 8), st.integers(1, 24))
def test_zbv_holds_2p_micro_batch_chunks_at_most(p, m):
    assert max(simulate(schedule_orders("zbv", p, m), StageTimes.uniform(2 * p, 1, 1, 1)).peak_activations) <= 2 * p


def test_zbv_is_the_papers_v():
    """Qi et al.'s ZB-V on 2 devices x 4 micro-batches (a, b: chunks 0, 1): device 1 holds the
    V's turn (stages 1 and 2), device 0 the first and the last stage."""
    orders = [" ".join(f"{i.kind}{i.micro_batch}{'ab'[i.chunk]}" for i in order) for order in schedule_orders("zbv", 2, 4).orders]
    assert orders == ["F0a F1a F2a F0b B0b W0b F1b B1b W1b F3a B0a W0a F2b B2b W2b B1a W1a F3b B3b W3b B2a W2a B3a W3a",
                      "F0a F0b F1a F1b B0b W0b F2a B0a W0a F2b B1b W1b F3a B1a W1a F3b B2b W2b B2a B3b B3a W2a W3b W3a"]


@pytest.mark.parametrize("chunk_times, bound, zbv, h1", [
    ((1, 1.5, 0.75), 55, 56.5, 62.5),  # a device's F 2, B 3, W 1.5
    ((17.2, 14.7, 6.1), 659.6, 672.1, 762.8),  # benchmarks/pipeline.py --schedules' measured F : B : W
])
def test_zbv_on_unequal_times_stays_near_its_bound(chunk_times, bound, zbv, h1):
    """On 4 devices x 8 micro-batches with unequal F, B, W, ZB-V's order (planned for no times)
    takes within 3 % of m (F + B + W) + (p - 1) F / 2 and beats ZB-H1 (an order planned for
    equal times took 71.75 and 781.1: slower than ZB-H1)."""
    run = simulate(schedule_orders("zbv", 4, 8), StageTimes.uniform(8, *chunk_times))
    assert 8 * 2 * sum(chunk_times) + 3 * chunk_times[0] == pytest.approx(bound)
    assert run.step_ns == pytest.approx(zbv) and zbv <= 1.03 * bound
    assert simulate(schedule_orders("zero_bubble_h1", 4, 8), StageTimes.uniform(4, *(2 * t for t in chunk_times))).step_ns == pytest.approx(h1)


def test_equal_passes_give_the_papers_bubble_rates():
    """Qi et al.'s table with F = B = W: bubble over the work, (p - 1)/m for 1F1B, (p - 1)/(3m)
    for ZB-H1."""
    p, m, work = 4, 8, 8 * 3
    one = simulate(schedule_orders("1f1b", p, m), StageTimes.uniform(p, 1, 1, 1))
    zero = simulate(schedule_orders("zero_bubble_h1", p, m), StageTimes.uniform(p, 1, 1, 1))
    assert (one.step_ns - work) / work == (p - 1) / m
    assert (zero.step_ns - work) / work == (p - 1) / (3 * m)


@pytest.mark.parametrize("p, m", [(1, 1), (1, 5), (3, 2), (4, 8), (8, 16)])
def test_peak_activations_are_the_published_figures(p, m):
    """GPipe holds every micro-batch; 1F1B p - d on device d; ZB-H1 p on every device until the
    weight gradient (p - d until the input gradient, like 1F1B); interleaved with v chunks
    2 (p - d - 1) + (v - 1) p + 1 micro-batch chunks on device d, on the first device
    p (1 + (p - 1)/(p v)) micro-batches of a whole device's layers (Korthikanti et al.)."""
    runs = {name: simulate(schedule_orders(name, p, m), StageTimes.uniform(p, 1, 1, 1)) for name in ("gpipe", "1f1b", "zero_bubble_h1")}
    assert runs["gpipe"].peak_activations == (m,) * p
    assert runs["1f1b"].peak_activations == runs["1f1b"].peak_until_backward == tuple(min(p - d, m) for d in range(p))
    assert runs["zero_bubble_h1"].peak_until_backward == runs["1f1b"].peak_activations
    if m >= p:
        assert runs["zero_bubble_h1"].peak_activations == (p,) * p
    for v in (1, 2, 3):
        run = simulate(schedule_orders("interleaved_1f1b", p, 2 * p, v), StageTimes.uniform(p * v, 1, 1, 1))
        assert run.peak_activations == tuple(min(2 * (p - d - 1) + (v - 1) * p + 1, 2 * p * v) for d in range(p))
        assert run.peak_activations[0] / v == pytest.approx(p * (1 + (p - 1) / (p * v)))


@settings(max_examples=100, deadline=None)
@given(st.sampled_from(["gpipe", "1f1b"]), st.integers(1, 8), st.integers(1, 24), _TIMES, _TIMES)
def test_gpipe_and_1f1b_agree_with_the_stage_splits_slot_model(name, p, m, forward, backward):
    """On uniform stages and free sends, the closed-form step and bubble ((m + p - 1) slots) and
    the micro-batches in flight are those of the stage split's model (`schedule_split.priced_split`)."""
    schedule = schedule_orders(name, p, m)
    run = simulate(schedule, StageTimes.uniform(p, forward, backward))
    costs = UnitCosts((forward + backward,) * p, (1,) * p, (0,) * p, forward_ns=(forward,) * p)  # one unit per stage
    split = priced_split(costs, tuple((d, d + 1) for d in range(p)), schedule)
    assert run.step_ns == split.step_time_ns == (m + p - 1) * (forward + backward)
    assert run.bubble == pytest.approx(split.bubble)
    assert run.peak_activations == split.peak_bytes == tuple(m if name == "gpipe" else min(p - d, m) for d in range(p))


def _stage_of(schedule: Schedule, device: int, chunk: int) -> int:
    """Megatron's chunk c of device d is stage c p + d; ZB-V's V runs chunk 1 back up."""
    p = schedule.devices
    return 2 * p - 1 - device if schedule.name == "zbv" and chunk else chunk * p + device


def _longest_path(schedule: Schedule, times: StageTimes) -> dict:
    """Each instruction's finish, as (kind, micro-batch, stage): the longest path to it over
    the graph of what it needs (plus a send across devices) and the instruction its device
    runs before it."""
    p, stages = schedule.devices, schedule.devices * schedule.chunks
    split = any(i.kind == "W" for order in schedule.orders for i in order)
    device_of = {_stage_of(schedule, d, chunk): d for d in range(p) for chunk in range(schedule.chunks)}
    lengths = {"F": times.forward_ns, "B": [b + (0 if split else w) for b, w in zip(times.backward_ns, times.weight_ns)],
               "W": times.weight_ns}
    before: dict = {}  # node -> [(node it waits for, delay)]
    for d, order in enumerate(schedule.orders):
        for n, (kind, micro_batch, chunk) in enumerate(order):
            k = _stage_of(schedule, d, chunk)
            edges = before.setdefault((kind, micro_batch, k), [])
            if n:
                edges.append(((order[n - 1].kind, order[n - 1].micro_batch, _stage_of(schedule, d, order[n - 1].chunk)), 0))
            other = {"F": k - 1, "B": k + 1, "W": k}[kind]
            if kind == "F" and k == 0:
                continue
            if kind == "B" and k == stages - 1:
                edges.append((("F", micro_batch, k), 0))
                continue
            send = times.send_ns[min(k, other)] if kind != "W" and device_of[other] != d and times.send_ns else 0
            edges.append(((kind if kind != "W" else "B", micro_batch, other), send))
    finish = {}
    for node in graphlib.TopologicalSorter({node: [e for e, _ in edges] for node, edges in before.items()}).static_order():
        start = max((finish[e] + delay for e, delay in before[node]), default=0)
        finish[node] = start + lengths[node[0]][node[2]]
    return finish


@st.composite
def _runs(draw):
    name = draw(st.sampled_from(SCHEDULE_ORDERS))
    p = draw(st.integers(1, 6))
    v = draw(st.integers(1, 3)) if name == "interleaved_1f1b" else 2 if name == "zbv" else 1
    m = p * draw(st.integers(1, 3)) if name == "interleaved_1f1b" else draw(st.integers(1, 12))
    figures = st.lists(st.integers(0, 20), min_size=p * v, max_size=p * v)
    sends = st.lists(st.integers(0, 5), min_size=p * v - 1, max_size=p * v - 1)
    times = StageTimes(tuple(draw(figures)), tuple(draw(figures)), tuple(draw(figures)), tuple(draw(sends)))
    return schedule_orders(name, p, m, v if name == "interleaved_1f1b" else None), times


@settings(max_examples=150, deadline=None)
@given(_runs())
def test_any_stage_times_give_the_longest_path_through_the_dependencies(drawn):
    schedule, times = drawn
    run = simulate(schedule, times)
    finish = _longest_path(schedule, times)
    assert run.finish_ns == finish
    assert run.step_ns == max(finish.values())
    work = [sum(times.forward_ns[k] + times.backward_ns[k] + times.weight_ns[k] for k in {_stage_of(schedule, d, c) for c in range(schedule.chunks)})
            for d in range(schedule.devices)]
    assert run.busy_ns == tuple(schedule.micro_batches * w for w in work)


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 6), st.integers(1, 12), st.data())
def test_the_slowest_stage_dominates(p, m, data):
    """GPipe's step is each pass's fill, then the slowest stage's m - 1 more (Σ F + (m - 1) max F,
    the same for B); 1F1B's lies between the slowest device's work after what precedes its first
    forward and follows its last backward, and the slot model's (m + p - 1) max (F + B)."""
    forward = data.draw(st.lists(_TIMES, min_size=p, max_size=p))
    backward = data.draw(st.lists(_TIMES, min_size=p, max_size=p))
    times = StageTimes(tuple(forward), tuple(backward), (0,) * p)
    gpipe = simulate(schedule_orders("gpipe", p, m), times)
    assert gpipe.step_ns == sum(forward) + (m - 1) * max(forward) + sum(backward) + (m - 1) * max(backward)
    one = simulate(schedule_orders("1f1b", p, m), times)
    slots = [f + b for f, b in zip(forward, backward)]
    assert max(sum(slots[:k]) + m * slots[k] for k in range(p)) <= one.step_ns <= (m + p - 1) * max(slots)


def test_a_deadlocking_order_names_the_instruction_that_waits():
    schedule = schedule_orders("1f1b", 4, 8)
    last = schedule.orders[3]  # runs B(0) before F(0): it waits for its own later forward
    orders = schedule.orders[:3] + ((last[1], last[0]) + last[2:],)
    with pytest.raises(ConfigError, match=r"^1f1b deadlocks: device 3 waits at B\(micro-batch 0, chunk 0\) \(its instruction 0\) "
                                          r"for F of micro-batch 0 on stage 3, which it runs later$"):
        simulate(Schedule("1f1b", 4, 8, 1, orders), StageTimes.uniform(4, 1, 2))


def test_a_deadlock_across_devices_names_its_cycle():
    """Device 0 runs micro-batch 0's backward before micro-batch 1's forward, which device 1
    waits for before micro-batch 0's forward and backward."""
    f0, b0, f1, b1 = Instruction("F", 0), Instruction("B", 0), Instruction("F", 1), Instruction("B", 1)
    with pytest.raises(ConfigError, match=r"^1f1b deadlocks: device 0 waits at B\(micro-batch 0, chunk 0\) \(its instruction 1\) "
                                          r"for B of micro-batch 0 on stage 1, which device 1 runs later; device 1 waits at "
                                          r"F\(micro-batch 1, chunk 0\) \(its instruction 0\) for F of micro-batch 1 on stage 0, "
                                          r"which device 0 runs later$"):
        check_orders(Schedule("1f1b", 2, 2, 1, ((f0, b0, f1, b1), (f1, f0, b0, b1))))


@pytest.mark.parametrize("edit, message", [
    (lambda order: order + (Instruction("F", 0),), "F(micro-batch 0, chunk 0) runs more than once"),
    (lambda order: order[1:], "F(micro-batch 0, chunk 0) is missing"),
    (lambda order: order + (Instruction("W", 0),), "W(micro-batch 0, chunk 0) is not one of its instructions"),
    (lambda order: order + (Instruction("F", 9),), "F(micro-batch 9, chunk 0) is not one of its instructions"),
])
def test_an_order_that_is_not_the_schedules_is_refused(edit, message):
    schedule = schedule_orders("1f1b", 2, 3)
    expected = f"1f1b's order of device 1 must run each of F, B of 3 micro-batch(es) on 1 chunk(s) once: {message}"
    with pytest.raises(ConfigError, match=f"^{re.escape(expected)}$"):
        check_orders(Schedule("1f1b", 2, 3, 1, (schedule.orders[0], edit(schedule.orders[1]))))


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(SCHEDULE_ORDERS), st.integers(1, 8), st.integers(1, 4), st.integers(1, 3))
def test_every_schedules_orders_are_valid(name, p, groups, v):
    check_orders(schedule_orders(name, p, groups * p, v if name == "interleaved_1f1b" else None))
    check_orders(schedule_orders("zbv", p, groups))


@pytest.mark.parametrize("call, message", [
    (lambda: schedule_orders("zb", 4, 8), "pipeline schedule must be one of 1f1b, gpipe, interleaved_1f1b, zbv, zero_bubble_h1, got 'zb'"),
    (lambda: schedule_orders("zbv", 4, 8, 3), "zbv runs 2 model chunk(s) per device, got 3"),
    (lambda: schedule_orders("1f1b", 0, 8), "needs at least one device and one micro-batch, got 0 device(s) and 8"),
    (lambda: schedule_orders("interleaved_1f1b", 4, 6), "micro_batches must be a multiple of 4, got 6"),
    (lambda: schedule_orders("1f1b", 4, 8, 2), "1f1b runs 1 model chunk(s) per device, got 2"),
    (lambda: schedule_orders("interleaved_1f1b", 4, 8, 0), "runs a positive number of model chunk(s) per device, got 0"),
    (lambda: StageTimes((1, 1), (1, 1), (1,)), "one forward, backward and weight figure per stage and one send per boundary, got 2, 2, 1 and 1"),
    (lambda: simulate(schedule_orders("interleaved_1f1b", 2, 2), StageTimes.uniform(2, 1, 1)),
     "interleaved_1f1b on 2 device(s) x 2 chunk(s) needs times for 4 stages, got 2"),
])
def test_bad_requests_are_refused(call, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        call()
