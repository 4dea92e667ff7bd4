"""Built-in models: the MindSpore tutorial FFN, an MLP stack, a GPT-style transformer and its block stack, a ResNet-style conv net."""

from autostrat.models.gpt import GPT, TransformerStack, megatron_seeds
from autostrat.models.mlp import FFN, MLP, tutorial_plan
from autostrat.models.resnet import ResNet

MODELS = ("FFN", "GPT", "MLP", "ResNet", "TransformerStack")  # the names a config's model.name may use
__all__ = ["FFN", "GPT", "MLP", "ResNet", "TransformerStack", "megatron_seeds", "tutorial_plan"]
