"""Bprops of the shape ops: each moves the gradient back the way the op moved the data."""

from __future__ import annotations

from autostrat.autodiff.registry import register_bprop
from autostrat.rules.common import normalize_axes


def _reshape_back(b, op, dy):
    return (b.emit("Reshape", dy, shape=b.shape(op.inputs[0])),)


for _name in ("ExpandDims", "Reshape", "Squeeze"):
    register_bprop(_name)(_reshape_back)


@register_bprop("Transpose")
def transpose(b, op, dy):
    perm = op.attr_dict.get("perm", ())
    inverse = tuple(sorted(range(len(perm)), key=lambda i: perm[i]))
    return (b.emit("Transpose", dy, perm=inverse),)


@register_bprop("BroadcastTo")
def broadcast_to(b, op, dy):
    return (b.sum_to(dy, b.shape(op.inputs[0])),)


@register_bprop("Concat")
def concat(b, op, dy):
    shape = b.shape(dy)
    axis = normalize_axes(op.attr_dict.get("axis", 0), len(shape), "Concat")[0]
    grads, start = [], 0
    for tensor in op.inputs:
        extent = b.shape(tensor)[axis]
        begin = tuple(start if i == axis else 0 for i in range(len(shape)))
        size = tuple(extent if i == axis else n for i, n in enumerate(shape))
        grads.append(b.emit("Slice", dy, begin=begin, size=size))
        start += extent
    return tuple(grads)
