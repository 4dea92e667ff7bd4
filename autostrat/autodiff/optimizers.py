"""Optimisers as graph builders: each emits one update op per parameter, and the state it keeps.

State tensors are parameters of the training graph, named as MindSpore's optimisers name them
(``moments.<parameter>``, ``moment1.<parameter>``, ``moment2.<parameter>``, ``beta1_power``),
with initial values; every update is recorded as ``(state, new value)`` in `Graph.updates`.
The update ops are elementwise, so the search shards each like its parameter or splits it
further (the optimiser state is then split: ReduceScatter instead of AllReduce, then an
AllGather of the new parameter).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from autostrat.autodiff.builder import GradBuilder
from autostrat.errors import ConfigError

UPDATE_PREFIX = "optimizer/"
# The per-parameter update ops (input 0 the parameter): they run in their parameter's layout.
UPDATE_OP_TYPES = ("ApplyAdam", "ApplyGradientDescent", "ApplyMomentum")


def _check_positive(owner: str, **values) -> None:
    for key, value in values.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < math.inf:  # NaN fails too
            raise ConfigError(f"{owner}: {key} must be a finite non-negative number, got {value!r}")


class _Optimizer:
    """What the optimisers share: state creation and the per-step preparation hook."""

    def prepare(self, builder: GradBuilder, updates: list) -> dict:
        """Ops run once per step before the per-parameter updates; returns what `update` reads."""
        return {}

    @staticmethod
    def state(builder: GradBuilder, name: str, like: str, fill: float = 0.0) -> str:
        """A state tensor shaped like `like`, initialised to `fill`, of kind parameter."""
        if name in builder.tensors:
            raise ConfigError(f"optimiser state {name!r} clashes with a tensor of the model")
        builder.constant(name, builder.shape(like), builder.dtype(like), fill)
        info = builder.tensors[name]
        builder.tensors[name] = type(info)(info.name, info.shape, info.dtype, "parameter")
        return name


@dataclass(frozen=True)
class SGD(_Optimizer):
    """Plain gradient descent (MindSpore ``nn.SGD`` without momentum): ``p -= lr * g``.

    Example:
        >>> SGD(0.1).learning_rate
        0.1
    """

    learning_rate: float = 0.01

    def __post_init__(self) -> None:
        _check_positive("SGD", learning_rate=self.learning_rate)

    def update(self, builder: GradBuilder, parameter: str, gradient: str, shared: dict) -> list[tuple[str, str]]:
        [new] = builder.emit_many("ApplyGradientDescent", parameter, gradient, name=UPDATE_PREFIX + parameter,
                                  learning_rate=self.learning_rate)
        return [(parameter, new)]


@dataclass(frozen=True)
class Momentum(_Optimizer):
    """MindSpore ``nn.Momentum``: ``a = momentum * a + g; p -= lr * a`` (Nesterov:
    ``p -= lr * (g + momentum * a)``), the accumulation ``moments.<p>`` starting at zero.

    Example:
        >>> Momentum(0.01, 0.9)
        Momentum(learning_rate=0.01, momentum=0.9, use_nesterov=False)
    """

    learning_rate: float = 0.01
    momentum: float = 0.9
    use_nesterov: bool = False

    def __post_init__(self) -> None:
        _check_positive("Momentum", learning_rate=self.learning_rate, momentum=self.momentum)

    def update(self, builder: GradBuilder, parameter: str, gradient: str, shared: dict) -> list[tuple[str, str]]:
        moments = self.state(builder, f"moments.{parameter}", parameter)
        new, accumulation = builder.emit_many(
            "ApplyMomentum", parameter, moments, gradient, name=UPDATE_PREFIX + parameter,
            learning_rate=self.learning_rate, momentum=self.momentum, use_nesterov=self.use_nesterov)
        return [(parameter, new), (moments, accumulation)]


@dataclass(frozen=True)
class Adam(_Optimizer):
    """MindSpore ``nn.Adam``: moments ``m``, ``v`` per parameter and the shared scalars
    ``beta1_power``, ``beta2_power`` (starting at 1, times beta each step); the step's learning
    rate ``lr * sqrt(1 - beta2_power) / (1 - beta1_power)`` is computed once per step.

    Example:
        >>> Adam(1e-3).beta2
        0.999
    """

    learning_rate: float = 1e-3
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8

    def __post_init__(self) -> None:
        _check_positive("Adam", learning_rate=self.learning_rate, eps=self.eps)
        if not (0 <= self.beta1 < 1 and 0 <= self.beta2 < 1):
            raise ConfigError(f"Adam: beta1 and beta2 must be in [0, 1), got {self.beta1} and {self.beta2}")

    def prepare(self, builder: GradBuilder, updates: list) -> dict:
        dtype = "float32"
        powers = []
        for name, beta in (("beta1_power", self.beta1), ("beta2_power", self.beta2)):
            state = self.state(builder, name, builder.constant(f"{UPDATE_PREFIX}one", (), dtype, 1.0), 1.0)
            factor = builder.constant(f"{UPDATE_PREFIX}{name.split('_')[0]}", (), dtype, beta)
            powers.append(builder.emit("Mul", state, factor, name=f"{UPDATE_PREFIX}next_{name}"))
            updates.append((state, powers[-1]))
        one, rate = f"{UPDATE_PREFIX}one", builder.constant(f"{UPDATE_PREFIX}learning_rate", (), dtype, self.learning_rate)
        root = builder.emit("Sqrt", builder.emit("Sub", one, powers[1], name=f"{UPDATE_PREFIX}bias2"), name=f"{UPDATE_PREFIX}sqrt")
        scaled = builder.emit("Mul", rate, root, name=f"{UPDATE_PREFIX}scaled_rate")
        denominator = builder.emit("Sub", one, powers[0], name=f"{UPDATE_PREFIX}bias1")
        return {"learning_rate": builder.emit("RealDiv", scaled, denominator, name=f"{UPDATE_PREFIX}step_rate")}

    def update(self, builder: GradBuilder, parameter: str, gradient: str, shared: dict) -> list[tuple[str, str]]:
        m = self.state(builder, f"moment1.{parameter}", parameter)
        v = self.state(builder, f"moment2.{parameter}", parameter)
        new, m_new, v_new = builder.emit_many(
            "ApplyAdam", parameter, m, v, shared["learning_rate"], gradient, name=UPDATE_PREFIX + parameter,
            beta1=self.beta1, beta2=self.beta2, epsilon=self.eps)
        return [(parameter, new), (m, m_new), (v, v_new)]


OPTIMIZERS = {"adam": Adam, "momentum": Momentum, "sgd": SGD}
