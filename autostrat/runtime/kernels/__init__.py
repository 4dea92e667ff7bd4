"""Numpy kernels, one per registered op type, with single-device semantics."""

from autostrat.runtime.kernels import attention, elementwise, grad, matmul, moe, nn, optimizer, reduce, shape  # noqa: F401  (they register kernels)
from autostrat.runtime.kernels.registry import kernel, kernel_op_types, run_kernel

__all__ = ["kernel", "kernel_op_types", "run_kernel"]
