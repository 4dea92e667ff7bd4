"""Pipeline stage splits (`search.stages`): the dynamic programme against every split of small
models, and the pipeline's time, bubble and in-flight memory."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autostrat.errors import ConfigError, InfeasibleError
from autostrat.search import schedule_split
from autostrat.search.schedule_simulation import StageTimes, simulate
from autostrat.search.schedule_split import group_peaks, priced_split, split_stages
from autostrat.search.schedules import schedule_orders
from autostrat.search.stages import UnitCosts, min_max_split


def _every_split(units: int, stages: int):
    """Every split of `units` into `stages` contiguous non-empty stages, as end boundaries."""
    for cuts in itertools.combinations(range(1, units), stages - 1):
        yield cuts + (units,)


def _step(costs: UnitCosts, bounds, schedule) -> float:
    """The simulated step of a split, its stage times written here: a stage's F sends its output
    on and its B its input's gradient back when the neighbour is on another device."""
    times = [[0, 0, 0] for _ in bounds]
    for stage, (first, end) in enumerate(bounds):
        for unit in range(first, end):
            f, w = costs.forward_ns[unit], costs.weight_gradient_ns[unit]
            times[stage][0] += f
            times[stage][1] += costs.time_ns[unit] - f - w
            times[stage][2] += w
        if stage + 1 < len(bounds) and schedule.device(stage + 1) != schedule.device(stage):
            times[stage][0] += costs.send_ns
        if stage > 0 and schedule.device(stage - 1) != schedule.device(stage):
            times[stage][1] += costs.send_ns
    return simulate(schedule, StageTimes(*(tuple(t[i] for t in times) for i in range(3)))).step_ns


_SCHEDULES = [("1f1b", 1), ("gpipe", 1), ("interleaved_1f1b", 2), ("zero_bubble_h1", 1), ("zbv", 2)]


