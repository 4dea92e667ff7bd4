"""Model FLOPs of a training step, per model family: what `autostrat estimate` divides by the
step time (model FLOP/s per device, MFU).

Model FLOPs count what the model needs, not what a plan runs: recomputation is left out, as in
the papers the formulas come from, so that MFU compares plans on one scale.

- GPT (Korthikanti et al. 2022, arXiv 2205.05198, section 6.3; Narayanan et al. 2021's count
  without recomputation): ``72·B·s·l·h²·(1 + s/6h + V/16lh)`` for B sequences of s tokens, l
  layers of hidden size h and a vocabulary of V.
- LLaMA (Chowdhery et al. 2022, "PaLM", arXiv 2204.02311, appendix B): ``6·N·B·s + 12·l·h·s·B·s``,
  N the weights of every matrix product (the blocks' projections and the LM head; the input
  embedding is a lookup), the second term attention's two products over the whole sequence.
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
        weights = layers * sum(math.prod(p.shape) for name, p in net.blocks[0].parameters_and_names()
                               if len(p.shape) == 2)
        weights += hidden * vocab  # the LM head, tied or not
        value = 6 * weights * batch * seq + 12 * layers * hidden * seq * batch * seq
        return value, (f"6·N·B·s + 12·l·h·s·B·s with N={weights} (matrix weights with the LM head), B={batch}, s={seq}, "
                       f"l={layers}, h={hidden} (PaLM's count)")
    raise ConfigError(f"model FLOPs are known for GPT and LLaMA shapes, got {type(net).__name__}")
