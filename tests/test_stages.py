"""Pipeline stage splits (`search.stages`): the dynamic programme against every split of small
models, and the pipeline's time, bubble and in-flight memory."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autostrat.errors import ConfigError, InfeasibleError
from autostrat.search.stages import StageSplit, UnitCosts, in_flight, split_stages, stage_cost


def _every_split(units: int, stages: int):
    """Every split of `units` into `stages` contiguous non-empty stages, as end boundaries."""
    for cuts in itertools.combinations(range(1, units), stages - 1):
        yield cuts + (units,)


@st.composite
def _models(draw):
    units = draw(st.integers(1, 8))
    figures = st.lists(st.integers(0, 50), min_size=units, max_size=units)
    costs = UnitCosts(tuple(draw(figures)), tuple(draw(figures)), tuple(draw(figures)), draw(st.integers(0, 20)))
    stages = draw(st.integers(1, units))
    return costs, stages, draw(st.integers(1, 6)), draw(st.one_of(st.none(), st.integers(0, 400))), draw(st.sampled_from(["1f1b", "gpipe"]))


@settings(max_examples=400, deadline=None)
@given(_models())
def test_the_split_is_the_best_of_every_split(model):
    costs, stages, micro, budget, schedule = model
    best = None
    for ends in _every_split(len(costs.time_ns), stages):
        bounds = list(zip((0,) + ends[:-1], ends))
        priced = [stage_cost(costs, first, end, s, stages, micro, schedule) for s, (first, end) in enumerate(bounds)]
        if budget is None or all(peak <= budget for _, peak in priced):
            slowest = max(slot for slot, _ in priced)
            best = slowest if best is None else min(best, slowest)
    if best is None:
        with pytest.raises(InfeasibleError, match=f"no split into {stages} pipeline stages fits"):
            split_stages(costs, stages, micro, budget, schedule)
        return
    split = split_stages(costs, stages, micro, budget, schedule)
    assert max(split.slot_ns) == best
    assert split.stages == stages and split.bounds[0][0] == 0 and split.bounds[-1][1] == len(costs.time_ns)
    assert all(first < end for first, end in split.bounds)
    assert all(a[1] == b[0] for a, b in zip(split.bounds, split.bounds[1:]))
    assert budget is None or max(split.peak_bytes) <= budget


def test_1f1b_holds_fewer_micro_batches_than_gpipe_on_the_early_stages():
    costs = UnitCosts((10,) * 4, (100,) * 4, (1,) * 4)
    one, gpipe = split_stages(costs, 4, 8, schedule="1f1b"), split_stages(costs, 4, 8, schedule="gpipe")
    assert one.peak_bytes == (401, 301, 201, 101) and gpipe.peak_bytes == (801,) * 4
    assert [in_flight(s, 4, 2, "1f1b") for s in range(4)] == [2, 2, 2, 1]  # never more than there are


def test_step_time_and_bubble_of_a_balanced_pipeline():
    split = StageSplit(((0, 1), (1, 2)), (10, 10), (0, 0), micro_batches=4)
    assert split.step_time_ns == 50  # (4 + 2 - 1) slots of 10
    assert split.bubble == pytest.approx(1 / 5)  # (S - 1) / (m + S - 1)


def test_bad_requests_are_refused():
    costs = UnitCosts((1, 1), (1, 1), (1, 1))
    with pytest.raises(ConfigError, match="3 pipeline stages cannot split 2 layer unit"):
        split_stages(costs, 3, 4)
    with pytest.raises(ConfigError, match="schedule must be one of 1f1b, gpipe"):
        split_stages(costs, 2, 4, schedule="zb")
    with pytest.raises(ConfigError, match="one time, activation and weight figure per unit"):
        UnitCosts((1,), (1, 1), (1,))


def _gpt_plan(layers: int = 3):
    from autostrat.autodiff import Adam, build_training
    from autostrat.frontend import trace
    from autostrat.frontend.config import apply_seeds
    from autostrat.models import GPT, megatron_seeds
    from autostrat.search import SearchOptions, search

    net = GPT(layers=layers, hidden=64, heads=8, seq=16, batch=8, vocab=128)
    graph = apply_seeds(trace(net, *net.example_inputs(), device_num=4), megatron_seeds(layers, 4), 4)
    return search(build_training(graph, Adam()), 4, SearchOptions(cost_model="time"))


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
