"""A LLaMA-style decoder: token embeddings, pre-RMSNorm blocks of causal attention with rotary
position embeddings and grouped-query attention, a SwiGLU FFN, residuals, a final RMSNorm, an
LM head (tied to the embeddings or not) and GPT's cross-entropy loss.

As in `models.gpt`, activations stay 2-D ``[batch * seq, hidden]`` between blocks and heads are
formed with Reshape + Transpose into ``[batch, heads, seq, head_size]``, the layout
``RotaryPositionEmbedding`` takes (MindSpore's BNSD). Grouped-query attention does not repeat
K and V (HuggingFace's ``repeat_kv``) but reshapes the queries ``[b, heads, s, d] ->
[b, kv_heads, group, s, d]`` (group = heads / kv_heads) and gives K and V a size-1 group dim
(ExpandDims) that the BatchMatMuls broadcast: query head h = j * group + g meets kv head j, as
in repeat_kv. The Reshape's rule makes the kv-head factor the major part of the head factor, so
a split of the kv heads is a split of the query heads (Megatron's TP); the group factor, absent
from K and V, may be split further, K and V then being replicated over those devices.

DeepSeek's multi-head latent attention (MLA, DeepSeek-AI 2024, arXiv 2412.19437, section 2.1.1)
is modelled by its shapes: low-rank query and key-value projections (`Attention`'s `q_rank`,
`kv_rank`: a down projection, an RMSNorm, the up projections to the heads, as its LoRA ranks
give them), the key and the value made from one shared latent, then standard attention with one
head size for Q, K and V (DeepSeek's ``qk_nope_head_dim + qk_rope_head_dim``: its values, of
``v_head_dim``, are wider here) and the rotary embedding on the whole head (DeepSeek turns its
``qk_rope_head_dim`` dims only, from a key part shared by the heads); no cached latent (training).
"""

from __future__ import annotations

import functools
import math

import numpy as np

from autostrat import ops
from autostrat.errors import ConfigError
from autostrat.frontend.cell import Cell, CellList
from autostrat.frontend.layers import Dense, Embedding, RMSNorm, SoftmaxCrossEntropyWithLogits
from autostrat.frontend.tensor import Tensor
from autostrat.models.gpt import LanguageModel, causal_mask_tensor, dropped, is_probability, make_dropout
from autostrat.models.moe import MoeFeedForward, expert_capacity
from autostrat.models.sizes import check_sizes


