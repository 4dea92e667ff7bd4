"""Gradients against central finite differences: every op with a bprop on every example of its
rule, and whole models (FFN, a one-layer GPT) traced, differentiated and run on one device."""

from __future__ import annotations

import numpy as np
import pytest

from autostrat.autodiff import WITHOUT_BPROP, bprop_op_types, build_backward, gradient_name
from autostrat.ir import Graph, OpNode, TensorInfo, output_dtype
from autostrat.rules import get_op, make_rule, op_types
from autostrat.runtime.kernels import run_kernel
from tests.graph_eval import evaluate
from tests.oracle import random_inputs

STEP = 1e-6


def test_every_op_has_a_bprop_or_a_reason_not_to():
    assert set(bprop_op_types()) <= set(op_types())
    assert sorted(set(op_types()) - set(bprop_op_types())) == sorted(WITHOUT_BPROP)


def _single_op_graph(op_type: str, example, inputs) -> Graph:
    """One op whose float inputs are parameters (so they get gradients), indices graph inputs."""
    tensors = {}
    for index, array in enumerate(inputs):
        kind = "input" if index in example.integers else "parameter"
        tensors[f"in{index}"] = TensorInfo(f"in{index}", array.shape, array.dtype.name, kind)
    rule = make_rule(op_type, example.shapes, **example.attrs)
    dtype = output_dtype(op_type, [t.dtype for t in tensors.values()], example.attrs)
    outputs = tuple(f"op:{i}" for i in range(len(rule.output_shapes)))
    tensors |= {name: TensorInfo(name, shape, dtype, "output", "op") for name, shape in zip(outputs, rule.output_shapes)}
    op = OpNode("op", op_type, tuple(sorted(example.attrs.items())), tuple(tensors)[: len(inputs)], outputs, rule)
    return Graph(tensors, {"op": op}, outputs, op_type)


def _away_from_zero(inputs, example) -> list[np.ndarray]:
    """Float inputs moved to |x| >= 0.5: kinks (ReLU) and poles (RealDiv) sit at zero, and a
    finite difference across them measures nothing."""
    return [a if i in example.integers else np.sign(a) * (0.5 + np.abs(a)) for i, a in enumerate(inputs)]


def _check(function, point: np.ndarray, gradient: np.ndarray, rng, where: str) -> None:
    """Directional derivatives along random directions and a few coordinates match `gradient`."""
    directions = [rng.standard_normal(point.shape) for _ in range(2)]
    for flat in rng.choice(point.size, size=min(4, point.size), replace=False):
        unit = np.zeros(point.size)
        unit[flat] = 1
        directions.append(unit.reshape(point.shape))
    for direction in directions:
        numeric = (function(point + STEP * direction) - function(point - STEP * direction)) / (2 * STEP)
        np.testing.assert_allclose(numeric, np.sum(gradient * direction), rtol=1e-5, atol=1e-7, err_msg=where)


@pytest.mark.parametrize("op_type", bprop_op_types())
def test_bprop_matches_finite_differences(op_type):
    rng = np.random.default_rng(sum(map(ord, op_type)) + 7)
    for example in get_op(op_type).examples:
        inputs = _away_from_zero(random_inputs(example, rng), example)
        graph = _single_op_graph(op_type, example, inputs)
        training = build_backward(graph, loss="op:0")
        cotangent = rng.standard_normal(graph.tensors["op:0"].shape)
        feeds = {f"in{i}": array for i, array in enumerate(inputs)} | {gradient_name("op:0"): cotangent}
        values = evaluate(training, feeds)
        for index, array in enumerate(inputs):
            if index in example.integers:
                continue

            def loss(point, index=index):
                changed = [point if i == index else a for i, a in enumerate(inputs)]
                return np.sum(cotangent * run_kernel(op_type, changed, example.attrs)[0])

            _check(loss, array, values[gradient_name(f"in{index}")], rng, f"{op_type} {example.attrs} input {index}")


def _model_graph(name: str):
    from autostrat.frontend import trace
    from autostrat.models import FFN, GPT, ResNet
    from autostrat.nn import Tensor

    if name == "FFN":
        return trace(FFN(8, 12, 6), Tensor(shape=(4, 8))), {}
    if name == "ResNet":
        labels = Tensor(np.arange(2, dtype=np.int32) % 3)
        return trace(ResNet(blocks=1, in_channels=2, channels=3, classes=3), Tensor(shape=(2, 2, 5, 5)), Tensor(shape=(2,), dtype="int32")), {"labels": labels.asnumpy()}
    net = GPT(layers=1, hidden=8, heads=2, seq=4, batch=2, vocab=16)
    ids, labels = net.example_inputs(with_data=True)
    return trace(net, *net.example_inputs()), {"ids": ids.asnumpy(), "labels": labels.asnumpy()}


@pytest.mark.parametrize("model", ["FFN", "GPT", "ResNet"])
def test_model_gradients_match_finite_differences(model):
    graph, feeds = _model_graph(model)
    rng = np.random.default_rng(3)
    training = build_backward(graph)
    loss = graph.outputs[0]
    feeds = dict(feeds)
    for tensor in graph.inputs():
        feeds.setdefault(tensor.name, rng.standard_normal(tensor.shape))
    # Random parameters (not the initial ones, whose zero biases and unit gammas are special).
    feeds |= {p.name: rng.standard_normal(p.shape) for p in graph.parameters()}
    feeds[gradient_name(loss)] = rng.standard_normal(graph.tensors[loss].shape)
    values = evaluate(training, feeds)
    assert training.outputs == tuple(gradient_name(p.name) for p in graph.parameters())
    for parameter in graph.parameters():

        def function(point, name=parameter.name):
            return np.sum(feeds[gradient_name(loss)] * evaluate(graph, feeds | {name: point})[loss])

        _check(function, feeds[parameter.name], values[gradient_name(parameter.name)], rng, f"{model} {parameter.name}")
