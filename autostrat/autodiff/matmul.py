"""Bprops of MatMul and BatchMatMul, as products with transposes.

With y = op(A) op(B) (op a transpose when asked): dA = dy op(B)^T and dB = op(A)^T dy, each
written as one product of the stored A, B and dy so no Transpose op is needed. BatchMatMul
then sums over batch dims an operand was broadcast along.
"""

from __future__ import annotations

from autostrat.autodiff.registry import register_bprop


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
