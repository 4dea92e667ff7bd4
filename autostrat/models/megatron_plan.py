"""Megatron-LM's plan pieces on GPT and LLaMA blocks, as the search's inputs: tensor parallelism
and sequence parallelism as seeds, selective recompute as recomputed ops (`autostrat estimate`).

- Tensor parallelism (Shoeybi et al. 2019): `megatron_seeds` / `llama_megatron_seeds` on every
  block, Q, K, V and the FFN's first products split by columns over ``tp`` devices, the output
  projection and the FFN's last product by rows; the activations' rows over ``dp``. The ops
  between two tensor-parallel regions (`SEQUENCE_OPS`) are seeded whole on every ``tp`` device,
  their rows over ``dp`` only, as Megatron runs them without sequence parallelism (left to
  propagation, the residual adds took the row-split product's output by rows over ``tp``: a
  ReduceScatter, the add on a ``tp``-th of the rows, an AllGather before the next norm, which
  holds a ``tp``-th of the residual stream Megatron holds). The
  embedding table and the LM head split the vocabulary over ``tp`` (Megatron's
  VocabParallelEmbedding and parallel logits) when ``tp`` divides it: the lookup's output is
  then partial, the logits column-split (the loss gathers their classes: autostrat has no
  vocabulary-parallel cross-entropy).
- Sequence parallelism (Korthikanti et al. 2022, section 4.2.2): the ops between two
  tensor-parallel regions (the norms, the residual adds, the biases and dropouts after a row-split product)
  split their rows (batch x sequence) over the ``dp · tp`` devices, so that each tensor-parallel
  rank holds its part of the sequence; the row-split product's partial output then becomes a
  ReduceScatter and the column-split product's input an AllGather, chosen by the planner as for
  any edge (`DESIGN.md`: partial is a state). The backward gathers that input again for the
  weight gradient (``backward_regathers``), whose products are seeded as Megatron computes them
  (`weight_gradient_seeds`), so a device keeps the sequence's part of each norm's output.
- Context parallelism (Llama 3's all-gather form, Dubey et al. 2024, section 3.3.2): the rows of
  a data-parallel rank's sequence split over ``cp`` devices (the products' rows over ``dp · cp``),
  every fused attention's query rows over ``cp`` with K and V whole, which the planner gathers
  (`context_parallel_seeds`; tests/test_context_parallel.py has the Ulysses form as well).
- Mixtures of experts (Megatron-Core's MoE: DeepSeek-V3, GPT-OSS, Mixtral): the shared experts
  split as the dense FFN, MLA's down projections whole on the ``tp`` devices, the routed experts
  over ``ep`` devices and each expert's FFN width over ``etp`` (`expert_parallel_seeds`), folded
  onto the same ``dp · tp`` devices of a stage that attention uses (MoE parallel folding,
  Liu et al. 2025, arXiv 2504.14960): the rest, ``dp · tp / (ep · etp)``, split the token
  groups (expert data parallelism); the router, the dispatch and the combine keep attention's rows.
- Selective recompute (ibid., section 5): the attention core, QKᵀ, its scale and mask, the
  softmax, its dropout and ·V, is computed again in the backward instead of kept (`Primitive.recompute`).
- Pipeline stages (Narayanan et al. 2021): the blocks split evenly over the ``pp · vp`` model
  stages in order (Megatron's default, the embedding on the first stage, the final norm, the LM
  head and the loss on the last), or, where they do not divide the blocks, with fewer blocks on
  the outermost stages as Llama 3 ran (`stage_layer_counts`), as the blocks' ``pipeline_stage``
  (`mark_pipeline_stages`); the split is given, not searched.
"""

from __future__ import annotations

import math

from autostrat.errors import ConfigError
from autostrat.layout.named import NamedLayout
from autostrat.models.gpt import GPT, megatron_seeds
from autostrat.models.llama import LLaMA, llama_megatron_seeds

# Per block, the ops sequence parallelism splits by rows, with each operand's rank (1: a
# parameter vector, 2: activations [rows, hidden]); ops a block lacks (a bias) are skipped.
SEQUENCE_OPS = {"ln1.layer_norm": (2, 1, 1), "ln1.rms_norm": (2, 1), "attention.projection.bias_add": (2, 1),
                "residual1": (2, 2), "ln2.layer_norm": (2, 1, 1), "ln2.rms_norm": (2, 1), "ffn2.bias_add": (2, 1),
                "ffn_down.bias_add": (2, 1), "residual2": (2, 2), "dropout1": (2,), "dropout2": (2,)}
