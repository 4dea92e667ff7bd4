"""Reductions over axes (ReduceSum, ReduceMean, ReduceMax) and the softmax family."""

from __future__ import annotations

from autostrat.rules.common import dim_names, normalize_axes
from autostrat.rules.registry import Example, register
from autostrat.rules.rule import RuleSpec

_REDUCE_EXAMPLES = [
    Example(((24, 48),), {"axis": 1}),
    Example(((24, 48),), {"axis": 0, "keep_dims": True}),
    Example(((12, 6, 8),), {"axis": (0, 2)}),
    Example(((24, 48),), {"axis": ()}),
]


def _reduce_spec(shape, axis, keep_dims: bool, op_type: str, reduce_op: str) -> RuleSpec:
    names = dim_names(len(shape))
    reduced = normalize_axes(axis, len(shape), op_type)
    out = [("1" if keep_dims else "") if i in reduced else name for i, name in enumerate(names)]
    return RuleSpec(f"{' '.join(names)} -> {' '.join(d for d in out if d)}", reduce_op=reduce_op)


@register("ReduceSum", examples=_REDUCE_EXAMPLES)
def reduce_sum(shapes, axis=(), keep_dims: bool = False) -> RuleSpec:
    return _reduce_spec(shapes[0], axis, keep_dims, "ReduceSum", "sum")


@register("ReduceMean", examples=_REDUCE_EXAMPLES)
def reduce_mean(shapes, axis=(), keep_dims: bool = False) -> RuleSpec:
    """A split reduced dim leaves partial sums: each rank divides its local sum by the global count."""
    return _reduce_spec(shapes[0], axis, keep_dims, "ReduceMean", "sum")


@register("ReduceMax", examples=_REDUCE_EXAMPLES)
def reduce_max(shapes, axis=(), keep_dims: bool = False) -> RuleSpec:
    """A split reduced dim leaves partial maxima, combined by an AllReduce(max)."""
    return _reduce_spec(shapes[0], axis, keep_dims, "ReduceMax", "max")


def _softmax_spec(shape, axis, op_type: str) -> RuleSpec:
    names = dim_names(len(shape))
    kept = " ".join(names)
    need = " ".join(names[i] for i in normalize_axes(axis, len(shape), op_type))
    return RuleSpec(f"{kept} -> {kept}", need_replication=need)


@register("Softmax", examples=[Example(((24, 48),)), Example(((12, 6, 8),), {"axis": 1})])
def softmax(shapes, axis=-1) -> RuleSpec:
    return _softmax_spec(shapes[0], axis, "Softmax")


@register("LogSoftmax", examples=[Example(((24, 48),)), Example(((12, 6, 8),), {"axis": 0})])
def log_softmax(shapes, axis=-1) -> RuleSpec:
    return _softmax_spec(shapes[0], axis, "LogSoftmax")
