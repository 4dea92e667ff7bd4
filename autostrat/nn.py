"""MindSpore-style model building: Cell, Parameter, Tensor and layers."""

from autostrat.frontend.cell import Cell, CellList, SequentialCell
from autostrat.frontend.grad_reducer import DistributedGradReducer
from autostrat.frontend.pipeline import PipelineCell
from autostrat.frontend.layers import (GELU, Conv2d, Dense, Dropout, Embedding, LayerNorm, MSELoss, ReLU, Softmax,
                                       SoftmaxCrossEntropyWithLogits)
from autostrat.frontend.tensor import Parameter, Tensor, set_seed
from autostrat.frontend.train import SGD, Adam, Momentum, TrainOneStepCell, WithLossCell

__all__ = [
    "SGD", "Adam", "GELU", "Cell", "MSELoss", "Momentum", "TrainOneStepCell", "WithLossCell", "CellList", "Conv2d", "Dense", "Dropout", "Embedding", "LayerNorm", "Parameter", "PipelineCell", "ReLU",
    "SequentialCell", "Softmax", "DistributedGradReducer", "SoftmaxCrossEntropyWithLogits", "Tensor", "set_seed",
]
