"""Tensor and Parameter, MindSpore style: a tensor holds numpy data, or only a shape and dtype
(enough to trace and search a model that is never run)."""

from __future__ import annotations

import math

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

    def __str__(self) -> str:
        """The data, as MindSpore prints a tensor (``print(loss)``); the repr for a shape-only one."""
        return str(self.asnumpy()) if self.has_data else repr(self)

    def __repr__(self) -> str:
        kind = "" if self.has_data else ", no data"
        return f"{type(self).__name__}(shape={list(self.shape)}, dtype={self.dtype}{kind})"


class LazyTensor(Tensor):
    """A constant tensor whose data `make()` returns when first read (`asnumpy`): a search only
    reads its shape and dtype, so it never allocates it (a causal mask at seq 8192 is 256 MB).

    Example:
        >>> t = LazyTensor(lambda: np.zeros((2, 3), np.float32), (2, 3), "float32")
        >>> t.has_data, t._data is None, t.asnumpy().shape, t._data is None
        (True, True, (2, 3), False)
    """

    def __init__(self, make, shape, dtype="float32"):
        super().__init__(shape=shape, dtype=dtype)
        self._make = make

    @property
    def has_data(self) -> bool:
        return True

    def asnumpy(self) -> np.ndarray:
        if self._data is None:
            data = np.asarray(self._make())
            if data.shape != self.shape or data.dtype.name != self.dtype:
                raise ConfigError(f"a lazy tensor of shape {list(self.shape)} {self.dtype} made data of shape "
                                  f"{list(data.shape)} {data.dtype.name}")
            self._data = data
        return self._data


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
    """Deterministic parameter data made on demand (MindSpore's initializers): 'normal' (mean
    `mean`, standard deviation `sigma`, default 0.02), 'uniform' (in ``[-scale, scale]``),
    'zeros', 'ones', or 'constant' (`value`).

    The seed is drawn when the initializer is created, so the data does not depend on when,
    or whether, other parameters are materialised.

    Example:
        >>> Initializer("ones", (2,)).make().tolist(), Initializer("constant", (2,), value=3).make().tolist()
        ([1.0, 1.0], [3.0, 3.0])
    """

    KINDS = ("constant", "normal", "ones", "truncated_normal", "uniform", "zeros")

    def __init__(self, kind: str, shape, dtype="float32", sigma: float = 0.02, mean: float = 0.0, scale: float = 0.07,
                 value: float = 0.0, a: float = -2.0, b: float = 2.0):
        if kind not in self.KINDS:
            raise ConfigError(f"initializer must be one of {', '.join(self.KINDS)} (or an initializer such as Normal()), "
                              f"got {kind!r}")
        self.kind, self.shape, self.dtype = kind, tuple(shape), dtype_name(dtype)
        self.sigma, self.mean, self.scale, self.value, self.bounds = sigma, mean, scale, value, (a, b)
        self.seed = int(_rng.integers(2**63)) if kind in ("normal", "truncated_normal", "uniform") else 0

    def make(self) -> np.ndarray:
        rng = np.random.default_rng(self.seed)
        if self.kind == "normal":
            return (rng.standard_normal(self.shape) * self.sigma + self.mean).astype(self.dtype)
        if self.kind == "uniform":
            return rng.uniform(-self.scale, self.scale, self.shape).astype(self.dtype)
        if self.kind == "truncated_normal":  # values outside [a, b] drawn again, as MindSpore's
            values = rng.standard_normal(self.shape) * self.sigma + self.mean
            outside = (values < self.bounds[0]) | (values > self.bounds[1])
            while outside.any():
                values[outside] = rng.standard_normal(int(outside.sum())) * self.sigma + self.mean
                outside = (values < self.bounds[0]) | (values > self.bounds[1])
            return values.astype(self.dtype)
        fill = {"zeros": 0.0, "ones": 1.0, "constant": self.value}[self.kind]
        return np.full(self.shape, fill, dtype=self.dtype)


class InitializerKind:
    """An initializer before its shape is known: MindSpore's ``Normal(sigma)``, ``One()``...
    passed to `initializer` (or `Parameter`)."""

    def __init__(self, kind: str, **settings):
        self.kind, self.settings = kind, settings

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.kind!r}, {self.settings})"


