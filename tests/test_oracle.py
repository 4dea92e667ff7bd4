"""The oracle: every registered op, every example, every candidate strategy on 1, 2, 4, 6 and
8 devices (and with repeated calculation on 8) computes on per-rank slices exactly what the
kernel computes on the whole inputs."""

from __future__ import annotations

import numpy as np
import pytest

from autostrat.rules import get_op, make_rule, op_types
from autostrat.runtime.kernels import kernel_op_types, run_kernel
from autostrat.strategies import generate_strategies
from tests.oracle import random_inputs, run_sliced

DEVICE_NUMS = (1, 2, 4, 6, 8)


def test_every_rule_has_a_kernel_and_every_kernel_a_rule():
    assert kernel_op_types() == op_types()


def test_the_issue_op_list_is_registered():
    required = (
        "MatMul BatchMatMul Add Sub Mul RealDiv Maximum Minimum BiasAdd ReLU GeLU Tanh Sigmoid Exp Log Neg "
        "Sqrt Cast Dropout Softmax LogSoftmax ReduceSum ReduceMean ReduceMax LayerNorm Reshape Transpose "
        "ExpandDims Squeeze Concat Gather OneHot SoftmaxCrossEntropyWithLogits Conv2D"
    ).split()
    assert set(required) <= set(op_types())


@pytest.mark.parametrize("op_type", op_types())
def test_every_candidate_matches_the_single_device_result(op_type):
    rng = np.random.default_rng(sum(map(ord, op_type)))
    checked = 0
    for example in get_op(op_type).examples:
        rule = make_rule(op_type, example.shapes, **example.attrs)
        inputs = random_inputs(example, rng)
        expected = run_kernel(op_type, inputs, example.attrs)
        assert [e.shape for e in expected] == [tuple(s) for s in rule.output_shapes]
        runs = [(n, False) for n in DEVICE_NUMS] + [(8, True)]
        for device_num, repeated in runs:
            for strategy in generate_strategies(rule, device_num, repeated):
                got = run_sliced(strategy, inputs, example.attrs)
                for g, e in zip(got, expected):
                    np.testing.assert_allclose(g, e, rtol=1e-9, atol=1e-9, err_msg=f"{op_type} {example.attrs} {strategy} on {device_num}")
                checked += 1
    # Every op must have more than the all-ones strategy somewhere, or the oracle proves little.
    assert checked > len(get_op(op_type).examples) * (len(DEVICE_NUMS) + 1)
