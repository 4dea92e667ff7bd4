"""Built-in models: the MindSpore tutorial FFN, an MLP stack, a GPT-style transformer and its block stack, a LLaMA-style
decoder (dense or a mixture of experts), a ResNet-style conv net; `from_hf_config` builds GPT or LLaMA from a
HuggingFace config.json."""

from autostrat.models.gpt import GPT, TransformerStack, megatron_seeds
from autostrat.models.hf_config import from_hf_config
from autostrat.models.llama import LLaMA, llama_megatron_seeds
from autostrat.models.mlp import FFN, MLP, tutorial_plan
from autostrat.models.moe import MoeFeedForward, moe_seeds
from autostrat.models.resnet import ResNet

from autostrat.frontend.registry import register_model, register_model_file

MODELS = ("FFN", "GPT", "LLaMA", "MLP", "ResNet", "TransformerStack")  # the built-in names a config's model.name may use
for _model in (FFN, GPT, LLaMA, MLP, ResNet, TransformerStack):
    register_model(_model)
register_model_file("hf_config", from_hf_config)
__all__ = ["FFN", "GPT", "LLaMA", "MLP", "MoeFeedForward", "ResNet", "TransformerStack", "from_hf_config", "llama_megatron_seeds",
           "megatron_seeds", "moe_seeds", "tutorial_plan"]
