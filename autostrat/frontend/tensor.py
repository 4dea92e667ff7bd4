"""Tensor and Parameter, MindSpore style: a tensor holds numpy data, or only a shape and dtype
(enough to trace and search a model that is never run)."""

from __future__ import annotations

import numpy as np

from autostrat.errors import ConfigError
from autostrat.ir import dtype_name


class Tensor:
    """A tensor from a numpy array, or from `shape=` and `dtype=` without data.

    Example:
        >>> Tensor(np.ones((2, 3), np.float32)).shape
        (2, 3)
        >>> t = Tensor(shape=(64, 64), dtype="float32")
        >>> t.shape, t.dtype, t.has_data
        ((64, 64), 'float32', False)
    """

    def __init__(self, input_data=None, dtype=None, shape=None):
        self._symbol: str | None = None  # the graph tensor this stands for while tracing
        if input_data is not None:
            if isinstance(input_data, Tensor):
                input_data = input_data.asnumpy()
            self._data = np.asarray(input_data, dtype=dtype_name(dtype) if dtype is not None else None)
            if shape is not None and tuple(shape) != self._data.shape:
                raise ConfigError(f"Tensor data has shape {list(self._data.shape)} but shape={list(shape)} was given")
            self.shape, self.dtype = self._data.shape, self._data.dtype.name
            return
        if shape is None:
            raise ConfigError("a Tensor needs input data, or shape= (and optionally dtype=) for a shape-only tensor")
        if not all(isinstance(s, (int, np.integer)) and s >= 1 for s in shape):
            raise ConfigError(f"Tensor shape must be positive integers, got {shape!r}")
        self._data = None
        self.shape, self.dtype = tuple(int(s) for s in shape), dtype_name(dtype or "float32")

    @property
    def has_data(self) -> bool:
        return self._data is not None

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def asnumpy(self) -> np.ndarray:
        if self._data is None:
            raise ConfigError(f"tensor {self._symbol or ''} of shape {list(self.shape)} has no data (shape-only)")
        return self._data

    def __repr__(self) -> str:
        kind = "" if self.has_data else ", no data"
        return f"{type(self).__name__}(shape={list(self.shape)}, dtype={self.dtype}{kind})"


class Parameter(Tensor):
    """A trainable tensor owned by a Cell; its name is its attribute path (``dense1.weight``)."""

    def __init__(self, default_input, name: str | None = None, requires_grad: bool = True):
        super().__init__(default_input)
        self.name = name
        self.requires_grad = requires_grad


_rng = np.random.default_rng(0)


def set_seed(seed: int) -> None:
    """Seed the initialiser of parameters created afterwards (as MindSpore's `set_seed`)."""
    global _rng
    _rng = np.random.default_rng(seed)


def initializer(kind: str, shape, dtype="float32") -> np.ndarray:
    """Deterministic parameter data: 'normal' (sigma 0.02), 'zeros' or 'ones'."""
    if kind == "normal":
        return (_rng.standard_normal(shape) * 0.02).astype(dtype)
    if kind in ("zeros", "ones"):
        return getattr(np, kind)(shape, dtype=dtype)
    raise ConfigError(f"initializer must be 'normal', 'zeros' or 'ones', got {kind!r}")
