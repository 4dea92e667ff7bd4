"""Planner cost = brute-force minimum, and every plan runs correctly on simulated ranks.

Coverage: every ordered pair of distinct distributions (normalised layouts, partial sources and
partial destinations included) of a rank-1 [24], rank-2 [24, 12] and rank-3 [12, 8, 6] float32
tensor over 2, 4, 6 and 8 devices. Every device matrix of those device counts ([2, 4], [4, 2],
[8], [2, 1, 4], ...) refines to an ordering of its prime factors, so the distributions over
those orderings are every layout there is (`test_enumeration_covers_every_device_matrix`).
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from autostrat.cost import Hardware
from autostrat.errors import RedistributionError
from autostrat.layout import DeviceMatrix, Layout, TensorMap, assemble_tensor, split_tensor
from autostrat.redistribution import plan_redistribution, redistribution_cost, redistribution_time, simulate
from tests.redistribution_oracle import INF, all_layouts, oracle_cost, oracle_time, states

SHAPES = {1: (24,), 2: (24, 12), 3: (12, 8, 6)}
CASES = [(n, rank) for n in (2, 4, 6, 8) for rank in (1, 2, 3)]
HEAVY = {(8, 2), (8, 3)}


def _planner_cost(src: Layout, dst: Layout) -> float:
    try:
        return redistribution_cost(src, dst)
    except RedistributionError:
        return INF


def _mark(case):
    return pytest.param(*case, marks=pytest.mark.slow) if case in HEAVY else case


@pytest.mark.parametrize("device_num, rank", [_mark(case) for case in CASES])
def test_planner_cost_equals_the_brute_force_minimum(device_num, rank):
    layouts = all_layouts(device_num, SHAPES[rank])
    mismatches = [
        (str(src), str(dst), oracle_cost(src, dst), _planner_cost(src, dst))
        for src, dst in itertools.product(layouts, layouts)
        if oracle_cost(src, dst) != _planner_cost(src, dst)
    ]
    assert mismatches == []
    assert len(layouts) > 2


# Device counts, servers and tensor shapes on which the time planner meets the time oracle on every
# pair of layouts (partial destinations aside): servers whose axes are the inner, outer or both
# prime axes of the device matrix, so steps inside and across servers compete. Small tensors are
# timed mostly by latency; the large ones (megabytes) by bandwidth, where the search's bound
# counts the bytes that must cross servers (`timed.TimedBound`).
TIME_CASES = [(4, 2, (4, 4)), (4, 4, (4, 4)), (6, 2, (6, 2)), (6, 3, (6, 2)), (8, 2, (8,)), (8, 4, (8,)),
              (4, 2, (512, 1024)), (6, 3, (3 << 16, 2)), (8, 2, (1 << 19,)), (8, 4, (1 << 19,)),
              pytest.param(8, 4, (4, 2), marks=pytest.mark.slow)]


@pytest.mark.parametrize("device_num, per_server, shape", TIME_CASES)
def test_the_time_planner_is_the_brute_force_fastest(device_num, per_server, shape):
    model = Hardware(devices_per_server=per_server).alpha_beta(device_num)
    layouts = all_layouts(device_num, shape)
    x = np.random.default_rng(device_num).integers(-50, 50, size=shape).astype(np.float64)
    compared = 0
    for src, dst in itertools.product(layouts, [layout for layout in layouts if not layout.partial]):
        fastest = oracle_time(src, dst, model)
        if fastest is None:  # no common prime matrix ([2, 3] and [3, 2]): the oracle does not go there
            continue
        # The table's price (the search's objective) is the time of the plan's own steps.
        assert redistribution_time(src, dst, model=model) == fastest, (str(src), str(dst))
        assert plan_redistribution(src, dst, model=model).nanoseconds(model) == fastest, (str(src), str(dst))
        compared += 1
        if compared % 7 == 0:  # and the fast plans still move the right data
            _check_plan(src, dst, x, model)
    assert compared > len(layouts)


def _check_plan(src: Layout, dst: Layout, x: np.ndarray, model=None) -> None:
    plan = plan_redistribution(src, dst, model=model)
    pieces = simulate(plan, split_tensor(x, src))
    # np.array_equal, and the plan printed only on failure: tens of thousands of pairs are checked.
    assert np.array_equal(assemble_tensor(pieces, dst, check_replicas=True), x), str(plan)
    if not dst.partial:
        assert all(np.array_equal(got, want) for got, want in zip(pieces, split_tensor(x, dst), strict=True)), str(plan)
    assert plan.cost == sum(step.bytes for step in plan.steps)


@pytest.mark.parametrize("device_num, rank", [_mark(case) for case in CASES])
def test_every_plan_turns_source_slices_into_destination_slices(device_num, rank):
    # Integers in float64 keep partial sums exact, so the comparison can be exact.
    shape = SHAPES[rank]
    x = np.random.default_rng(device_num * 10 + rank).integers(-50, 50, size=shape).astype(np.float64)
    layouts = all_layouts(device_num, shape)
    destinations = [layout for layout in layouts if not layout.partial]
    checked = 0
    for src, dst in itertools.product(layouts, destinations):
        _check_plan(src, dst, x)
        checked += 1
    assert checked == len(layouts) * len(destinations)


@pytest.mark.parametrize("device_num", [2, 4, 6, 8])
def test_every_plan_to_a_partial_destination_sums_to_the_tensor(device_num):
    # Issue #32: whole sources and sources of fewer contributions reach partial destinations
    # (PartialCreate); each destination group's pieces sum to the tensor's slice.
    x = np.random.default_rng(device_num).integers(-50, 50, size=SHAPES[2]).astype(np.float64)
    layouts = all_layouts(device_num, SHAPES[2])
    destinations = [layout for layout in layouts if layout.partial]
    created = 0
    for src, dst in itertools.product(layouts, destinations):
        _check_plan(src, dst, x)
        created += any(step.kind == "PartialCreate" for step in plan_redistribution(src, dst).steps)
    assert created > len(destinations)


def test_plans_reach_partial_destinations_when_they_can():
    matrix = DeviceMatrix((2, 2, 2))
    src = Layout(matrix, TensorMap((2, -1)), (8, 8), partial=(0, 1))
    dst = Layout(matrix, TensorMap((2, 1)), (8, 8), partial=(0,))
    x = np.arange(64.0).reshape(8, 8)
    _check_plan(src, dst, x)
    assert plan_redistribution(src, dst).cost == oracle_cost(src, dst) > 0


def test_max_partial_sources_are_reduced_with_max():
    src = Layout(DeviceMatrix((2, 4)), TensorMap((1, -1)), (8, 8), partial=(0,), partial_op="max")
    dst = Layout(DeviceMatrix((2, 4)), TensorMap((1, 0)), (8, 8))
    rng = np.random.default_rng(3)
    x = rng.standard_normal((8, 8))
    pieces = split_tensor(x, src)
    pieces = [piece - rng.uniform(0, 1, piece.shape) * (rank % 4 != 0) for rank, piece in enumerate(pieces)]
    out = simulate(plan_redistribution(src, dst), pieces)
    np.testing.assert_array_equal(assemble_tensor(out, dst, check_replicas=True), x)


def _factorizations(number: int, length: int):
    for sizes in itertools.product(range(1, number + 1), repeat=length):
        if math.prod(sizes) == number:
            yield sizes


def test_enumeration_covers_every_device_matrix():
    # Layouts over every device matrix of up to 3 axes (size-1 axes included) normalise into
    # the enumerated set, for 4, 6 and 8 devices and a rank-2 tensor.
    for device_num in (4, 6, 8):
        enumerated = {str(layout) for layout in all_layouts(device_num, SHAPES[2])}
        seen = set()
        for length in (1, 2, 3):
            for sizes in _factorizations(device_num, length):
                axes_sizes = tuple(reversed(sizes))
                for entries, partial in states(axes_sizes, SHAPES[2]):
                    layout = Layout(DeviceMatrix(sizes), TensorMap(entries), SHAPES[2], partial)
                    seen.add(str(layout.normalized()))
        assert seen == enumerated


def test_equivalent_layouts_on_other_device_matrices_cost_the_same():
    src = Layout(DeviceMatrix((2, 1, 4)), TensorMap((2, -1)), (24, 12), partial=(0,))
    same_src = Layout(DeviceMatrix((2, 4)), TensorMap((1, -1)), (24, 12), partial=(0,))
    dst = Layout(DeviceMatrix((1, 8)), TensorMap((0, -1)), (24, 12))
    same_dst = Layout(DeviceMatrix((2, 2, 2)), TensorMap(((2, 1, 0), -1)), (24, 12))
    costs = {redistribution_cost(a, b) for a in (src, same_src) for b in (dst, same_dst)}
    assert costs == {oracle_cost(src, dst)}
