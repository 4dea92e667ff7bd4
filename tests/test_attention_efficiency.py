"""Fused attention's own kernel rate (issue #35): a profile giving FlashAttention-2's published H100
rates (`cost.hardware`) prices FlashAttention ops at them, the forward on its flops, the
backward's two ops on the 10 flops per score FlashAttention counts; a profile file gives and
round-trips the two fields, and refuses a value outside (0, 1] naming the field and the file.
The expected times here are flops over the published rate, worked by hand."""

from __future__ import annotations

import math
import re
from dataclasses import replace
from fractions import Fraction

import pytest

from autostrat.cost import PROFILES, Hardware, op_cost
from autostrat.errors import ConfigError
from autostrat.frontend.hardware_file import read_hardware_file
from autostrat.layout import Strategy
from autostrat.plan_source import _embedded_hardware
from autostrat.rules import make_rule

# FlashAttention-2's published H100 rates, as a profile file gives them (the shipped profile does
# not yet: `cost.hardware`'s docstring says why).
H100 = replace(PROFILES["h100-sxm-80gb"], attention_efficiency=335 / 989.4, attention_backward_efficiency=322 / 989.4)
B, N, S, D = 2, 4, 256, 128  # batch, heads, sequence, head dim (Llama's 128)
SCORES = B * N * S * S * D  # multiply-adds of one product over every (query, key) pair: QKᵀ, PV, ...
TENSOR_BYTES = B * N * S * D * 2  # one [b, n, s, d] tensor in 16 bits
FORWARD_RATE, BACKWARD_RATE = 335e12, 322e12  # FlashAttention-2 on H100, head dim 128 (Shah et al. 2024)
DTYPES = ("float16",) * 6


def _ns(amount, rate) -> int:
    """Whole nanoseconds, rounded up, of `amount` at `rate` per second (flops or bytes)."""
    return math.ceil(Fraction(amount) * 10**9 / Fraction(rate))


def _priced(op_type: str, inputs: int, splits=None, device_num: int = 1, ring: bool = False, hardware=H100) -> int:
    rule = make_rule(op_type, [(B, N, S, D)] * inputs, head_num=N)
    strategy = Strategy(rule, splits or (1,) * len(rule.factors), device_num, ring=ring)
    cost = op_cost(strategy, DTYPES[:inputs + len(strategy.output_layouts)])
    return hardware.compute_nanoseconds(cost, DTYPES[:inputs], op_type)


def test_the_forward_runs_at_flash_attention_2s_h100_rate():
    # QKᵀ and PV, 2 flops per multiply-add each, at 335 TFLOP/s; q, k, v and the output at 3.35 TB/s.
    memory = _ns(4 * TENSOR_BYTES, H100.device_memory_bandwidth)
    assert abs(_priced("FlashAttentionScore", 3) - (_ns(4 * SCORES, FORWARD_RATE) + memory)) <= 1
    # Without the profile's attention rate, the same op runs at the nominal 989.4 TFLOP/s.
    nominal = replace(H100, attention_efficiency=None, attention_backward_efficiency=None)
    assert _priced("FlashAttentionScore", 3, hardware=nominal) == _ns(4 * SCORES, 989.4e12) + memory


def test_the_backwards_two_ops_take_what_flash_attentions_one_kernel_takes():
    # FlashAttention's backward: S again, dV, dP, dQ, dK: 10 flops per score at 322 TFLOP/s, shared
    # by autostrat's query gradient (q, k, v, dy in; dq out) and key/value gradient (dk, dv out).
    memory = _ns(5 * TENSOR_BYTES, H100.device_memory_bandwidth) + _ns(6 * TENSOR_BYTES, H100.device_memory_bandwidth)
    pair = _priced("FlashAttentionScoreQueryGrad", 4) + _priced("FlashAttentionScoreKeyValueGrad", 4)
    assert abs(pair - (_ns(10 * SCORES, BACKWARD_RATE) + memory)) <= 2  # each op rounds up once


def test_ring_attentions_blocks_run_at_the_attention_rate():
    # A ring over 2 devices splitting the query rows: each device computes its half of the rows
    # against every key block, half the scores, at 335 TFLOP/s (its sends are priced apart, `cost.ring`).
    splits = (1, 1, 2, 1, 1)
    memory = _ns(4 * TENSOR_BYTES // 2, H100.device_memory_bandwidth)
    assert abs(_priced("FlashAttentionScore", 3, splits, 2, ring=True) - (_ns(4 * SCORES // 2, FORWARD_RATE) + memory)) <= 1


def test_other_ops_keep_the_matmul_rate():
    rule = make_rule("MatMul", [(256, 256), (256, 256)])
    cost = op_cost(Strategy(rule, (1, 1, 1), 1), "float16")
    assert H100.compute_nanoseconds(cost, ("float16",), "MatMul") == _ns(2 * 256**3, 989.4e12) + _ns(3 * 256 * 256 * 2, 3.35e12)


SPEEDS = ("device_flops: 989.4e12\ndevice_memory_bandwidth: 3.35e12\nintra_server_bandwidth: 450e9\n"
          "inter_server_bandwidth: 50e9\nintra_server_latency: 2.0e-6\ninter_server_latency: 4.0e-6\ndevices_per_server: 8\n")


def test_a_profile_file_round_trips_the_attention_efficiencies(tmp_path):
    path = tmp_path / "h100.yaml"
    path.write_text(SPEEDS + f"attention_efficiency: {H100.attention_efficiency!r}\n"
                             f"attention_backward_efficiency: {H100.attention_backward_efficiency!r}\n")
    assert read_hardware_file(path) == replace(H100, name="h100.yaml")
    path.write_text(SPEEDS)  # absent: unset, fused attention at matmul_efficiency as before
    assert read_hardware_file(path) == replace(H100, name="h100.yaml", attention_efficiency=None,
                                               attention_backward_efficiency=None)


def test_a_plan_record_of_before_the_attention_efficiencies_still_reads():
    record = {field: value for field, value in vars(H100).items() if not field.startswith("attention")}
    assert _embedded_hardware(record, "plan.json") == replace(H100, attention_efficiency=None, attention_backward_efficiency=None)


@pytest.mark.parametrize("field", ["attention_efficiency", "attention_backward_efficiency"])
@pytest.mark.parametrize("value", ["0", "-0.3", "1.5", "true", "[0.5]"])
def test_an_attention_efficiency_outside_0_1_is_refused_naming_field_and_file(tmp_path, field, value):
    path = tmp_path / "hw.yaml"
    path.write_text(SPEEDS + f"{field}: {value}\n")
    with pytest.raises(ConfigError, match=re.escape(f"{path}: {field} must be a number in (0, 1] (a fraction of the "
                                                    f"nominal peak), got ")):
        read_hardware_file(path)


def test_describe_names_the_attention_efficiencies():
    assert H100.describe().endswith("; attention_efficiency 0.338589, attention_backward_efficiency 0.32545")
    assert "attention" not in Hardware().describe()
