"""Bprops of MatMul and BatchMatMul, as products with transposes, and of Einsum.

With y = op(A) op(B) (op a transpose when asked): dA = dy op(B)^T and dB = op(A)^T dy, each
written as one product of the stored A, B and dy so no Transpose op is needed. BatchMatMul
then sums over batch dims an operand was broadcast along.
"""

from __future__ import annotations

from autostrat.autodiff.registry import register_bprop
from autostrat.errors import RuleError
from autostrat.rules.matmul import einsum_operands


def _products(b, op_type: str, op, dy) -> tuple[str, str]:
    a, w = op.inputs
    attrs = op.attr_dict
    ta, tb = bool(attrs.get("transpose_a", False)), bool(attrs.get("transpose_b", False))
    if ta:  # A is stored k m: dA = op(B) dy^T
        da = b.emit(op_type, w, dy, transpose_a=tb, transpose_b=True)
    else:  # dA = dy op(B)^T
        da = b.emit(op_type, dy, w, transpose_a=False, transpose_b=not tb)
    if tb:  # B is stored n k: dB = dy^T op(A)
        dw = b.emit(op_type, dy, a, transpose_a=True, transpose_b=ta)
    else:  # dB = op(A)^T dy
        dw = b.emit(op_type, a, dy, transpose_a=not ta, transpose_b=False)
    return da, dw


@register_bprop("MatMul")
def matmul(b, op, dy):
    return _products(b, "MatMul", op, dy)


@register_bprop("BatchMatMul")
def batch_matmul(b, op, dy):
    da, dw = _products(b, "BatchMatMul", op, dy)
    a, w = op.inputs
    return b.sum_to(da, b.shape(a)), b.sum_to(dw, b.shape(w))


@register_bprop("Einsum")
def einsum(b, op, dy):
    # The gradient of operand i is the einsum of dy with the other operands onto operand i's
    # indices; each of them is in dy or in another operand, or `einsum_operands`' rule would
    # need a broadcast (an index summed inside operand i alone), which is refused here.
    operands, output = einsum_operands(op.attr_dict["equation"], len(op.inputs))
    grads = []
    for index, target in enumerate(operands):
        others = [text for position, text in enumerate(operands) if position != index]
        if set(target) - set(output).union(*others):
            raise RuleError(f"{op.name}: Einsum {op.attr_dict['equation']!r} sums index "
                            f"{sorted(set(target) - set(output).union(*others))[0]!r} inside operand {index} alone; "
                            "its gradient (a broadcast) is not supported")
        inputs = [dy] + [name for position, name in enumerate(op.inputs) if position != index]
        grads.append(b.emit("Einsum", *inputs, equation=f"{','.join([output] + others)}->{target}"))
    return tuple(grads)
