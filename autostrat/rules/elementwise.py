"""Elementwise ops: unary maps (Identity among them), broadcasting binary ops, BiasAdd, Cast, Dropout."""

from __future__ import annotations

from autostrat.errors import RuleError
from autostrat.rules.common import broadcast_equation, dim_names
from autostrat.rules.registry import Example, register
from autostrat.rules.rule import RuleSpec

_BROADCAST = [Example(((24, 48), (24, 48))), Example(((24, 48), (48,))), Example(((24, 1), (1, 48)))]


def _unary(op_type: str, positive: bool = False) -> None:
    @register(op_type, examples=[Example(((24, 48),), positive=positive), Example(((12, 6, 8),), positive=positive)])
    def rule(shapes) -> RuleSpec:
        return RuleSpec(broadcast_equation(shapes[:1]))


def _binary(op_type: str) -> None:
    @register(op_type, examples=_BROADCAST)
    def rule(shapes) -> RuleSpec:
        return RuleSpec(broadcast_equation(shapes[:2]))


for _name in ("Exp", "GeLU", "Identity", "Neg", "ReLU", "Sigmoid", "SiLU", "Tanh"):
    _unary(_name)
for _name in ("Log", "Sqrt"):
    _unary(_name, positive=True)
for _name in ("Add", "Maximum", "Minimum", "Mul", "RealDiv", "Sub"):
    _binary(_name)


@register("BiasAdd", examples=[Example(((24, 48), (48,))), Example(((12, 6, 4, 4), (6,)))])
def bias_add(shapes, data_format: str = "NCHW") -> RuleSpec:
    """The bias is added along dim 1 (the channel), as MindSpore's BiasAdd does."""
    if data_format != "NCHW":
        raise RuleError(f"BiasAdd: data_format must be 'NCHW', got {data_format!r}")
    names = dim_names(len(shapes[0]))
    if len(names) < 2:
        raise RuleError(f"BiasAdd: the input needs 2 or more dims, got shape {list(shapes[0])}")
    return RuleSpec(f"{' '.join(names)}, {names[1]} -> {' '.join(names)}")


@register("Cast", examples=[Example(((24, 48),), {"dtype": "float64"})])
def cast(shapes, dtype: str = "float32") -> RuleSpec:
    return RuleSpec(broadcast_equation(shapes[:1]))


@register("Dropout", examples=[Example(((24, 48),), {"keep_prob": 0.7, "seed": 3})])
def dropout(shapes, keep_prob: float = 0.5, seed: int = 0) -> RuleSpec:
    """Training-mode dropout: the output and the kept mask (MindSpore's ``(output, mask)``). The
    mask depends only on the global element index and `seed`, so any strategy drops exactly the
    elements the single-device run drops."""
    if not 0 < keep_prob <= 1:
        raise RuleError(f"Dropout: keep_prob must be in (0, 1], got {keep_prob}")
    operand = broadcast_equation(shapes[:1]).split(" -> ")[1]
    return RuleSpec(f"{operand} -> {operand}, {operand}")
