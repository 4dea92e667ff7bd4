"""A model of your own for a YAML config: `autostrat search mine.yaml --import my_models.py`
registers every Cell class defined here, and ``model: {name: GatedFFN}`` builds it."""

from autostrat import nn, ops
from autostrat.common.initializer import initializer


class GatedFFN(nn.Cell):
    """x -> (x W_gate) * sigmoid(x W_up) -> W_down: a gated feed-forward block."""

    def __init__(self, width: int = 64, hidden: int = 256):
        super().__init__()
        self.gate = ops.MatMul()
        self.up = ops.MatMul()
        self.sigmoid = ops.Sigmoid()
        self.mul = ops.Mul()
        self.down = ops.MatMul()
        self.w_gate = nn.Parameter(initializer("normal", (width, hidden)))
        self.w_up = nn.Parameter(initializer("normal", (width, hidden)))
        self.w_down = nn.Parameter(initializer("normal", (hidden, width)))

    def construct(self, x):
        gated = self.mul(self.gate(x, self.w_gate), self.sigmoid(self.up(x, self.w_up)))
        return self.down(gated, self.w_down)
