"""MindSpore's dtypes (``mindspore.float32``...) as numpy dtypes, which every autostrat API takes.

Example:
    >>> from autostrat.common.dtype import float16
    >>> float16.name
    'float16'
"""

import numpy as np

bool_ = np.dtype("bool")
int8, int16, int32, int64 = (np.dtype(f"int{bits}") for bits in (8, 16, 32, 64))
uint8 = np.dtype("uint8")
float16, float32, float64 = (np.dtype(f"float{bits}") for bits in (16, 32, 64))
DTYPES = ("bool_", "float16", "float32", "float64", "int16", "int32", "int64", "int8", "uint8")

__all__ = list(DTYPES)
