"""Built-in models: the MindSpore tutorial FFN, an MLP stack, a GPT-style transformer and its block stack, a ResNet-style conv net."""

from autostrat.models.gpt import GPT, TransformerStack, megatron_seeds
from autostrat.models.mlp import FFN, MLP, tutorial_plan
from autostrat.models.resnet import ResNet

from autostrat.frontend.registry import register_model

MODELS = ("FFN", "GPT", "MLP", "ResNet", "TransformerStack")  # the built-in names a config's model.name may use
for _model in (FFN, GPT, MLP, ResNet, TransformerStack):
    register_model(_model)
__all__ = ["FFN", "GPT", "MLP", "ResNet", "TransformerStack", "megatron_seeds", "tutorial_plan"]
