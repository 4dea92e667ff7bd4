"""Redistribution between shapes of one element count: plans through one local Reshape.

The brute-force check finds the local reshapes by slicing, not by the planner's rule: a pair of
layouts (one per shape) is a local reshape when every rank's piece of the first, reshaped, is its
piece of the reshaped tensor under the second, and both combine the same ranks' partial values.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from autostrat.errors import RedistributionError
from autostrat.layout import DeviceMatrix, Layout, TensorMap, assemble_tensor, split_tensor
from autostrat.redistribution import lower_plan, plan_redistribution, redistribution_cost, simulate
from autostrat.redistribution.reshape import reshape_pairs, reshape_state, shape_groups
from tests.redistribution_oracle import all_layouts, oracle_cost

RESHAPES = [(6, (6, 4), (24,)), (6, (12, 2), (2, 4, 3)), (4, (8, 6), (2, 4, 6)), (4, (4, 6), (24,)), (4, (6, 4), (4, 6)), (4, (4, 2, 3), (8, 3))]


def _is_local_reshape(first: Layout, second: Layout) -> bool:
    if first.partial_groups() != second.partial_groups() or (first.partial and first.partial_op != second.partial_op):
        return False
    x = np.arange(np.prod(first.shape)).reshape(first.shape)
    pieces, wanted = split_tensor(x, first), split_tensor(x.reshape(second.shape), second)
    return all(a.size == b.size and (a.reshape(b.shape) == b).all() for a, b in zip(pieces, wanted))


def _brute_force(device_num, first_shape, second_shape):
    """Per (src, dst) pair: the cheapest oracle cost through any local reshape pair."""
    firsts, seconds = all_layouts(device_num, first_shape), all_layouts(device_num, second_shape)
    pairs = [(a, b) for a in firsts for b in seconds if _is_local_reshape(a, b)]
    head = {(src, a): oracle_cost(src, a) for src in firsts for a, _ in pairs}
    tail = {(b, dst): oracle_cost(b, dst) for _, b in pairs for dst in seconds}
    return firsts, seconds, pairs, lambda src, dst: min(head[src, a] + tail[b, dst] for a, b in pairs)


def _check_simulation(plan, src, dst):
    x = np.random.default_rng(7).integers(-9, 9, size=src.shape).astype(np.float64)
    pieces = simulate(plan, split_tensor(x, src))
    np.testing.assert_array_equal(assemble_tensor(pieces, dst, check_replicas=True), x.reshape(dst.shape), err_msg=str(plan))


@pytest.mark.parametrize("device_num, first_shape, second_shape", RESHAPES)
def test_reshape_plans_cost_the_brute_force_minimum_and_run(device_num, first_shape, second_shape):
    firsts, seconds, pairs, cheapest = _brute_force(device_num, first_shape, second_shape)
    assert len(pairs) > 1
    checked = 0
    for src, dst in itertools.product(firsts, seconds):
        expected = cheapest(src, dst)
        if expected == float("inf"):
            with pytest.raises(RedistributionError, match="no sequence of steps reaches it"):
                plan_redistribution(src, dst)
            continue
        plan = plan_redistribution(src, dst)
        assert (plan.cost, redistribution_cost(src, dst)) == (expected, expected), str(plan)
        assert [step.kind for step in plan.steps].count("Reshape") == 1
        if not dst.partial:
            _check_simulation(plan, src, dst)
        checked += 1
    assert checked > 10


@pytest.mark.parametrize("device_num, first_shape, second_shape", RESHAPES)
def test_the_reshape_rule_finds_exactly_the_local_reshapes(device_num, first_shape, second_shape):
    # Over every ordering of the prime factors, reshape_pairs lists exactly the pairs slicing
    # accepts (compared as normal forms: they merge e.g. two partial axes into one).
    orders = {(2, 2)} if device_num == 4 else {(2, 3), (3, 2)}
    listed = set()
    for order in orders:
        matrix, sizes = DeviceMatrix(order), tuple(reversed(order))
        for a, b in reshape_pairs(sizes, first_shape, second_shape, (0, 1)):
            assert reshape_state(sizes, first_shape, second_shape, a) == b
            pair = Layout(matrix, TensorMap(a[0]), first_shape, a[1]), Layout(matrix, TensorMap(b[0]), second_shape, b[1])
            listed.add(tuple(str(layout.normalized()) for layout in pair))
    _, _, pairs, _ = _brute_force(device_num, first_shape, second_shape)
    assert listed == {(str(a), str(b)) for a, b in pairs}


def test_shape_groups_pair_dims_at_common_prefix_products():
    assert shape_groups((8, 6), (2, 4, 6)) == [((0,), (0, 1)), ((1,), (2,))]
    assert shape_groups((4, 1, 6), (24,)) == [((0, 1, 2), (0,))]
    assert shape_groups((2, 3, 4), (6, 4)) == [((0, 1), (0,)), ((2,), (1,))]


def test_rows_split_four_ways_reshape_for_free_and_lower_to_a_local_reshape():
    src = Layout(DeviceMatrix((4,)), TensorMap((0, -1)), (8, 6))
    dst = Layout(DeviceMatrix((4,)), TensorMap((0, -1, -1)), (4, 2, 6))
    plan = plan_redistribution(src, dst)
    assert str(plan) == "Reshape([8, 6] -> [4, 2, 6], 0B); 0B"
    assert [str(p) for p in lower_plan(plan)] == ["Reshape(shape=[1, 2, 6])"]
    assert "Reshape(shape=[1, 2, 6])" in plan.to_text()
    _check_simulation(plan, src, dst)
    split = Layout(DeviceMatrix((2, 2)), TensorMap((1, 0, -1)), (2, 4, 6))
    assert plan_redistribution(src, split).cost == 0


def test_a_partial_source_is_reshaped_and_reduced():
    src = Layout(DeviceMatrix((2, 2)), TensorMap((1, -1)), (8, 6), partial=(0,))
    dst = Layout(DeviceMatrix((2, 2)), TensorMap((1, 0)), (2, 24))
    plan = plan_redistribution(src, dst)
    assert plan.cost == oracle_cost(src, Layout(src.device_matrix, TensorMap((1, 0)), (8, 6)))
    x = np.arange(48.0).reshape(8, 6)
    pieces = [piece * (1 if rank % 2 == 0 else 0) for rank, piece in enumerate(split_tensor(x, src))]
    np.testing.assert_array_equal(assemble_tensor(simulate(plan, pieces), dst, check_replicas=True), x.reshape(2, 24))


def test_reshapes_between_different_device_matrices_are_refined():
    src = Layout(DeviceMatrix((8,)), TensorMap((0, -1)), (16, 4))
    dst = Layout(DeviceMatrix((2, 4)), TensorMap((1, 0)), (4, 16))
    plan = plan_redistribution(src, dst)
    assert [step.kind for step in plan.steps].count("Reshape") == 1
    _check_simulation(plan, src, dst)


def test_a_whole_source_reaches_a_partial_target_of_another_shape():
    # Issue #32: once an error (no plan created partial values); gather the rows, reshape, create.
    src = Layout(DeviceMatrix((4,)), TensorMap((0, -1)), (8, 6))
    dst = Layout(DeviceMatrix((4,)), TensorMap((-1,)), (48,), partial=(0,))
    plan = plan_redistribution(src, dst)
    assert [step.kind for step in plan.steps] == ["AllGather", "Reshape", "PartialCreate"]
    assert plan.cost == redistribution_cost(src, dst) == 3 * 48
    _check_simulation(plan, src, dst)


RESHAPE_ERRORS = {
    "element count": (
        Layout(DeviceMatrix((4,)), TensorMap((0, -1)), (8, 5)),
        r"\[8, 6\] dm\[4\] tm\(0, -1\) to \[8, 5\] dm\[4\] tm\(0, -1\): shapes \[8, 6\] and \[8, 5\] differ in element count \(48 != 40\)",
    ),
}


@pytest.mark.parametrize("case", RESHAPE_ERRORS)
def test_reshape_errors_name_both_layouts(case):
    dst, message = RESHAPE_ERRORS[case]
    with pytest.raises(RedistributionError, match=message):
        plan_redistribution(Layout(DeviceMatrix((4,)), TensorMap((0, -1)), (8, 6)), dst)
    with pytest.raises(RedistributionError, match=message):
        redistribution_cost(Layout(DeviceMatrix((4,)), TensorMap((0, -1)), (8, 6)), dst)
