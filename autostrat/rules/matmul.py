"""Matrix products: MatMul and BatchMatMul (with transposes, batch dims broadcast)."""

from __future__ import annotations

from autostrat.errors import RuleError
from autostrat.rules.common import broadcast_equation
from autostrat.rules.registry import Example, register
from autostrat.rules.rule import RuleSpec


def _operands(transpose_a: bool, transpose_b: bool) -> tuple[str, str]:
    return ("k m" if transpose_a else "m k"), ("n k" if transpose_b else "k n")


@register(
    "MatMul",
    examples=[
        Example(((24, 48), (48, 24))),
        Example(((48, 24), (48, 24)), {"transpose_a": True}),
        Example(((24, 48), (24, 48)), {"transpose_b": True}),
    ],
)
def matmul(shapes, transpose_a: bool = False, transpose_b: bool = False) -> RuleSpec:
    a, b = _operands(transpose_a, transpose_b)
    return RuleSpec(f"{a}, {b} -> m n")


@register(
    "BatchMatMul",
    examples=[
        Example(((4, 12, 24), (4, 24, 12))),
        Example(((2, 3, 8, 12), (2, 3, 8, 12)), {"transpose_b": True}),
        Example(((6, 8, 12), (8, 12)), {"transpose_a": True}),
    ],
)
def batch_matmul(shapes, transpose_a: bool = False, transpose_b: bool = False) -> RuleSpec:
    """Leading dims are batch dims, broadcast numpy-style (a 2-D operand has none)."""
    if min(len(shape) for shape in shapes) < 2 or max(len(shape) for shape in shapes) < 3:
        raise RuleError(f"BatchMatMul: needs two operands of rank >= 2, one of rank >= 3, got {[list(s) for s in shapes]}")
    batch = broadcast_equation([shape[:-2] or (1,) for shape in shapes[:2]])
    batch_in, batch_out = batch.split(" -> ")
    # A 2-D operand has no batch dims: drop the "1" that stood in for them.
    batch_a, batch_b = (part if len(shape) > 2 else "" for part, shape in zip(batch_in.split(", "), shapes))
    a, b = _operands(transpose_a, transpose_b)
    return RuleSpec(f"{batch_a} {a}, {batch_b} {b} -> {batch_out} m n")
