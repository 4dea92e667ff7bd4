"""The MindSpore tutorial FFN and a stack of Dense layers."""

from __future__ import annotations

from autostrat import ops
from autostrat.frontend.cell import Cell, CellList
from autostrat.frontend.layers import Dense
from autostrat.models.sizes import check_sizes


class FFN(Cell):
    """MindSpore's sharding-propagation tutorial: Dense(64, 64) -> ReLU -> Dense(64, 64).

    Example:
        >>> net = FFN()
        >>> net.dense1.matmul.shard(((2, 1), (1, 4))).in_strategy
        ((2, 1), (1, 4))
    """

    def __init__(self, in_channels: int = 64, hidden: int = 64, out_channels: int = 64):
        super().__init__()
        self.dense1 = Dense(in_channels, hidden)
        self.relu = ops.ReLU()
        self.dense2 = Dense(hidden, out_channels)

    def construct(self, x):
        x = self.dense1(x)
        x = self.relu(x)
        x = self.dense2(x)
        return x


class MLP(Cell):
    """`layers` Dense layers of width `hidden`, ReLU between them (``layers.0.matmul`` ...)."""

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
