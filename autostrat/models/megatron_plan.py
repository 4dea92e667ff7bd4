"""Megatron-LM's plan pieces on GPT and LLaMA blocks, as the search's inputs: tensor parallelism
and sequence parallelism as seeds, selective recompute as recomputed ops (`autostrat estimate`).

- Tensor parallelism (Shoeybi et al. 2019): `megatron_seeds` / `llama_megatron_seeds` on every
  block, Q, K, V and the FFN's first products split by columns over ``tp`` devices, the output
  projection and the FFN's last product by rows; the activations' rows over ``dp``. The
  embedding table and the LM head split the vocabulary over ``tp`` (Megatron's
  VocabParallelEmbedding and parallel logits) when ``tp`` divides it: the lookup's output is
  then partial, the logits column-split (the loss gathers their classes: autostrat has no
  vocabulary-parallel cross-entropy).
- Sequence parallelism (Korthikanti et al. 2022, section 4.2.2): the ops between two
  tensor-parallel regions (the norms, the residual adds, the biases after a row-split product)
  split their rows (batch x sequence) over the ``dp · tp`` devices, so that each tensor-parallel
  rank holds its part of the sequence; the row-split product's partial output then becomes a
  ReduceScatter and the column-split product's input an AllGather, chosen by the planner as for
  any edge (`DESIGN.md`: partial is a state).
- Selective recompute (ibid., section 5): the attention core, QKᵀ, its scale and mask, the
  softmax and ·V, is computed again in the backward instead of kept (`Primitive.recompute`).
"""

from __future__ import annotations

from autostrat.errors import ConfigError
from autostrat.layout.named import NamedLayout
from autostrat.models.gpt import GPT, megatron_seeds
from autostrat.models.llama import LLaMA, llama_megatron_seeds

# Per block, the ops sequence parallelism splits by rows, with each operand's rank (1: a
# parameter vector, 2: activations [rows, hidden]); ops a block lacks (a bias) are skipped.
SEQUENCE_OPS = {"ln1.layer_norm": (2, 1, 1), "ln1.rms_norm": (2, 1), "attention.projection.bias_add": (2, 1),
                "residual1": (2, 2), "ln2.layer_norm": (2, 1, 1), "ln2.rms_norm": (2, 1), "ffn2.bias_add": (2, 1),
                "ffn_down.bias_add": (2, 1), "residual2": (2, 2)}
ATTENTION_CORE = ("scores", "scale", "mask", "softmax", "context")  # unfused attention's ops between Q, K, V and merge


def tensor_parallel_seeds(net, tensor_parallel: int, data_parallel: int, where: str = "plan.tp") -> dict:
    """Megatron-LM's tensor parallelism over `tensor_parallel` devices and data parallelism over
    `data_parallel` on every block of `net`; a `tensor_parallel` that does not divide the heads
    (LLaMA: the kv heads) is a ConfigError at `where`.

    Example:
        >>> net = GPT(layers=2, hidden=32, heads=4, seq=8, batch=2, vocab=64)
        >>> tensor_parallel_seeds(net, 2, 4)["blocks.1.ffn2.matmul"]
        (((4, 2), (1, 2)), None)
    """
    _check_family(net, where)
    attention = net.blocks[0].attention
    heads = attention.kv_heads if isinstance(net, LLaMA) else attention.heads
    if heads % tensor_parallel:
        kind = "key-value heads" if isinstance(net, LLaMA) else "attention heads"
        raise ConfigError(f"{where}: expected a divisor of the model's {heads} {kind} (Megatron splits whole heads), "
                          f"got {tensor_parallel}")
    if isinstance(net, LLaMA):
        seeds = llama_megatron_seeds(len(net.blocks), tensor_parallel, data_parallel)
    else:
        seeds = megatron_seeds(len(net.blocks), tensor_parallel, data_parallel=data_parallel)
    return seeds | _vocabulary_seeds(net, tensor_parallel, data_parallel)


def _vocabulary_seeds(net, tensor_parallel: int, data_parallel: int) -> dict:
    """The lookup and the LM head with the vocabulary split over the tensor-parallel devices,
    the inner axis as the blocks' seeds place them (a Layout: a strategy tuple would put the
    table's first dim on the outer axis); none when `tensor_parallel` is 1 or does not divide it."""
    if tensor_parallel == 1 or net.embedding.embedding_table.shape[0] % tensor_parallel:
        return {}
    named = NamedLayout((data_parallel, tensor_parallel), ("dp", "tp"))
    head = "lm_head" if net.tie_embeddings else "lm_head.matmul"
    return {"embedding.gather": ((named("tp", "None"), named("dp", "None")), None),
            head: (((data_parallel, 1), (tensor_parallel, 1)), None)}


def sequence_parallel_seeds(net, tensor_parallel: int, data_parallel: int) -> dict:
    """The seeds that split every block's norms, residual adds and biases after a row-split
    product by rows over ``data_parallel · tensor_parallel`` devices (the module docstring).

    Example:
        >>> net = GPT(layers=1, hidden=32, heads=4, seq=8, batch=2, vocab=64)
        >>> seeds = sequence_parallel_seeds(net, 2, 4)
        >>> seeds["blocks.0.ln1.layer_norm"], seeds["blocks.0.residual2"]
        ((((8, 1), (1,), (1,)), None), (((8, 1), (8, 1)), None))
    """
    _check_family(net)
    rows = tensor_parallel * data_parallel
    names = {name for name, _ in net.primitives_and_names()}
    seeds = {}
    for index in range(len(net.blocks)):
        for op, ranks in SEQUENCE_OPS.items():
            name = f"blocks.{index}.{op}"
            if name in names:
                seeds[name] = (tuple((rows, 1) if rank == 2 else (1,) for rank in ranks), None)
    return seeds


def mark_selective_recompute(net) -> tuple[str, ...]:
    """Mark every block's attention core for recomputation (`Primitive.recompute`); the paths
    of the ops marked (none for a fused attention, which keeps no score matrix anyway).

    Example:
        >>> mark_selective_recompute(GPT(layers=1, hidden=32, heads=4, seq=8, batch=2, vocab=64))[:2]
        ('blocks.0.attention.scores', 'blocks.0.attention.scale')
    """
    _check_family(net)
    marked = []
    for index, block in enumerate(net.blocks):
        for name in ATTENTION_CORE:
            primitive = getattr(block.attention, name, None)
            if primitive is not None:
                primitive.recompute()
                marked.append(f"blocks.{index}.attention.{name}")
    return tuple(marked)


def _check_family(net, where: str = "plan") -> None:
    if not isinstance(net, (GPT, LLaMA)):
        raise ConfigError(f"{where}: Megatron's plan pieces are placed on GPT and LLaMA shapes, got {type(net).__name__}")
