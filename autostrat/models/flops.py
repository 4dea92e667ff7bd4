"""Model FLOPs of a training step, per model family: what `autostrat estimate` divides by the
step time (model FLOP/s per device, MFU).

Model FLOPs count what the model needs, not what a plan runs: recomputation is left out, as in
the papers the formulas come from, so that MFU compares plans on one scale.

- GPT (Korthikanti et al. 2022, arXiv 2205.05198, section 6.3; Narayanan et al. 2021's count
  without recomputation): ``72·B·s·l·h²·(1 + s/6h + V/16lh)`` for B sequences of s tokens, l
  layers of hidden size h and a vocabulary of V.
- LLaMA (Chowdhery et al. 2022, "PaLM", arXiv 2204.02311, appendix B): ``6·N·B·s + 12·l·h·s·B·s``,
  N the weights of every matrix product (the blocks' projections and the LM head; the input
  embedding is a lookup), the second term attention's two products over the whole sequence (h
  there the heads' width, heads × head size, which MLA and GPT-OSS make differ from the hidden
  size). A mixture of experts counts the weights a token meets (the activated parameters, as
  DeepSeek-V3's 37B of 671B): its router and shared experts, and `top_k` of its routed experts.
"""

from __future__ import annotations

import math

from autostrat.errors import ConfigError
from autostrat.models.gpt import GPT
from autostrat.models.llama import LLaMA


def model_flops(net, batch: int) -> tuple[int, str]:
    """The model FLOPs of one training step of `net` (a `GPT` or `LLaMA`) on `batch` sequences,
    and the formula with its values.

    Example (Korthikanti et al.'s 22B GPT, global batch 4):
        >>> from autostrat.models import from_hf_config
        >>> flops, formula = model_flops(from_hf_config("configs/models/gpt-22b.json", seq=2048), 4)
        >>> f"{flops:.4e}", formula.split(" with ")[0]
        ('1.1397e+15', '72·B·s·l·h²·(1 + s/6h + V/16lh)')
    """
    seq, hidden, layers = net.seq, net.hidden, len(net.blocks)
    vocab = net.embedding.embedding_table.shape[0]
    if isinstance(net, GPT):
        value = 72 * batch * seq * layers * hidden**2 * (1 + seq / (6 * hidden) + vocab / (16 * layers * hidden))
        return round(value), (f"72·B·s·l·h²·(1 + s/6h + V/16lh) with B={batch}, s={seq}, l={layers}, h={hidden}, V={vocab} "
                              f"(Korthikanti et al. 2022)")
    if isinstance(net, LLaMA):
        weights = sum(_activated_weights(block) for block in net.blocks) + hidden * vocab  # the LM head, tied or not
        width = net.blocks[0].attention.heads * net.blocks[0].attention.head_size
        value = 6 * weights * batch * seq + 12 * layers * width * seq * batch * seq
        return value, (f"6·N·B·s + 12·l·h·s·B·s with N={weights} (matrix weights with the LM head, the experts a token "
                       f"meets), B={batch}, s={seq}, l={layers}, h={width} (PaLM's count)")
    raise ConfigError(f"model FLOPs are known for GPT and LLaMA shapes, got {type(net).__name__}")


def _activated_weights(block) -> int:
    """A block's matrix weights a token meets: its 2-D weights, and of the experts' ``[e, a, b]``
    weights the `top_k` experts it is routed to."""
    top_k = block.moe.dispatch_mask.attrs["top_k"] if block.sparse else 0
    return sum(math.prod(p.shape) if len(p.shape) == 2 else top_k * math.prod(p.shape[1:])
               for _, p in block.parameters_and_names() if len(p.shape) in (2, 3))
