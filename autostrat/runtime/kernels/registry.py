"""The registry of numpy kernels, keyed by the same op types as the rules.

A kernel is ``fn(*inputs, **attrs)`` with single-device semantics. A kernel whose result on a
slice depends on where the slice sits also takes ``context`` (a `layout.SliceContext`, None
for the whole tensor).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Callable

import numpy as np

from autostrat.errors import RuleError, UnknownOpError
from autostrat.layout import SliceContext


@dataclass(frozen=True)
class Kernel:
    op_type: str
    fn: Callable
    wants_context: bool


_KERNELS: dict[str, Kernel] = {}


def kernel(op_type: str):
    """Decorator registering `fn` as the numpy kernel of `op_type`."""

    def decorate(fn: Callable) -> Callable:
        if op_type in _KERNELS:
            raise RuleError(f"a kernel for {op_type!r} is already registered")
        _KERNELS[op_type] = Kernel(op_type, fn, "context" in inspect.signature(fn).parameters)
        return fn

    return decorate


def kernel_op_types() -> tuple[str, ...]:
    return tuple(sorted(_KERNELS))


def run_kernel(op_type: str, inputs, attrs: dict | None = None, context: SliceContext | None = None) -> tuple[np.ndarray, ...]:
    """Run the kernel of `op_type`; always returns a tuple of arrays (one per output).

    Example:
        >>> [out] = run_kernel("MatMul", [np.ones((2, 3)), np.ones((3, 4))])
        >>> out.shape, float(out[0, 0])
        ((2, 4), 3.0)
    """
    if op_type not in _KERNELS:
        raise UnknownOpError(f"no numpy kernel for op type {op_type!r}")
    entry = _KERNELS[op_type]
    extra = {"context": context} if entry.wants_context else {}
    result = entry.fn(*inputs, **(attrs or {}), **extra)
    return tuple(np.asarray(r) for r in result) if isinstance(result, tuple) else (np.asarray(result),)
