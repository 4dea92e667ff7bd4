"""MindSpore-style model building: Cell, Parameter, Tensor and layers."""

from autostrat.frontend.cell import Cell, CellList
from autostrat.frontend.layers import GELU, Conv2d, Dense, Dropout, Embedding, LayerNorm, ReLU, SoftmaxCrossEntropyWithLogits
from autostrat.frontend.tensor import Parameter, Tensor, set_seed

__all__ = [
    "GELU", "Cell", "CellList", "Conv2d", "Dense", "Dropout", "Embedding", "LayerNorm", "Parameter", "ReLU",
    "SoftmaxCrossEntropyWithLogits", "Tensor", "set_seed",
]
