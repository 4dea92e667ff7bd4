"""Output dtypes of ops, known without running them."""

from __future__ import annotations

import numpy as np

from autostrat.errors import ConfigError


_NUMERIC = "biufc"  # numpy kinds: bool, signed, unsigned, float, complex (not str, object, record, time)


def dtype_name(dtype) -> str:
    """The numpy name of a dtype given as a numpy dtype, a type or a name ('float32').

    Example:
        >>> dtype_name(np.float32), dtype_name("int64")
        ('float32', 'int64')
    """
    try:
        resolved = np.dtype(dtype)
    except (TypeError, ValueError, SyntaxError):  # np.dtype parses dicts, lists and comma strings too
        raise ConfigError(f"expected a numpy dtype or its name such as 'float32', got {dtype!r}") from None
    if resolved.kind not in _NUMERIC:
        raise ConfigError(f"expected a numeric dtype (bool, integer, float or complex), got {dtype!r} ({resolved})")
    return resolved.name


def output_dtype(op_type: str, input_dtypes: list[str], attrs: dict) -> str:
    """Cast gives its `dtype`; OneHot gives float32; every other op keeps the dtype of its first
    floating-point input (Gather's table, not its indices)."""
    if op_type == "Cast":
        return dtype_name(attrs.get("dtype", "float32"))
    if op_type == "OneHot":
        return "float32"
    floats = [d for d in input_dtypes if np.issubdtype(np.dtype(d), np.floating)]
    return floats[0] if floats else input_dtypes[0]


def output_dtypes(op_type: str, input_dtypes: list[str], attrs: dict, count: int) -> tuple[str, ...]:
    """The dtypes of an op's `count` outputs: `output_dtype` for each, but Dropout's second
    output, its kept mask, is bool (one byte an element, as PyTorch keeps it).

    Example:
        >>> output_dtypes("Dropout", ["float32"], {}, 2)
        ('float32', 'bool')
    """
    dtype = output_dtype(op_type, input_dtypes, attrs)
    return (dtype, "bool") if op_type == "Dropout" else (dtype,) * count