# Unfused attention's ops between Q, K, V and merge (GPT's probs_dropout where it has dropout).
ATTENTION_CORE = ("scores", "scale", "mask", "softmax", "probs_dropout", "context")


def tensor_parallel_seeds(net, tensor_parallel: int, data_parallel: int, where: str = "plan.tp",
                          context_parallel: int = 1) -> dict:
    """Megatron-LM's tensor parallelism over `tensor_parallel` devices and data parallelism over
    `data_parallel` on every block of `net`, each data-parallel rank's rows (one sequence, with
    context parallelism) split further over `context_parallel` devices; a `tensor_parallel` that
    does not divide the heads (LLaMA: the kv heads) is a ConfigError at `where`.

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
    rows = data_parallel * context_parallel
    if isinstance(net, LLaMA):
        names = {name for name, _ in net.primitives_and_names()}
        seeds = {name: seed for name, seed in (llama_megatron_seeds(len(net.blocks), tensor_parallel, rows)
                                                | _llama_extra_seeds(net, tensor_parallel, rows)).items() if name in names}
    else:
        seeds = megatron_seeds(len(net.blocks), tensor_parallel, data_parallel=rows)
    return seeds | _between_regions_seeds(net, rows) | _vocabulary_seeds(net, tensor_parallel, data_parallel, context_parallel)


def _llama_extra_seeds(net, tensor_parallel: int, rows: int) -> dict:
    """Megatron-Core's split of a LLaMA's other products: the shared experts' as the dense FFN's
    (columns, then rows), MLA's down projections whole on the ``tp`` devices (its
    ``linear_q_down_proj`` and ``linear_kv_down_proj``; the up projections are Q, K, V's)."""
    column, row, whole = ((rows, 1), (tensor_parallel, 1)), ((rows, tensor_parallel), (1, tensor_parallel)), ((rows, 1), (1, 1))
    per_layer = {"moe.shared_gate.matmul": column, "moe.shared_up.matmul": column, "moe.shared_down.matmul": row,
                 "attention.query_down.matmul": whole, "attention.kv_down.matmul": whole}
    return {f"blocks.{i}.{op}": (strategy, None) for i in range(len(net.blocks)) for op, strategy in per_layer.items()}


