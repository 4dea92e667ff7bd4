"""Collective byte formulas, the α–β time model and per-strategy op costs."""

from __future__ import annotations

import pytest

from autostrat.cost import AlphaBeta, Hardware, OpCost, collective_bytes, dtype_size, op_cost
from autostrat.cost.time_model import ceil_nanoseconds
from autostrat.errors import ConfigError, LayoutError
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


def test_alpha_beta_steps_in_whole_nanoseconds():
    # 2 servers of 4: 1 µs and 100 GB/s inside, 10 µs and 10 GB/s across.
    model = AlphaBeta(DeviceMatrix((2, 4)), latency=(1e-6, 1e-5), bandwidth=(1e11, 1e10))
    # AllGather of 3000 bytes inside a server: 3 messages, 30 ns on the wire.
    assert model.step_nanoseconds("AllGather", DeviceMatrix((2, 4)), (0,), 3000) == 3 * 1000 + 30
    # AllReduce over all 8 (spans the server axis): 14 messages at 10 µs, 1750 bytes at 10 GB/s.
    assert model.step_nanoseconds("AllReduce", DeviceMatrix((8,)), (0,), 1750) == 14 * 10_000 + 175
    assert model.step_nanoseconds("CollectivePermute", DeviceMatrix((2, 4)), (1,), 1) == 10_000 + 1
    assert model.step_nanoseconds("Slice", DeviceMatrix((2, 4)), (0,), 0) == 0


def test_nanoseconds_round_up_exactly():
    # 1e9 / 3 = 333 333 333.3 ns. The float 0.1 is a little above 0.1, so 100 bytes at that rate
    # take a little under 1000 s, which rounds up to exactly 1000 s.
    assert ceil_nanoseconds(1, 3.0) == 333_333_334
    assert ceil_nanoseconds(100, 0.1) == 1000 * 10**9
    assert ceil_nanoseconds(3000, 450e9) == 7  # 6.67 ns


@pytest.mark.parametrize("device_num, matrix, latency", [
    (1, (1,), (2e-6,)), (8, (8,), (2e-6,)), (4, (4,), (2e-6,)), (16, (2, 8), (2e-6, 4e-6)),
    (1024, (128, 8), (2e-6, 4e-6)), (12, (3, 4), (2e-6, 4e-6)), (9, (9,), (4e-6,)),
])
def test_the_hardware_puts_devices_in_servers_of_8(device_num, matrix, latency):
    model = Hardware().alpha_beta(device_num)
    assert model.device_matrix == DeviceMatrix(matrix) and model.latency == latency


def test_default_hardware_is_an_h100_server():
    hardware = Hardware()
    assert hardware.device_flops == 989.4e12 and hardware.device_memory_bandwidth == 3.35e12
    assert (hardware.intra_server_bandwidth, hardware.inter_server_bandwidth) == (450e9, 50e9)
    assert hardware.devices_per_server == 8


def test_matmul_compute_time_on_8_devices():
    # [256, 784] x [784, 64] split ((2, 1), (1, 4)): 2·256·784·64/8 flops, 459 776 bytes.
    rule = make_rule("MatMul", [(256, 784), (784, 64)])
    cost = op_cost(Strategy.from_tuples(rule, ((2, 1), (1, 4)), 8))
    hardware = Hardware(device_flops=1e12, device_memory_bandwidth=1e11)
    # float32 runs at half the rate: 3 211 264 flops at 0.5 TFLOP/s, 459 776 bytes at 100 GB/s.
    assert hardware.compute_nanoseconds(cost, ("float32",) * 3) == 6423 + 4598
    assert hardware.compute_nanoseconds(cost, ("float16",) * 3) == 3212 + 4598
    assert hardware.compute_nanoseconds(OpCost(10, 0), ("int32",)) == 1  # no float: the full rate


@pytest.mark.parametrize("key, value, message", [
    ("device_flops", 0, "device_flops must be a finite number > 0 (FLOP/s), got 0"),
    ("inter_server_bandwidth", float("inf"), "inter_server_bandwidth must be a finite number > 0 (bytes/s), got inf"),
    ("intra_server_latency", -1e-6, "intra_server_latency must be a finite number >= 0 (seconds), got -1e-06"),
    ("device_memory_bandwidth", "fast", "device_memory_bandwidth must be a finite number > 0 (bytes/s), got 'fast'"),
    ("devices_per_server", 0, "devices_per_server must be a positive integer, got 0"),
])
def test_hardware_values_are_checked(key, value, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        Hardware(**{key: value})
