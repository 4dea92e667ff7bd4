"""MindSpore's ``mindspore.common.initializer``: `initializer` and the initializers it takes.

Example:
    >>> from autostrat.common.initializer import Normal, initializer
    >>> initializer(Normal(0.02), [4, 4]).shape
    (4, 4)
"""

from autostrat.frontend.tensor import (Constant, HeUniform, Initializer, Normal, One, TruncatedNormal, Uniform, XavierUniform,
                                       Zero, initializer)

__all__ = ["Constant", "HeUniform", "Initializer", "Normal", "One", "TruncatedNormal", "Uniform", "XavierUniform", "Zero",
           "initializer"]