@functools.cache
def rotary_tables(seq: int, head_size: int, theta: float) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin ``[seq, head_size]`` of HuggingFace LLaMA's rotary embedding: position p
    turns pair (i, i + head_size/2) by ``p * theta ** (-2i / head_size)``, the angles repeated
    over both halves (rotate_half's layout). Computed in float64, kept read-only in float32.

    Example:
        >>> cos, sin = rotary_tables(3, 4, 10000.0)
        >>> cos.shape, [round(float(v), 4) for v in sin[1]]
        ((3, 4), [0.8415, 0.01, 0.8415, 0.01])
    """
    inverse_frequency = theta ** (-np.arange(0, head_size, 2, dtype=np.float64) / head_size)
    angles = np.outer(np.arange(seq, dtype=np.float64), inverse_frequency)
    angles = np.concatenate([angles, angles], axis=-1)
    tables = np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)
    for table in tables:
        table.setflags(write=False)
    return tables


class Attention(Cell):
    """Causal attention with rotary embeddings on Q and K. With `kv_heads` below `heads`, the
    queries are grouped by the kv head they share (``[b, heads, s, d] -> [b, kv, group, s, d]``)
    and K and V get a size-1 group dim that the BatchMatMuls broadcast, instead of repeating.
    `fused` computes the attention with one causal ``FlashAttentionScore`` instead. `head_size`
    defaults to ``hidden / heads``; `q_rank` and `kv_rank` make the query and the key-value
    projections low-rank (MLA's shapes, the module docstring), each through an RMSNorm of
    `epsilon`. `dropout` drops attention probabilities (HuggingFace's attention_dropout), seeded
    `seed`; the fused attention has none (a ConfigError)."""

    def __init__(self, seq: int, hidden: int, heads: int, kv_heads: int, theta: float, qkv_bias: bool = False, output_bias: bool = False,
                 fused: bool = False, head_size: int | None = None, q_rank: int | None = None, kv_rank: int | None = None,
                 epsilon: float = 1e-6, dropout: float = 0.0, seed: int = 0):
        super().__init__()
        if fused and dropout:
            raise ConfigError(f"LLaMA: attention dropout {dropout} needs the unfused attention (autostrat's FlashAttentionScore "
                              "keeps every probability: keep_prob 1); set fused_attention false")
        self.fused = fused
        self.head_size = hidden // heads if head_size is None else head_size
        self.seq, self.heads, self.kv_heads = seq, heads, kv_heads
        self.group = heads // kv_heads
        width, kv_width = heads * self.head_size, kv_heads * self.head_size
        self.low_rank_query, self.low_rank_kv = q_rank is not None, kv_rank is not None
        if self.low_rank_query:  # the up projection keeps the name `query`: Megatron's seeds split it by columns
            self.query_down, self.query_norm = Dense(hidden, q_rank, has_bias=False), RMSNorm((q_rank,), epsilon)
        if self.low_rank_kv:
            self.kv_down, self.kv_norm = Dense(hidden, kv_rank, has_bias=False), RMSNorm((kv_rank,), epsilon)
        self.query = Dense(q_rank or hidden, width, has_bias=qkv_bias)
        kv_input = kv_rank or hidden
        self.key, self.value = Dense(kv_input, kv_width, has_bias=qkv_bias), Dense(kv_input, kv_width, has_bias=qkv_bias)
        self.split_query, self.split_key, self.split_value = ops.Reshape(), ops.Reshape(), ops.Reshape()
        self.query_heads, self.key_heads, self.value_heads = ops.Transpose(), ops.Transpose(), ops.Transpose()
        self.rotary_query, self.rotary_key = ops.RotaryPositionEmbedding(), ops.RotaryPositionEmbedding()
        self.dropout, self.seed = dropout, seed
        if fused:
            self._init_fused()
        else:
            self._init_unfused()
        self.from_heads, self.merge_heads = ops.Transpose(), ops.Reshape()
        self.projection = Dense(width, hidden, has_bias=output_bias)
        cos, sin = rotary_tables(seq, self.head_size, theta)
        self.cos, self.sin = Tensor(cos), Tensor(sin)

    def _init_unfused(self):
        if self.group > 1:
            self.group_queries, self.ungroup_context = ops.Reshape(), ops.Reshape()
            self.expand_key, self.expand_value = ops.ExpandDims(), ops.ExpandDims()
        self.scores = ops.BatchMatMul(transpose_b=True)
        self.scale, self.mask, self.softmax = ops.Mul(), ops.Add(), ops.Softmax()
        self.probs_dropout = make_dropout(self.dropout, self.seed)
        self.context = ops.BatchMatMul()
        self.causal_mask = causal_mask_tensor(self.seq)
        self.scale_factor = Tensor(np.float32(1 / math.sqrt(self.head_size)))

    def _init_fused(self):
        # FlashAttentionScore takes as many key heads as query heads: grouped K and V are
        # repeated as HuggingFace's repeat_kv does ([b, kv, s, d] -> group copies [b, kv, group, s, d]
        # -> [b, heads, s, d]), by Concat since BroadcastTo's shape would fix the batch.
        if self.group > 1:
            self.expand_key, self.expand_value = ops.ExpandDims(), ops.ExpandDims()
            self.copy_key, self.copy_value = ops.Concat(axis=2), ops.Concat(axis=2)
            self.repeat_key, self.repeat_value = ops.Reshape(), ops.Reshape()
        self.attend = ops.FlashAttentionScore(self.heads, scale_value=1 / math.sqrt(self.head_size), sparse_mode=2)

    def _heads(self, x, split, transpose, count: int):
        # The batch follows the input (a pipeline traces micro-batches), not the constructor's.
        x = split(x, (x.shape[0] // self.seq, self.seq, count, self.head_size))
        return transpose(x, (0, 2, 1, 3))

    def construct(self, x):
        query_input = self.query_norm(self.query_down(x)) if self.low_rank_query else x
        latent = self.kv_norm(self.kv_down(x)) if self.low_rank_kv else x
        q = self.rotary_query(self._heads(self.query(query_input), self.split_query, self.query_heads, self.heads), self.cos, self.sin)
        k = self.rotary_key(self._heads(self.key(latent), self.split_key, self.key_heads, self.kv_heads), self.cos, self.sin)
        v = self._heads(self.value(latent), self.split_value, self.value_heads, self.kv_heads)
        context = self._fused_context(q, k, v) if self.fused else self._unfused_context(q, k, v)
        context = self.from_heads(context, (0, 2, 1, 3))
        context = self.merge_heads(context, (context.shape[0] * self.seq, self.heads * self.head_size))
        return self.projection(context)

    def _fused_context(self, q, k, v):
        if self.group > 1:
            k = self._repeat(k, self.expand_key, self.copy_key, self.repeat_key)
            v = self._repeat(v, self.expand_value, self.copy_value, self.repeat_value)
        return self.attend(q, k, v)

    def _repeat(self, x, expand, copy, reshape):
        x = copy((expand(x, 2),) * self.group)
        return reshape(x, (x.shape[0], self.heads, self.seq, self.head_size))

    def _unfused_context(self, q, k, v):
        if self.group > 1:  # query head h uses kv head h // group, as HuggingFace's repeat_kv
            q = self.group_queries(q, (q.shape[0], self.kv_heads, self.group, self.seq, self.head_size))
            k, v = self.expand_key(k, 2), self.expand_value(v, 2)
        scores = self.mask(self.scale(self.scores(q, k), self.scale_factor), self.causal_mask)
        context = self.context(dropped(self.probs_dropout, self.softmax(scores)), v)
        if self.group > 1:
            context = self.ungroup_context(context, (context.shape[0], self.heads, self.seq, self.head_size))
        return context


class Block(Cell):
    """Attention and a SwiGLU FFN, or with `moe` (`MoeFeedForward`'s arguments but the sizes; its
    ``ffn`` the experts' width, `ffn` by default) a mixture of experts."""

    def __init__(self, seq: int, hidden: int, ffn: int, heads: int, kv_heads: int, theta: float, epsilon: float, moe: dict | None = None,
                 **options):
        super().__init__()
        self.ln1 = RMSNorm((hidden,), epsilon)
        self.attention = Attention(seq, hidden, heads, kv_heads, theta, epsilon=epsilon, **options)
        self.residual1 = ops.Add()
        self.ln2 = RMSNorm((hidden,), epsilon)
        self.sparse = moe is not None
        if self.sparse:
            self.moe = MoeFeedForward(seq, hidden, **({"ffn": ffn} | moe))
        else:
            self.ffn_gate, self.ffn_up = Dense(hidden, ffn, has_bias=False), Dense(hidden, ffn, has_bias=False)
            self.gate, self.glu = ops.SiLU(), ops.Mul()
            self.ffn_down = Dense(ffn, hidden, has_bias=False)
        self.residual2 = ops.Add()

    def construct(self, x):
        x = self.residual1(x, self.attention(self.ln1(x)))
        h = self.ln2(x)
        if self.sparse:
            return self.residual2(x, self.moe(h))
        return self.residual2(x, self.ffn_down(self.glu(self.gate(self.ffn_gate(h)), self.ffn_up(h))))


class LLaMA(LanguageModel):
    """Inputs: token ids ``[batch, seq]`` and next-token labels ``[batch * seq]``; output: the
    mean loss. `kv_heads` below `heads` is grouped-query attention; `tie_embeddings` makes the
    LM head the embedding table's transpose; `fused_attention` computes attention with one
    ``FlashAttentionScore`` op (causal, BNSD) instead of BatchMatMul, mask, Softmax, BatchMatMul.
    `experts` makes every FFN a mixture of that many experts of width `ffn` (Mixtral), each token
    routed to `experts_per_token` of them with `models.moe.expert_capacity` slots per expert;
    `moe` adds DeepSeek's pieces (`MOE_OPTIONS`: the experts' own width, shared experts, the
    first dense blocks, sigmoid gates, the routed scaling). `attention` holds `Attention`'s
    `head_size`, `q_rank` and `kv_rank` (MLA's shapes). `attention_dropout` drops the attention
    probabilities of the unfused attention (block ``i``'s Dropout seeded ``i + 1``).

    Example:
        >>> net = LLaMA(layers=1, hidden=32, ffn=48, heads=4, kv_heads=2, seq=8, batch=2, vocab=64)
        >>> net.blocks[0].attention.key.weight.shape, type(net.blocks[0].gate).__name__
        ((16, 32), 'SiLU')
        >>> net = LLaMA(layers=2, hidden=32, ffn=48, heads=4, seq=8, vocab=64, experts=4, moe={"dense_layers": 1, "ffn": 16})
        >>> net.blocks[0].sparse, net.blocks[1].moe.w_up.shape
        (False, (4, 32, 16))
    """

    def __init__(self, layers: int = 2, hidden: int = 64, ffn: int = 172, heads: int = 4, kv_heads: int | None = None,
                 seq: int = 16, batch: int = 4, vocab: int = 128, epsilon: float = 1e-6, rope_theta: float = 10000.0,
                 tie_embeddings: bool = False, qkv_bias: bool = False, output_bias: bool = False, fused_attention: bool = False,
                 experts: int | None = None, experts_per_token: int = 2, capacity_factor: float | None = None,
                 moe: dict | None = None, attention: dict | None = None, attention_dropout: float = 0.0):
        super().__init__()
        if not is_probability(attention_dropout):
            raise ConfigError(f"LLaMA: attention_dropout must be a probability in [0, 1), got {attention_dropout!r}")
        kv_heads = heads if kv_heads is None else kv_heads
        attention = _attention_options(attention)
        check_sizes("LLaMA", layers=layers, hidden=hidden, ffn=ffn, heads=heads, kv_heads=kv_heads, seq=seq, batch=batch, vocab=vocab)
        _check_shape(hidden, heads, kv_heads, epsilon, rope_theta, attention.get("head_size"))
        routing, dense_layers = (None, layers) if experts is None else _moe_routing(seq, experts, experts_per_token, capacity_factor, moe)
        self.batch, self.seq, self.hidden, self.tie_embeddings = batch, seq, hidden, bool(tie_embeddings)
        self.embedding = Embedding(vocab, hidden)
        self.flatten = ops.Reshape()
        self.blocks = CellList(Block(seq, hidden, ffn, heads, kv_heads, rope_theta, epsilon, qkv_bias=qkv_bias, output_bias=output_bias,
                                     fused=bool(fused_attention), moe=None if index < dense_layers else routing, **attention,
                                     dropout=attention_dropout, seed=index + 1)
                               for index in range(layers))
        self.ln_final = RMSNorm((hidden,), epsilon)
        self.lm_head = ops.MatMul(transpose_b=True) if self.tie_embeddings else Dense(hidden, vocab, has_bias=False)
        self.loss = SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")

    def construct(self, ids, labels):
        x = self.flatten(self.embedding(ids), (ids.shape[0] * self.seq, self.hidden))
        for block in self.blocks:
            x = block(x)
        return self.head_loss(x, labels)


# LLaMA's `moe` options and their defaults (Mixtral's): the experts' width (None: the model's
# ffn), the shared experts' summed width (None: no shared experts), the first blocks kept dense,
# the gate, whether the chosen gates are renormalised, and the routed output's scale.
MOE_OPTIONS = {"ffn": None, "shared_ffn": None, "dense_layers": 0, "gate": "softmax", "norm_topk_prob": True, "routed_scaling": 1.0}
ATTENTION_OPTIONS = ("head_size", "kv_rank", "q_rank")


def _attention_options(attention) -> dict:
    attention = {} if attention is None else dict(attention)
    unknown = sorted(set(attention) - set(ATTENTION_OPTIONS))
    if unknown:
        raise ConfigError(f"LLaMA: attention.{unknown[0]}: unknown option; expected {', '.join(ATTENTION_OPTIONS)}")
    check_sizes("LLaMA", **{f"attention.{key}": value for key, value in attention.items() if value is not None})
    return {key: value for key, value in attention.items() if value is not None}


def _moe_routing(seq: int, experts: int, experts_per_token: int, capacity_factor, moe) -> tuple[dict, int]:
    """`Block`'s `moe` arguments and the number of first blocks kept dense."""
    check_sizes("LLaMA", experts=experts, experts_per_token=experts_per_token)
    if experts_per_token > experts:
        raise ConfigError(f"LLaMA: experts_per_token must be at most experts {experts}, got {experts_per_token}")
    options = MOE_OPTIONS | (moe or {})
    unknown = sorted(set(options) - set(MOE_OPTIONS))
    if unknown:
        raise ConfigError(f"LLaMA: moe.{unknown[0]}: unknown option; expected {', '.join(MOE_OPTIONS)}")
    check_sizes("LLaMA", **{f"moe.{key}": options[key] for key in ("ffn", "shared_ffn") if options[key] is not None})
    dense = options.pop("dense_layers")
    if isinstance(dense, bool) or not isinstance(dense, int) or dense < 0:
        raise ConfigError(f"LLaMA: moe.dense_layers must be a count of blocks (0 or more), got {dense!r}")
    if isinstance(options["routed_scaling"], bool) or not isinstance(options["routed_scaling"], (int, float)) or not options["routed_scaling"] > 0:
        raise ConfigError(f"LLaMA: moe.routed_scaling must be a positive number, got {options['routed_scaling']!r}")
    if options["ffn"] is None:
        del options["ffn"]
    return {"experts": experts, "top_k": experts_per_token, **options,
            "capacity": expert_capacity(seq, experts, experts_per_token, capacity_factor)}, dense


def _check_shape(hidden: int, heads: int, kv_heads: int, epsilon, rope_theta, head_size: int | None = None) -> None:
    if head_size is None and (hidden % heads or (hidden // heads) % 2):
        raise ConfigError(f"LLaMA: hidden must be heads times an even head size, got hidden {hidden} and heads {heads}")
    if head_size is not None and head_size % 2:
        raise ConfigError(f"LLaMA: attention.head_size must be even (rotary pairs), got {head_size}")
    if heads % kv_heads:
        raise ConfigError(f"LLaMA: heads must be a multiple of kv_heads, got heads {heads} and kv_heads {kv_heads}")
    for key, value in (("epsilon", epsilon), ("rope_theta", rope_theta)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise ConfigError(f"LLaMA: {key} must be a positive number, got {value!r}")


def llama_megatron_seeds(layers: int, model_parallel: int, data_parallel: int = 1) -> dict[str, tuple]:
    """Megatron-LM's tensor parallelism for LLaMA blocks as seeds: Q, K, V, the gate and up
    projections split by columns, the output projection and the down projection by rows
    (`models.megatron_seeds`' layout). K and V split their kv heads, so `model_parallel` must
    divide ``kv_heads`` (as Megatron requires).

    Example:
        >>> llama_megatron_seeds(1, 4)["blocks.0.ffn_down.matmul"]
        (((1, 4), (1, 4)), None)
    """
    dp, mp = data_parallel, model_parallel
    column, row = ((dp, 1), (mp, 1)), ((dp, mp), (1, mp))
    per_layer = {"attention.query.matmul": column, "attention.key.matmul": column, "attention.value.matmul": column,
                 "attention.projection.matmul": row, "ffn_gate.matmul": column, "ffn_up.matmul": column, "ffn_down.matmul": row}
    return {f"blocks.{i}.{op}": (strategy, None) for i in range(layers) for op, strategy in per_layer.items()}
