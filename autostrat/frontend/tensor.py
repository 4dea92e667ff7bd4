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
    """A trainable tensor owned by a Cell; its name is its attribute path (``dense1.weight``).

    `default_input` is data, or an `Initializer` whose data is made on first use: a search of a
    large model never allocates its weights.
    """

    def __init__(self, default_input, name: str | None = None, requires_grad: bool = True):
        if isinstance(default_input, Initializer):
            Tensor.__init__(self, shape=default_input.shape, dtype=default_input.dtype)
            self._initializer = default_input
        else:
            super().__init__(default_input)
            self._initializer = None
        self.name = name
        self.requires_grad = requires_grad

    @property
    def has_data(self) -> bool:
        return self._data is not None or self._initializer is not None

    def set_data(self, data) -> Parameter:
        """Replace the data, keeping shape and dtype (as MindSpore's `Parameter.set_data`).

        Example:
            >>> Parameter(np.zeros(2, np.float32), name="b").set_data(np.ones(2, np.float32)).asnumpy().tolist()
            [1.0, 1.0]
        """
        array = np.array(data.asnumpy() if isinstance(data, Tensor) else data)
        if array.shape != self.shape or array.dtype.name != self.dtype:
            raise ConfigError(f"parameter {self.name}: set_data needs shape {list(self.shape)} {self.dtype}, "
                              f"got {list(array.shape)} {array.dtype.name}")
        self._data, self._initializer = array, None
        return self

    def asnumpy(self) -> np.ndarray:
        if self._data is None and self._initializer is not None:
            self._data = self._initializer.make()
        return super().asnumpy()


_rng = np.random.default_rng(0)


def set_seed(seed: int) -> None:
    """Seed the initialisers of parameters created afterwards (as MindSpore's `set_seed`)."""
    global _rng
    _rng = np.random.default_rng(seed)


class Initializer:
    """Deterministic parameter data made on demand: 'normal' (sigma 0.02), 'zeros' or 'ones'.

    The seed is drawn when the initializer is created, so the data does not depend on when,
    or whether, other parameters are materialised.

    Example:
        >>> Initializer("ones", (2,)).make().tolist()
        [1.0, 1.0]
    """

    def __init__(self, kind: str, shape, dtype="float32"):
        if kind not in ("normal", "zeros", "ones"):
            raise ConfigError(f"initializer must be 'normal', 'zeros' or 'ones', got {kind!r}")
        self.kind, self.shape, self.dtype = kind, tuple(shape), dtype_name(dtype)
        self.seed = int(_rng.integers(2**63)) if kind == "normal" else 0

    def make(self) -> np.ndarray:
        if self.kind == "normal":
            return (np.random.default_rng(self.seed).standard_normal(self.shape) * 0.02).astype(self.dtype)
        return getattr(np, self.kind)(self.shape, dtype=self.dtype)


def initializer(kind: str, shape, dtype="float32") -> Initializer:
    """MindSpore's `initializer(init, shape, dtype)`: parameter data made on first use."""
    return Initializer(kind, shape, dtype)
