"""MindSpore-style model building: Cell, Parameter, Tensor and layers."""

from autostrat.frontend.cell import Cell, CellList, SequentialCell
from autostrat.frontend.grad_reducer import DistributedGradReducer
from autostrat.frontend.pipeline import PipelineCell, PipelineGradReducer
from autostrat.frontend.layers import (GELU, Conv2d, CrossEntropyLoss, Dense, Dropout, Embedding, Flatten, LayerNorm, MSELoss,
                                       ReLU, SiLU, Softmax, SoftmaxCrossEntropyWithLogits)
from autostrat.frontend.tensor import Parameter, Tensor, set_seed
from autostrat.frontend.train import SGD, Adam, Momentum, TrainOneStepCell, WithLossCell

__all__ = [
    "SGD", "Adam", "GELU", "Cell", "MSELoss", "Momentum", "TrainOneStepCell", "WithLossCell", "CellList", "Conv2d", "CrossEntropyLoss", "Dense", "DistributedGradReducer", "Flatten", "Dropout", "Embedding", "LayerNorm", "Parameter", "PipelineCell", "PipelineGradReducer", "ReLU",
    "SequentialCell", "SiLU", "Softmax", "SoftmaxCrossEntropyWithLogits", "Tensor", "set_seed",
]