@st.composite
def _models(draw):
    name, chunks = draw(st.sampled_from(_SCHEDULES))
    devices = draw(st.integers(1, 3))
    units = draw(st.integers(devices * chunks, 8))
    figures = st.lists(st.integers(0, 50), min_size=units, max_size=units)
    time = draw(st.lists(st.integers(0, 60), min_size=units, max_size=units))
    forward = tuple(draw(st.integers(0, t // 2)) for t in time)
    weight = tuple(draw(st.integers(0, t - f)) for t, f in zip(time, forward))
    costs = UnitCosts(tuple(time), tuple(draw(figures)), tuple(draw(figures)), draw(st.integers(0, 20)),
                      tuple(draw(figures)), draw(st.integers(0, 10)), tuple(draw(figures)), forward, weight)
    micro = devices * draw(st.integers(1, 3)) if name == "interleaved_1f1b" else draw(st.integers(1, 6))
    schedule = schedule_orders(name, devices, micro, chunks)
    return costs, schedule, draw(st.one_of(st.none(), st.integers(0, 1500)))


@settings(max_examples=300, deadline=None)
@given(_models())
def test_the_split_is_the_fastest_of_every_split_by_its_schedules_simulation(model):
    """Brute force, per schedule: the split's simulated step is the least of every split whose
    every device group's model fits the budget."""
    costs, schedule, budget = model
    best = None
    for ends in _every_split(len(costs.time_ns), schedule.stages):
        bounds = tuple(zip((0,) + ends[:-1], ends))
        if budget is None or max(group_peaks(costs, bounds, schedule)) <= budget:
            step = _step(costs, bounds, schedule)
            best = step if best is None else min(best, step)
    if best is None:
        with pytest.raises(InfeasibleError, match=f"no split into {schedule.stages} pipeline stages fits"):
            split_stages(costs, schedule, budget)
        return
    split = split_stages(costs, schedule, budget)
    assert split.step_time_ns == best == _step(costs, split.bounds, schedule)
    assert split.stages == schedule.stages and split.bounds[0][0] == 0 and split.bounds[-1][1] == len(costs.time_ns)
    assert all(first < end for first, end in split.bounds) and all(a[1] == b[0] for a, b in zip(split.bounds, split.bounds[1:]))
    assert budget is None or max(split.peak_bytes) <= budget


@pytest.mark.parametrize("stages", [1, 2, 3, 4])
def test_the_least_slowest_stage_split_is_the_brute_force_one(stages):
    """`min_max_split` (the descent's start past `EXHAUSTIVE_SPLITS`) against every split."""
    time = (40, 10, 12, 9, 11, 10, 30, 25, 10, 10, 14, 50)
    slowest = {ends: max(sum(time[a:b]) for a, b in zip((0,) + ends[:-1], ends)) for ends in _every_split(12, stages)}
    least = min(slowest.values())
    found = min_max_split(12, stages, lambda stage, first, end: sum(time[first:end]))
    assert found[0] == least and slowest[found[1]] == least


@pytest.mark.parametrize("name, chunks", _SCHEDULES)
def test_past_every_split_the_descent_is_no_slower_than_the_least_slowest_stage(name, chunks, monkeypatch):
    """Past `EXHAUSTIVE_SPLITS` (here 0): the split starts from the least slowest stage and
    only moves a boundary to a faster step; on equal units that is the best of every split."""
    time = (40, 10, 12, 9, 11, 10, 30, 25, 10, 10, 14, 50)
    costs = UnitCosts(time, (1,) * 12, (1,) * 12, 3, forward_ns=tuple(t // 3 for t in time),
                      weight_gradient_ns=tuple(t // 4 for t in time))
    schedule = schedule_orders(name, 2, 4, chunks)
    monkeypatch.setattr(schedule_split, "EXHAUSTIVE_SPLITS", 0)
    found = split_stages(costs, schedule)
    start = min_max_split(12, schedule.stages, lambda stage, first, end: sum(time[first:end]))
    assert found.step_time_ns <= _step(costs, tuple(zip((0,) + start[1][:-1], start[1])), schedule)
    even = UnitCosts((10,) * 8, (1,) * 8, (1,) * 8, forward_ns=(3,) * 8, weight_gradient_ns=(3,) * 8)
    best = min(_step(even, tuple(zip((0,) + e[:-1], e)), schedule) for e in _every_split(8, schedule.stages))
    assert split_stages(even, schedule).step_time_ns == best


def test_1f1b_holds_fewer_micro_batches_than_gpipe_on_the_early_stages():
    costs = UnitCosts((10,) * 4, (100,) * 4, (1,) * 4)
    one = split_stages(costs, schedule_orders("1f1b", 4, 8))
    gpipe = split_stages(costs, schedule_orders("gpipe", 4, 8))
    assert one.peak_bytes == (401, 301, 201, 101) and gpipe.peak_bytes == (801,) * 4
    assert group_peaks(costs, ((0, 1), (1, 2), (2, 3), (3, 4)), schedule_orders("1f1b", 4, 2)) == (201, 201, 201, 101)


def test_interleaved_groups_hold_their_chunks_and_zero_bubble_holds_until_the_weight_gradient():
    costs = UnitCosts((10,) * 4, (100,) * 4, (1,) * 4)
    bounds = ((0, 1), (1, 2), (2, 3), (3, 4))
    # Device d holds 2 (p - d - 1) + (v - 1) p + 1 micro-batch chunks at most: 5 and 3.
    assert group_peaks(costs, bounds, schedule_orders("interleaved_1f1b", 2, 4, 2)) == (502, 302)
    one, h1 = (group_peaks(costs, bounds, schedule_orders(name, 4, 8)) for name in ("1f1b", "zero_bubble_h1"))
    assert one == (401, 301, 201, 101) and h1 == (401,) * 4  # ZB-H1 holds p on every stage, to W


def test_step_time_and_bubble_of_a_balanced_pipeline():
    split = priced_split(UnitCosts((10, 10), (0, 0), (0, 0)), ((0, 1), (1, 2)), schedule_orders("1f1b", 2, 4))
    assert split.step_time_ns == 50  # (4 + 2 - 1) slots of 10
    assert split.bubble == pytest.approx(1 / 5)  # (S - 1) / (m + S - 1)
    interleaved = priced_split(UnitCosts((10,) * 4, (0,) * 4, (0,) * 4), ((0, 1), (1, 2), (2, 3), (3, 4)),
                               schedule_orders("interleaved_1f1b", 2, 4, 2))
    assert interleaved.step_time_ns == 4 * 20 + 10  # m (F + B) plus (p - 1)(F + B) / v


def test_every_micro_batch_pays_its_communication():
    """Finding 1 of issue #34: a micro-batch's send is paid by every micro-batch, so the step
    grows with the micro-batches by the send times the stages pay per micro-batch."""
    quiet, loud = (UnitCosts((10, 10), (0, 0), (0, 0), send) for send in (0, 7))
    for m in (1, 4, 16):
        schedule = schedule_orders("1f1b", 2, m)
        extra = priced_split(loud, ((0, 1), (1, 2)), schedule).step_time_ns - priced_split(quiet, ((0, 1), (1, 2)), schedule).step_time_ns
        assert extra == (m + 1) * 7  # each stage sends once per micro-batch: m slots of the slowest, and the fill


def test_bad_requests_are_refused():
    costs = UnitCosts((1, 1), (1, 1), (1, 1))
    with pytest.raises(ConfigError, match="3 pipeline stages cannot split 2 layer unit"):
        split_stages(costs, schedule_orders("1f1b", 3, 4))
    with pytest.raises(ConfigError, match="one time, activation and weight figure per unit"):
        UnitCosts((1,), (1, 1), (1,))
    with pytest.raises(ConfigError, match="unit costs need one forward_ns figure per unit, got 1 for 2 units"):
        UnitCosts((1, 1), (1, 1), (1, 1), forward_ns=(1,))
    with pytest.raises(ConfigError, match="forward and weight-gradient parts must fit in each unit's time"):
        UnitCosts((1, 1), (1, 1), (1, 1), forward_ns=(1, 1), weight_gradient_ns=(1, 0))


def _gpt_plan(layers: int = 3):
    """A 3-block GPT on 4 devices with Megatron seeds, planned for bytes: its propagation gives
    every block the same strategies. (For time it does not: with recursive doubling the small
    layer-norm gradient sums are cheap, and the first block, fed by the embedding, keeps its
    layer-norm gradients split by rows where the others replicate them.)"""
    from autostrat.autodiff import Adam, build_training
    from autostrat.frontend import trace
    from autostrat.frontend.config import apply_seeds
    from autostrat.models import GPT, megatron_seeds
    from autostrat.search import SearchOptions, search

    net = GPT(layers=layers, hidden=64, heads=8, seq=16, batch=8, vocab=128)
    graph = apply_seeds(trace(net, *net.example_inputs(), device_num=4), megatron_seeds(layers, 4), 4)
    return search(build_training(graph, Adam()), 4, SearchOptions(cost_model="bytes"))


def test_unit_costs_add_up_to_the_plans_forward_and_backward():
    from autostrat.search.stages import op_units, unit_costs

    plan = _gpt_plan()
    costs = unit_costs(plan, plan.hardware)
    assert len(costs.time_ns) == 3 + 2  # embedding, 3 blocks, head and loss
    phases = plan.prediction.phases
    assert sum(costs.time_ns) == phases["forward"].time_ns + phases["backward"].time_ns
    blocks = slice(1, 4)
    # Alike blocks hold alike; their times differ only by what crosses their ends (the first
    # block's input comes from the embedding, the last's output goes to the final norm).
    assert len(set(costs.activation_bytes[blocks])) == len(set(costs.weight_bytes[blocks])) == 1
    assert max(costs.time_ns[blocks]) < 1.15 * min(costs.time_ns[blocks])
    units = op_units(plan.graph)
    parameters = [name for name, info in plan.graph.tensors.items() if info.kind == "parameter" and plan.graph.consumers(name)]
    assert sum(costs.weight_bytes) == sum(int(np.prod(plan.layouts[name].slice_shape)) * 4 for name in parameters)
    assert units["blocks.2.ffn1.matmul"] == 3 and units["ln_final.layer_norm"] == 4
    assert costs.send_ns > plan.hardware.inter_server_latency * 1e9


def test_one_repeated_layer_sequence_is_needed():
    from autostrat.autodiff import Adam, build_training
    from autostrat.frontend import trace
    from autostrat.models import FFN
    from autostrat.nn import Tensor
    from autostrat.search.stages import op_units

    with pytest.raises(ConfigError, match="pipeline stages split one sequence of repeated layers"):
        op_units(build_training(trace(FFN(), Tensor(shape=(64, 64))), Adam()))


def test_the_choice_is_the_best_of_every_schedule_chunks_and_micro_batches_by_hand():
    """Every (schedule, chunks, micro-batches) on 2 device groups of a 6-unit model, each split
    tried, written out here: `choose_schedule`'s first is the fastest that fits (ties: fewer
    micro-batches, then the candidates' order); a micro-batch's work shrinks with their count,
    its send does not."""
    time, weights = (24, 12, 12, 12, 12, 30), (9, 1, 1, 1, 1, 9)

    def costs_of(m: int) -> UnitCosts:
        share = tuple(t * 8 // m for t in time)
        return UnitCosts(share, tuple(8 * 8 // m for _ in time), weights, 6, forward_ns=tuple(s // 3 for s in share),
                         weight_gradient_ns=tuple(s // 3 for s in share))

    by_hand = [("1f1b", 1), ("gpipe", 1), ("zero_bubble_h1", 1), ("zbv", 2), ("interleaved_1f1b", 2), ("interleaved_1f1b", 3)]
    for budget in (None, 120, 60):
        found = []
        for m in (2, 4, 8):
            for rank, (name, chunks) in enumerate(by_hand):
                schedule = schedule_orders(name, 2, m, chunks)
                steps = [_step(costs_of(m), bounds, schedule) for bounds in
                         (tuple(zip((0,) + e[:-1], e)) for e in _every_split(6, schedule.stages))
                         if budget is None or max(group_peaks(costs_of(m), bounds, schedule)) <= budget]
                found += [(min(steps), m, rank, name, chunks)] if steps else []
        best = min(found)
        choice = schedule_split.choose_schedule(costs_of, 2, (8, 2, 4), budget)[0]
        assert (choice.split.step_time_ns, choice.micro_batches, choice.schedule, choice.chunks) == (best[0], best[1], *best[3:])
        assert len(schedule_split.choose_schedule(costs_of, 2, (8, 2, 4), budget)) == len(found)


def test_past_every_split_the_descent_moves_a_split_over_the_budget_until_it_fits(monkeypatch):
    """The DP sees weights only: its even split holds 1F1B's 2 micro-batches of 3 units on the
    first stage, over 45 bytes; moving the boundary one unit brings it to 40, which fits."""
    monkeypatch.setattr(schedule_split, "EXHAUSTIVE_SPLITS", 0)
    costs = UnitCosts((10,) * 6, (10,) * 6, (0,) * 6)
    schedule = schedule_orders("1f1b", 2, 4)
    assert split_stages(costs, schedule).bounds == ((0, 3), (3, 6))
    split = split_stages(costs, schedule, budget=45)
    assert split.bounds == ((0, 2), (2, 6)) and split.peak_bytes == (40, 40)
    with pytest.raises(InfeasibleError, match="no split into 2 pipeline stages fits max_device_memory = 15 bytes"):
        split_stages(costs, schedule, budget=15)
