"""The MindSpore tutorial FFN and a stack of Dense layers."""

from __future__ import annotations

from autostrat import ops
from autostrat.frontend.cell import Cell, CellList
from autostrat.frontend.layers import Dense
from autostrat.frontend.tensor import Parameter, initializer
from autostrat.models.sizes import check_sizes


class TutorialDense(Cell):
    """The Dense that MindSpore's sharding-propagation tutorial writes itself: ``x @ weight +
    bias`` with weight ``[in_channels, out_channels]`` and no transpose, so the tutorial's seed
    ``((2, 1), (1, 4))`` splits the weight's output columns, as it does in MindSpore. (The
    tutorial adds the bias with ``ops.Add``; this keeps a ``BiasAdd`` named ``bias_add``, the op
    names autostrat's FFN has always had.) ``nn.Dense`` is MindSpore's layer: weight
    ``[out_channels, in_channels]``, MatMul with ``transpose_b``.

    Example:
        >>> dense = TutorialDense(64, 32)
        >>> dense.weight.shape, dense.matmul.attrs
        ((64, 32), {})
    """

    def __init__(self, in_channels: int, out_channels: int):
        super().__init__()
        self.weight = Parameter(initializer("normal", (in_channels, out_channels)))
        self.matmul = ops.MatMul()
        self.bias = Parameter(initializer("zeros", (out_channels,)))
        self.bias_add = ops.BiasAdd()

    def construct(self, x):
        x = self.matmul(x, self.weight)
        return self.bias_add(x, self.bias)


class FFN(Cell):
    """MindSpore's sharding-propagation tutorial: Dense(64, 64) -> ReLU -> Dense(64, 64), with
    the tutorial's own Dense (`TutorialDense`, weight ``[in, out]``).

    Example:
        >>> net = FFN()
        >>> net.dense1.matmul.shard(((2, 1), (1, 4))).in_strategy
        ((2, 1), (1, 4))
    """

    def __init__(self, in_channels: int = 64, hidden: int = 64, out_channels: int = 64):
        super().__init__()
        self.dense1 = TutorialDense(in_channels, hidden)
        self.relu = ops.ReLU()
        self.dense2 = TutorialDense(hidden, out_channels)

    def construct(self, x):
        x = self.dense1(x)
        x = self.relu(x)
        x = self.dense2(x)
        return x


TUTORIAL_SEED = ((2, 1), (1, 4))  # the tutorial's strategy for dense1's MatMul


def tutorial_plan(seed=TUTORIAL_SEED, device_num: int = 8, optimizer=None, gradients_mean: bool = True):
    """The tutorial's plan: the FFN on x[64, 64], dense1's MatMul seeded `seed` (None: no
    seed), searched for `device_num` devices; with an `optimizer`, its training step
    (`autodiff.build_training`); the docstrings' common example.

    Example:
        >>> plan = tutorial_plan()
        >>> str(plan.ops["dense2.matmul"].strategy), plan.total_bytes
        ('((2, 4), (4, 1))', 6144)
    """
    from autostrat.autodiff import build_training
    from autostrat.frontend import trace
    from autostrat.nn import Tensor
    from autostrat.search import search

    net = FFN()
    if seed is not None:
        net.dense1.matmul.shard(seed)
    graph = trace(net, Tensor(shape=(64, 64)), device_num=device_num)
    if optimizer is not None:
        graph = build_training(graph, optimizer, gradients_mean=gradients_mean)
    return search(graph, device_num)


class MLP(Cell):
    """`layers` Dense layers (`nn.Dense`, weight ``[out, in]``) of width `hidden`, ReLU between
    them (``layers.0.matmul`` ...)."""

    def __init__(self, layers: int = 4, in_channels: int = 64, hidden: int = 64, out_channels: int = 64):
        super().__init__()
        check_sizes("MLP", layers=layers, in_channels=in_channels, hidden=hidden, out_channels=out_channels)
        widths = [in_channels] + [hidden] * (layers - 1) + [out_channels]
        self.layers = CellList(
            Dense(a, b, activation="relu" if i < layers - 1 else None) for i, (a, b) in enumerate(zip(widths, widths[1:]))
        )

    def construct(self, x):
        for layer in self.layers:
            x = layer(x)
        return x
