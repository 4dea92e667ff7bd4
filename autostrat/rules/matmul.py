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


_EINSUM_LETTERS = frozenset("abcdefghijklmnopqrstuvwxyz")


def einsum_operands(equation, count: int) -> tuple[list[str], str]:
    """The index strings of `count` operands and of the output of an explicit einsum equation.

    Supported: lowercase letters, ``->`` with an explicit output, no index twice in one operand
    (a trace or diagonal), every output index in some input. Refused otherwise with `RuleError`.

    Example:
        >>> einsum_operands("gsec,gsh->egch", 2)
        (['gsec', 'gsh'], 'egch')
    """
    if not isinstance(equation, str) or equation.count("->") != 1:
        raise RuleError(f"Einsum: equation must be explicit, such as 'ij,jk->ik', got {equation!r}")
    inputs, output = equation.replace(" ", "").split("->")
    operands = inputs.split(",")
    for text in operands + [output]:
        if not set(text) <= _EINSUM_LETTERS or len(set(text)) != len(text):
            raise RuleError(f"Einsum: each operand must be distinct lowercase indices (no '...', no repeated index), "
                            f"got {text!r} in {equation!r}")
    if len(operands) != count:
        raise RuleError(f"Einsum: {equation!r} names {len(operands)} operands, got {count} inputs")
    missing = sorted(set(output) - set(inputs))
    if missing:
        raise RuleError(f"Einsum: output index {missing[0]!r} of {equation!r} is in no input")
    return operands, output


@register(
    "Einsum",
    examples=[
        Example(((4, 6, 2, 3), (4, 6, 8)), {"equation": "gsec,gsh->egch"}),
        Example(((2, 4, 3, 8), (2, 8, 6)), {"equation": "egch,ehf->egcf"}),
        Example(((12, 8), (8, 6), (6,)), {"equation": "ij,jk,k->i"}),
    ],
)
def einsum(shapes, equation: str = "") -> RuleSpec:
    """MindSpore's ``ops.Einsum(equation)``: each index a factor, an index in no output a
    reduction (the contraction), so every split of every index is a candidate."""
    operands, output = einsum_operands(equation, len(shapes))
    return RuleSpec(f"{', '.join(' '.join(text) for text in operands)} -> {' '.join(output)}")
