"""Collective byte formulas, the α–β time model and per-strategy op costs."""

from __future__ import annotations

import pytest

from autostrat.cost import AlphaBeta, collective_bytes, dtype_size, op_cost
from autostrat.errors import LayoutError
from autostrat.layout import DeviceMatrix, Strategy
from autostrat.rules import make_rule


@pytest.mark.parametrize(
    "kind, expected",
    [("AllGather", 7 * 800), ("ReduceScatter", 700), ("AllToAll", 700), ("AllReduce", 1400),
     ("CollectivePermute", 800), ("Slice", 0), ("Reshape", 0)],
)
def test_ring_formulas_for_8_devices_and_800_bytes(kind, expected):
    assert collective_bytes(kind, 8, 800) == expected


def test_uneven_chunks_round_up():
    assert collective_bytes("AllReduce", 3, 4) == 6  # 2 * 2 * 4 / 3 = 5.33
    assert collective_bytes("ReduceScatter", 3, 4) == 3


def test_a_group_of_one_sends_nothing():
    assert {collective_bytes(kind, 1, 64) for kind in ("AllGather", "AllReduce", "AllToAll", "ReduceScatter")} == {0}


def test_unknown_kind_is_an_error():
    with pytest.raises(LayoutError, match="collective kind must be one of"):
        collective_bytes("Broadcast", 2, 4)


def test_negative_bytes_are_an_error():
    with pytest.raises(LayoutError, match="needs a group of >= 1 devices and >= 0 bytes"):
        collective_bytes("AllGather", 2, -4)


def test_dtype_sizes():
    assert (dtype_size("float32"), dtype_size("float16"), dtype_size("int8")) == (4, 2, 1)
    with pytest.raises(LayoutError, match="must name a numpy dtype"):
        dtype_size(object())


def test_alpha_beta_charges_the_slowest_axis_a_group_spans():
    model = AlphaBeta(DeviceMatrix((2, 4)), latency=(1.0, 10.0), bandwidth=(100.0, 10.0))
    assert model.link(DeviceMatrix((2, 4)), (0,)) == (1.0, 100.0)
    assert model.link(DeviceMatrix((8,)), (0,)) == (10.0, 10.0)
    assert model.link(DeviceMatrix((2, 2, 2)), (0,)) == (1.0, 100.0)
    assert model.step_time("AllReduce", DeviceMatrix((2, 4)), (0,), 600) == 2 * 3 * 1.0 + 6.0
    assert model.step_time("Slice", DeviceMatrix((2, 4)), (0,), 0) == 0.0


def test_alpha_beta_needs_one_value_per_axis():
    with pytest.raises(LayoutError, match="needs 2 latencies and bandwidths, got 1 and 2"):
        AlphaBeta(DeviceMatrix((2, 4)), latency=(1.0,), bandwidth=(1.0, 1.0))


def test_alpha_beta_needs_positive_bandwidths():
    with pytest.raises(LayoutError, match="bandwidths > 0"):
        AlphaBeta(DeviceMatrix((2,)), latency=(1.0,), bandwidth=(0.0,))


def test_alpha_beta_needs_the_same_device_num():
    model = AlphaBeta(DeviceMatrix((2,)), latency=(1.0,), bandwidth=(1.0,))
    with pytest.raises(LayoutError, match="does not have the 2 devices"):
        model.link(DeviceMatrix((4,)), (0,))


def test_matmul_op_cost_per_device():
    rule = make_rule("MatMul", [(256, 784), (784, 64)])
    cost = op_cost(Strategy.from_tuples(rule, ((2, 2), (2, 2)), 8))
    assert cost.flops_per_device == 2 * 256 * 784 * 64 // 8
    assert cost.memory_bytes_per_device == (128 * 392 + 392 * 32 + 128 * 32) * 4
    assert cost.comm_bytes == 0


def test_op_cost_without_reduction_counts_one_flop_per_element_and_per_operand_dtypes():
    rule = make_rule("ReLU", [(64, 32)])
    cost = op_cost(Strategy.from_tuples(rule, ((2, 4),), 8), ("float16", "float32"))
    assert cost.flops_per_device == 64 * 32 // 8
    assert cost.memory_bytes_per_device == 32 * 8 * 2 + 32 * 8 * 4


def test_op_cost_needs_one_dtype_per_operand():
    rule = make_rule("ReLU", [(64, 32)])
    with pytest.raises(LayoutError, match="expected one dtype or 2"):
        op_cost(Strategy.from_tuples(rule, ((2, 4),), 8), ("float16",))
