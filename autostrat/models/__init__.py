"""Built-in models: the MindSpore tutorial FFN, an MLP stack, a GPT-style transformer, a ResNet-style conv net."""

from autostrat.models.gpt import GPT, megatron_seeds
from autostrat.models.mlp import FFN, MLP
from autostrat.models.resnet import ResNet

__all__ = ["FFN", "GPT", "MLP", "ResNet"]  # built-in model classes (configs name these)
