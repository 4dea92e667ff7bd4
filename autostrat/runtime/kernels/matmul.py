"""Kernels of MatMul and BatchMatMul."""

from __future__ import annotations

import numpy as np

from autostrat.runtime.kernels.registry import kernel


def _product(a, b, transpose_a: bool, transpose_b: bool):
    a = np.swapaxes(a, -1, -2) if transpose_a else a
    b = np.swapaxes(b, -1, -2) if transpose_b else b
    return np.matmul(a, b)


@kernel("MatMul")
def matmul(a, b, transpose_a=False, transpose_b=False):
    return _product(a, b, transpose_a, transpose_b)


@kernel("BatchMatMul")
def batch_matmul(a, b, transpose_a=False, transpose_b=False):
    return _product(a, b, transpose_a, transpose_b)


@kernel("Einsum")
def einsum(*operands, equation=""):
    return np.einsum(equation, *operands)