def Normal(sigma: float = 0.01, mean: float = 0.0) -> InitializerKind:  # noqa: N802  (MindSpore's names)
    return InitializerKind("normal", sigma=sigma, mean=mean)


def Uniform(scale: float = 0.07) -> InitializerKind:  # noqa: N802
    return InitializerKind("uniform", scale=scale)


def TruncatedNormal(sigma: float = 0.01, mean: float = 0.0, a: float = -2.0, b: float = 2.0) -> InitializerKind:  # noqa: N802
    return InitializerKind("truncated_normal", sigma=sigma, mean=mean, a=a, b=b)


def XavierUniform(gain: float = 1.0) -> InitializerKind:  # noqa: N802
    """Uniform in ``[-s, s]``, ``s = gain * sqrt(6 / (fan_in + fan_out))`` (`_fans`)."""
    return InitializerKind("xavier_uniform", gain=gain)


def HeUniform(negative_slope: float = 0.0, mode: str = "fan_in", nonlinearity: str = "leaky_relu") -> InitializerKind:  # noqa: N802
    """Uniform in ``[-s, s]``, ``s = sqrt(2 / (1 + negative_slope²)) * sqrt(3 / fan)`` (Kaiming)."""
    if mode not in ("fan_in", "fan_out") or nonlinearity not in ("leaky_relu", "relu"):
        raise ConfigError(f"HeUniform: mode is fan_in or fan_out and nonlinearity leaky_relu or relu, got {mode!r}, {nonlinearity!r}")
    return InitializerKind("he_uniform", negative_slope=0.0 if nonlinearity == "relu" else negative_slope, mode=mode)


def _fans(shape: tuple[int, ...]) -> tuple[int, int]:
    """MindSpore's (fan_in, fan_out): a weight ``[out, in, *kernel]`` has ``in * kernel`` inputs
    and ``out * kernel`` outputs per unit; a vector counts its length for both."""
    if len(shape) < 2:
        return (shape[0], shape[0]) if shape else (1, 1)
    receptive = math.prod(shape[2:])
    return shape[1] * receptive, shape[0] * receptive


def _scaled_uniform(kind: InitializerKind, shape, dtype) -> Initializer:
    fan_in, fan_out = _fans(tuple(shape))
    if kind.kind == "xavier_uniform":
        scale = kind.settings["gain"] * math.sqrt(6.0 / (fan_in + fan_out))
    else:
        fan = fan_in if kind.settings["mode"] == "fan_in" else fan_out
        scale = math.sqrt(2.0 / (1 + kind.settings["negative_slope"] ** 2)) * math.sqrt(3.0 / fan)
    return Initializer("uniform", shape, dtype, scale=scale)


def One() -> InitializerKind:  # noqa: N802
    return InitializerKind("ones")


def Zero() -> InitializerKind:  # noqa: N802
    return InitializerKind("zeros")


def Constant(value: float) -> InitializerKind:  # noqa: N802
    return InitializerKind("constant", value=value)


_NAMES = {"normal": "normal", "uniform": "uniform", "ones": "ones", "one": "ones", "zeros": "zeros", "zero": "zeros"}


def initializer(init, shape, dtype="float32") -> Initializer:
    """MindSpore's `initializer(init, shape, dtype)`: parameter data made on first use; `init` is
    a name ("normal", "ones", "zeros", "uniform"), an initializer such as ``Normal(0.02)``, or a
    number (a constant).

    Example:
        >>> initializer(Normal(sigma=0.5), (3,)).sigma, initializer("One", [2], "float16").make().tolist()
        (0.5, [1.0, 1.0])
    """
    if isinstance(init, InitializerKind) and init.kind in ("xavier_uniform", "he_uniform"):
        return _scaled_uniform(init, shape, dtype)
    if isinstance(init, InitializerKind):
        return Initializer(init.kind, shape, dtype, **init.settings)
    if isinstance(init, (int, float)) and not isinstance(init, bool):
        return Initializer("constant", shape, dtype, value=float(init))
    if isinstance(init, str) and init.lower() in _NAMES:
        return Initializer(_NAMES[init.lower()], shape, dtype)
    raise ConfigError(f"initializer: expected a name such as 'normal', an initializer such as Normal() or a number, got {init!r}")
