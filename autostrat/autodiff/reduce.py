"""Bprops of the reductions and the softmax family."""

from __future__ import annotations

import math

from autostrat.autodiff.registry import register_bprop
from autostrat.rules.common import normalize_axes


def _kept_shape(b, op) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The input's shape, and the output's shape with the reduced dims kept as 1."""
    shape = b.shape(op.inputs[0])
    axes = normalize_axes(op.attr_dict.get("axis", ()), len(shape), op.op_type)
    return shape, tuple(1 if i in axes else size for i, size in enumerate(shape))


def _broadcast_back(b, op, dy) -> str:
    """dy spread over the reduced dims: Reshape to the kept shape, then BroadcastTo."""
    shape, kept = _kept_shape(b, op)
    if b.shape(dy) != kept:
        dy = b.emit("Reshape", dy, shape=kept)
    return dy if kept == shape else b.emit("BroadcastTo", dy, shape=shape)


@register_bprop("ReduceSum")
def reduce_sum(b, op, dy):
    return (_broadcast_back(b, op, dy),)


@register_bprop("ReduceMean")
def reduce_mean(b, op, dy):
    shape, kept = _kept_shape(b, op)
    count = math.prod(shape) // math.prod(kept)
    # Scale before broadcasting: the multiply runs on the small tensor.
    return (_broadcast_back(b, op, b.emit("Mul", dy, b.scalar(1 / count, like=dy))),)


@register_bprop("ReduceMax")
def reduce_max(b, op, dy):
    return (b.emit("ReduceMaxGrad", op.inputs[0], op.outputs[0], dy, **op.attr_dict),)


@register_bprop("Softmax")
def softmax(b, op, dy):
    return (b.emit("SoftmaxGrad", op.outputs[0], dy, **op.attr_dict),)


@register_bprop("LogSoftmax")
def log_softmax(b, op, dy):
    return (b.emit("LogSoftmaxGrad", op.outputs[0], dy, **op.attr_dict),)