def expert_parallel_seeds(net, expert_parallel: int, expert_tensor_parallel: int, devices: int, rows: int, groups: int,
                          where: str = "plan.ep") -> dict:
    """Every sparse block's routed experts split over `expert_parallel` devices and their FFN
    width over `expert_tensor_parallel`, the `groups` token groups (a micro-batch's sequences)
    over the rest of a stage's `devices` (``dp · tp``; where they are fewer than the rest, over
    their greatest common divisor, the other devices repeating the work), the router, the
    dispatch and the combine on attention's `rows`; a net without experts, or counts that do not
    divide the stage's devices, the experts or their width, a ConfigError at `where`.

    Example (8 experts on 8 devices: EP 4, the token groups over the other 2):
        >>> from autostrat.models import from_hf_config
        >>> net = from_hf_config("configs/models/deepseek-tiny.json", seq=8, batch=4)
        >>> expert_parallel_seeds(net, 4, 1, 8, 4, 4)["blocks.1.moe.expert_down"]
        (((4, 2, 1, 1), (4, 1, 1)), None)
    """
    sparse = [index for index, block in enumerate(net.blocks) if getattr(block, "sparse", False)]
    if not sparse:
        raise ConfigError(f"{where}: expert parallelism needs a mixture-of-experts model, got {type(net).__name__} without experts")
    moe = net.blocks[sparse[0]].moe
    experts, width = moe.w_gate.shape[0], moe.w_gate.shape[2]
    ep, etp = expert_parallel, expert_tensor_parallel
    if devices % (ep * etp) or experts % ep or width % etp:
        raise ConfigError(f"{where}: expected ep x etp dividing a stage's dp x tp = {devices} devices, ep the {experts} "
                          f"experts and etp their width {width}; got ep {ep}, etp {etp}")
    edp = math.gcd(devices // (ep * etp), groups)
    per_layer = {"moe.route": ((rows, 1, 1), (1, 1)), "moe.dispatch": ((rows, 1, 1, 1), (rows, 1, 1)),
                 "moe.expert_gate": ((ep, edp, 1, 1), (ep, 1, etp)), "moe.expert_up": ((ep, edp, 1, 1), (ep, 1, etp)),
                 "moe.expert_down": ((ep, edp, 1, etp), (ep, etp, 1)), "moe.combine": ((rows, 1, 1, 1), (1, rows, 1, 1))}
    return {f"blocks.{i}.{op}": (strategy, None) for i in sparse for op, strategy in per_layer.items()}


def _vocabulary_seeds(net, tensor_parallel: int, data_parallel: int, context_parallel: int) -> dict:
    """The lookup and the LM head with the vocabulary split over the tensor-parallel devices,
    the inner axis as the blocks' seeds place them (a Layout: a strategy tuple would put the
    table's first dim on the outer axis), the ids' sequence over the context-parallel axis; none
    when `tensor_parallel` is 1 or does not divide it."""
    if tensor_parallel == 1 or net.embedding.embedding_table.shape[0] % tensor_parallel:
        return {}
    rows = data_parallel * context_parallel
    head = "lm_head" if net.tie_embeddings else "lm_head.matmul"
    if context_parallel == 1:
        named = NamedLayout((data_parallel, tensor_parallel), ("dp", "tp"))
        ids = named("dp", "None")
    else:
        named = NamedLayout((data_parallel, context_parallel, tensor_parallel), ("dp", "cp", "tp"))
        ids = named("dp", "cp")
    return {"embedding.gather": ((named("tp", "None"), ids), None), head: (((rows, 1), (tensor_parallel, 1)), None)}


def context_parallel_seeds(net, tensor_parallel: int, data_parallel: int, context_parallel: int,
                           where: str = "plan.cp") -> dict:
    """Every block's fused attention with its query rows split over `context_parallel` devices,
    batch over `data_parallel`, heads over `tensor_parallel`, K and V whole on the sequence, on
    the device matrix ``[dp, cp, tp]`` that `tensor_parallel_seeds` gives the products; the
    queries' rotary embedding on their own rows, and grouped K and V repeated whole. A net
    without fused attention, or a sequence `context_parallel` does not divide, is a ConfigError
    at `where`.

    Example:
        >>> net = LLaMA(layers=1, hidden=32, heads=4, seq=8, batch=2, vocab=64, fused_attention=True)
        >>> query, key, _ = context_parallel_seeds(net, 2, 1, 4)["blocks.0.attention.attend"][0]
        >>> query.tensor_map, key.tensor_map
        ((2, 0, 1, -1), (2, 0, -1, -1))
    """
    _check_family(net, where)
    if not getattr(net.blocks[0].attention, "fused", False):
        raise ConfigError(f"{where}: {context_parallel} is not yet expressible for {type(net).__name__} without fused "
                          "attention (context parallelism splits FlashAttentionScore's query rows; set "
                          "model.params.fused_attention: true)")
    if net.seq % context_parallel:
        raise ConfigError(f"{where}: expected a divisor of the sequence length {net.seq}, got {context_parallel}")
    named = NamedLayout((data_parallel, context_parallel, tensor_parallel), ("dp", "cp", "tp"))
    query, whole = named("dp", "tp", "cp", "None"), named("dp", "tp", "None", "None")
    seeds = {}
    for index, block in enumerate(net.blocks):
        seeds[f"blocks.{index}.attention.attend"] = ((query, whole, whole), None)
        # The queries' rotary embedding on their own rows (cos and sin rows over cp too): left to
        # propagation, it may run on the whole sequence and the query be sliced after it.
        table = named("cp", "None")
        seeds[f"blocks.{index}.attention.rotary_query"] = ((query, table, table), None)
        if block.attention.group > 1:  # grouped K and V repeated whole on the sequence, kv heads over tp
            repeated = named("dp", "tp", "None", "None", "None")
            for tensor in ("key", "value"):
                seeds[f"blocks.{index}.attention.expand_{tensor}"] = ((whole,), None)
                seeds[f"blocks.{index}.attention.copy_{tensor}"] = ((repeated,) * block.attention.group, None)
    return seeds


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
    return _between_regions_seeds(net, tensor_parallel * data_parallel)


def weight_gradient_seeds(net, seeds: dict) -> dict:
    """Seeds of the weight-gradient products of `seeds`' Dense products of `net` (MatMul with
    ``transpose_b``, the weight ``[out, in]``: the blocks' and the LM head's) whose weight is
    split by columns, by rows or not at all: split as Megatron computes
    them, the gradient of the output and the input by the forward's rows and as the forward
    splits their widths, so that each device's part of the weight gradient is its part of the
    weight, partial over the rows' devices only (reduced in the update, with the other
    micro-batches'). With sequence parallelism a column-split product's input is a norm's
    output, gathered over the ``tp`` devices in the backward again, and a row-split product's
    output gradient too (`search.plan.EdgeRedistribution`): left to propagation, the column-split
    products took the sequence's part and the output's gradient by rows, and kept a whole-weight
    gradient, partial over ``tp``. Named as `autodiff.matmul` emits them: a Dense product's
    input gradient first, its weight gradient second (``mat_mul_1``).

    Example:
        >>> net = GPT(layers=1, hidden=32, heads=4, seq=8, batch=2, vocab=64)
        >>> found = weight_gradient_seeds(net, tensor_parallel_seeds(net, 2, 4))
        >>> found["bprop/blocks.0.ffn1.matmul/mat_mul_1"], found["bprop/blocks.0.ffn2.matmul/mat_mul_1"]
        ((((4, 2), (4, 1)), None), (((4, 1), (4, 2)), None))
    """
    primitives, found = dict(net.primitives_and_names()), {}
    for name, (strategy, _) in seeds.items():
        primitive = primitives.get(name)
        dense = primitive is not None and primitive.op_type == "MatMul" and primitive.attrs == {"transpose_b": True}
        if not dense or not all(isinstance(part, tuple) for part in strategy):
            continue  # Dense products only, seeded by device counts
        activation, weight = strategy
        if len(activation) == len(weight) == 2 and activation[1] == weight[1] and 1 in weight:
            rows, inner, outer = activation[0], weight[1], weight[0]
            found[f"bprop/{name}/mat_mul_1"] = (((rows, outer), (rows, inner)), None)
    return found


def _between_regions_seeds(net, rows: int) -> dict:
    """Every block's `SEQUENCE_OPS` with their activations' rows split over `rows` devices and
    nothing else split (whole on the other devices of the stage)."""
    names = {name for name, _ in net.primitives_and_names()}
    seeds = {}
    for index in range(len(net.blocks)):
        for op, ranks in SEQUENCE_OPS.items():
            name = f"blocks.{index}.{op}"
            if name in names:
                seeds[name] = (tuple((rows, 1) if rank == 2 else (1,) for rank in ranks), None)
    return seeds


def mark_pipeline_stages(net, stages: int, where: str = "plan.pp") -> None:
    """Set every block's ``pipeline_stage`` to Megatron's split of the blocks over `stages`
    model stages in order (`stage_layer_counts`); more stages than blocks is a ConfigError at
    `where`.

    Example (8 blocks over 2 pipeline ranks of 2 virtual stages each: 2 blocks per model stage):
        >>> net = GPT(layers=8, hidden=32, heads=4, seq=8, batch=2, vocab=64)
        >>> mark_pipeline_stages(net, 4)
        >>> [block.pipeline_stage for block in net.blocks]
        [0, 0, 1, 1, 2, 2, 3, 3]
    """
    _check_family(net, where)
    layers = len(net.blocks)
    if layers < stages:
        raise ConfigError(f"{where}: each of the pp · vp model stages holds at least one of the {layers} layers: expected at "
                          f"most {layers} stages, got {stages}")
    stage_of = [stage for stage, count in enumerate(stage_layer_counts(layers, stages)) for _ in range(count)]
    for block, stage in zip(net.blocks, stage_of):
        block.pipeline_stage = stage


def stage_layer_counts(layers: int, stages: int) -> list[int]:
    """Blocks per model stage: Megatron's even split where `stages` divides `layers`; else
    ``ceil(layers / stages)`` each but one fewer on the outermost stages in turn (the first, the
    last, the second, the second to last ...) until they add up, as Llama 3 405B ran its 126
    layers on 16 stages: 7 on the first and the last, which also hold the embedding and the LM
    head (Megatron's ``--decoder-first/last-pipeline-num-layers``).

    Example:
        >>> stage_layer_counts(8, 4), stage_layer_counts(10, 4)
        ([2, 2, 2, 2], [2, 3, 3, 2])
        >>> stage_layer_counts(126, 16)
        [7, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 7]
    """
    most = -(-layers // stages)
    counts = [most] * stages
    outermost = [stage for pair in zip(range(stages), reversed(range(stages))) for stage in pair]
    for stage in outermost[: most * stages - layers]:  # fewer than `stages`: distinct stages
        counts[stage] -= 1
    return counts


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
