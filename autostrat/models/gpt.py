"""A GPT-style decoder: embeddings, pre-LayerNorm blocks of causal multi-head attention and a
GeLU FFN with residuals, a final LayerNorm, an LM head and the cross-entropy loss.

Activations stay 2-D ``[batch * seq, hidden]`` between blocks; heads are formed with
Reshape + Transpose around two BatchMatMuls, so every op is one the search knows. Shapes follow
the inputs' batch (a pipeline traces one micro-batch); ``batch`` only sizes `example_inputs`.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from autostrat import ops
from autostrat.errors import ConfigError
from autostrat.frontend.cell import Cell, CellList
from autostrat.frontend.layers import GELU, Dense, Embedding, LayerNorm, MSELoss, SoftmaxCrossEntropyWithLogits
from autostrat.frontend.tensor import LazyTensor, Parameter, Tensor, initializer
from autostrat.models.sizes import check_sizes


@functools.cache
def causal_mask(seq: int) -> np.ndarray:
    """The additive causal mask of `seq` positions (-1e9 above the diagonal), one read-only array
    shared by every layer: at seq 2048 each copy is 16 MB, 1.5 GB over GPT-3's 96 layers.

    Example:
        >>> causal_mask(3).tolist()[0]
        [0.0, -1000000000.0, -1000000000.0]
    """
    mask = np.triu(np.full((seq, seq), -1e9, np.float32), k=1)
    mask.setflags(write=False)
    return mask


@functools.cache
def causal_mask_tensor(seq: int) -> LazyTensor:
    """`causal_mask` as the one constant every attention of `seq` positions reads, so that a
    trace holds one mask, as Megatron builds one a batch, not one a layer (48 copies, 0.75
    GiB a device, on the 22B GPT).

    Example:
        >>> causal_mask_tensor(8) is causal_mask_tensor(8), causal_mask_tensor(8).shape
        (True, (8, 8))
    """
    return LazyTensor(functools.partial(causal_mask, seq), (seq, seq))  # made only for a run


def make_dropout(drop: float, seed: int):
    """The Dropout primitive dropping with probability `drop` (its output and mask: `ops.Dropout`),
    or None at 0, where a model builds no op.

    Example:
        >>> make_dropout(0.1, 4), make_dropout(0.0, 4)
        (Dropout(keep_prob=0.9, seed=4), None)
    """
    return ops.Dropout(1 - drop, seed) if drop else None


class Attention(Cell):
    def __init__(self, seq: int, hidden: int, heads: int, attention_dropout: float = 0.0, seed: int = 0):
        super().__init__()
        self.seq, self.heads, self.head_size = seq, heads, hidden // heads
        self.query, self.key, self.value = Dense(hidden, hidden), Dense(hidden, hidden), Dense(hidden, hidden)
        self.split_heads, self.to_heads = ops.Reshape(), ops.Transpose()
        self.scores = ops.BatchMatMul(transpose_b=True)
        self.scale = ops.Mul()
        self.mask = ops.Add()
        self.softmax = ops.Softmax()
        self.probs_dropout = make_dropout(attention_dropout, seed)  # on the attention probabilities (GPT-2's attn_dropout)
        self.context = ops.BatchMatMul()
        self.from_heads, self.merge_heads = ops.Transpose(), ops.Reshape()
        self.projection = Dense(hidden, hidden)
        self.causal_mask = causal_mask_tensor(seq)
        self.scale_factor = Tensor(np.float32(1 / math.sqrt(self.head_size)))

    def heads_of(self, x):
        # The batch follows the input (a pipeline traces micro-batches), not the constructor's.
        x = self.split_heads(x, (x.shape[0] // self.seq, self.seq, self.heads, self.head_size))
        return self.to_heads(x, (0, 2, 1, 3))

    def construct(self, x):
        q, k, v = self.heads_of(self.query(x)), self.heads_of(self.key(x)), self.heads_of(self.value(x))
        scores = self.mask(self.scale(self.scores(q, k), self.scale_factor), self.causal_mask)
        probs = self.softmax(scores)
        context = self.context(dropped(self.probs_dropout, probs), v)
        context = self.from_heads(context, (0, 2, 1, 3))
        context = self.merge_heads(context, (context.shape[0] * self.seq, self.heads * self.head_size))
        return self.projection(context)


class Block(Cell):
    """Pre-LayerNorm attention and FFN with residuals; with `dropouts` (``(attention, hidden)``
    probabilities, GPT-2's attn_pdrop and resid_pdrop) a Dropout on the attention probabilities,
    after the attention's projection and after the FFN, as GPT-2 and Megatron-LM place them, each
    seeded ``seed + 0, 1, 2``."""

    def __init__(self, seq: int, hidden: int, heads: int, epsilon: float = 1e-7, dropouts: tuple = (0.0, 0.0), seed: int = 0):
        super().__init__()
        self.ln1 = LayerNorm((hidden,), epsilon=epsilon)
        self.attention = Attention(seq, hidden, heads, dropouts[0], seed)
        self.dropout1 = make_dropout(dropouts[1], seed + 1)
        self.residual1 = ops.Add()
        self.ln2 = LayerNorm((hidden,), epsilon=epsilon)
        self.ffn1 = Dense(hidden, 4 * hidden, activation=GELU())
        self.ffn2 = Dense(4 * hidden, hidden)
        self.dropout2 = make_dropout(dropouts[1], seed + 2)
        self.residual2 = ops.Add()

    def construct(self, x):
        x = self.residual1(x, dropped(self.dropout1, self.attention(self.ln1(x))))
        return self.residual2(x, dropped(self.dropout2, self.ffn2(self.ffn1(self.ln2(x)))))


def dropped(primitive, x):
    """`x` through the Dropout `primitive` (its output, not its mask), or `x` where there is none."""
    return x if primitive is None else primitive(x)[0]


class LanguageModel(Cell):
    """What GPT and LLaMA share after their blocks: the final norm (`ln_final`), the LM head
    (`lm_head`, tied to `embedding`'s table when `tie_embeddings`) and the loss (`loss`), and
    token ids and labels as example inputs (`batch`, `seq`)."""

    def head_loss(self, x, labels):
        """The mean loss of the blocks' output `x` ``[batch * seq, hidden]`` against `labels`."""
        x = self.ln_final(x)
        logits = self.lm_head(x, self.embedding.embedding_table) if self.tie_embeddings else self.lm_head(x)
        return self.loss(logits, labels)

    def example_inputs(self, with_data: bool = False, seed: int = 0) -> tuple[Tensor, Tensor]:
        """Ids and labels: random data, or shape-only tensors for a search."""
        vocab = self.embedding.embedding_table.shape[0]
        shapes = ((self.batch, self.seq), (self.batch * self.seq,))
        if not with_data:
            return tuple(Tensor(shape=s, dtype="int32") for s in shapes)
        rng = np.random.default_rng(seed)
        return tuple(Tensor(rng.integers(0, vocab, size=s).astype(np.int32)) for s in shapes)


class GPT(LanguageModel):
    """Inputs: token ids ``[batch, seq]`` and next-token labels ``[batch * seq]``; output: the
    mean loss. `epsilon` is the LayerNorms'; `tie_embeddings` makes the LM head the embedding
    table's transpose (GPT-2's, Megatron's default); `dropout` the probabilities ``(attention,
    hidden, embedding)`` of GPT-2's attn_pdrop, resid_pdrop and embd_pdrop (`Block`; the embedding's
    after the positions are added), none by default. Block ``i``'s Dropouts are seeded ``3 i + 1``
    to ``3 i + 3``, the embedding's 0, so no two draw the same mask.

    Example:
        >>> net = GPT(layers=1, hidden=32, heads=4, seq=8, batch=2, vocab=64)
        >>> type(net.blocks[0].attention.query.matmul).__name__
        'MatMul'
    """

    def __init__(self, layers: int = 2, hidden: int = 64, heads: int = 4, seq: int = 16, batch: int = 4, vocab: int = 128,
                 epsilon: float = 1e-7, tie_embeddings: bool = False, dropout: tuple = (0.0, 0.0, 0.0)):
        super().__init__()
        dropout = checked_dropout("GPT", dropout)
        check_sizes("GPT", layers=layers, hidden=hidden, heads=heads, seq=seq, batch=batch, vocab=vocab)
        if hidden % heads:
            raise ConfigError(f"GPT: hidden must be a multiple of heads, got hidden {hidden} and heads {heads}")
        self.batch, self.seq, self.hidden, self.tie_embeddings = batch, seq, hidden, bool(tie_embeddings)
        self.embedding = Embedding(vocab, hidden)
        self.position = Parameter(initializer("normal", (seq, hidden)))
        self.add_position = ops.Add()
        self.embedding_dropout = make_dropout(dropout[2], 0)
        self.flatten = ops.Reshape()
        self.blocks = CellList(Block(seq, hidden, heads, epsilon, dropout[:2], 3 * i + 1) for i in range(layers))
        self.ln_final = LayerNorm((hidden,), epsilon=epsilon)
        self.lm_head = ops.MatMul(transpose_b=True) if self.tie_embeddings else Dense(hidden, vocab, has_bias=False)
        self.loss = SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")

    def construct(self, ids, labels):
        x = dropped(self.embedding_dropout, self.add_position(self.embedding(ids), self.position))
        x = self.flatten(x, (ids.shape[0] * self.seq, self.hidden))
        for block in self.blocks:
            x = block(x)
        return self.head_loss(x, labels)


def is_probability(value) -> bool:
    """Whether `value` is a dropout probability: a number in [0, 1) (1 would drop everything).

    Example:
        >>> is_probability(0), is_probability(0.1), is_probability(1.0), is_probability(True)
        (True, True, False, False)
    """
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value < 1


def checked_dropout(where: str, probabilities) -> tuple:
    """`probabilities` as a tuple (a YAML list too), or a ConfigError at `where` unless they are
    three numbers in [0, 1).

    Example:
        >>> checked_dropout("GPT", [0.1, 0.0, 0.1])
        (0.1, 0.0, 0.1)
    """
    if not isinstance(probabilities, (tuple, list)) or len(probabilities) != 3 or not all(map(is_probability, probabilities)):
        raise ConfigError(f"{where}: dropout must be a tuple of 3 probabilities in [0, 1) (attention, hidden, embedding), got {probabilities!r}")
    return tuple(probabilities)


class TransformerStack(Cell):
    """`layers` GPT blocks on activations ``[batch * seq, hidden]`` with a mean-squared-error loss
    against targets of the same shape: the stack alone, without embeddings or an LM head (the
    model issue #15 compares with MindSpore and JAX).

    Example:
        >>> net = TransformerStack(layers=2, hidden=32, heads=4, seq=8, batch=2)
        >>> [tuple(t.shape) for t in net.example_inputs()]
        [(16, 32), (16, 32)]
    """

    def __init__(self, layers: int = 2, hidden: int = 64, heads: int = 4, seq: int = 16, batch: int = 4):
        super().__init__()
        check_sizes("TransformerStack", layers=layers, hidden=hidden, heads=heads, seq=seq, batch=batch)
        if hidden % heads:
            raise ConfigError(f"TransformerStack: hidden must be a multiple of heads, got hidden {hidden} and heads {heads}")
        self.batch, self.seq, self.hidden = batch, seq, hidden
        self.blocks = CellList(Block(seq, hidden, heads) for _ in range(layers))
        self.loss = MSELoss()

    def construct(self, x, targets):
        for block in self.blocks:
            x = block(x)
        return self.loss(x, targets)

    def example_inputs(self, with_data: bool = False, seed: int = 0) -> tuple[Tensor, Tensor]:
        """Activations and targets: random data, or shape-only tensors for a search."""
        shape = (self.batch * self.seq, self.hidden)
        if not with_data:
            return Tensor(shape=shape), Tensor(shape=shape)
        rng = np.random.default_rng(seed)
        return tuple(Tensor(rng.standard_normal(shape).astype(np.float32)) for _ in range(2))


def megatron_seeds(layers: int, model_parallel: int, first_layer_only: bool = False, data_parallel: int = 1) -> dict[str, tuple]:
    """Megatron-LM's tensor parallelism as seeds: Q, K, V and FFN1 split by columns, the
    attention output projection and FFN2 split by rows (their partial sums are resolved after);
    with `data_parallel` > 1 the rows of the activations are split that many ways as well.
    Megatron needs the head count divisible by `model_parallel`. A Dense weight is
    ``[out, in]`` (MatMul with transpose_b), so a column split cuts its dim 0, a row split its dim 1.

    Example:
        >>> megatron_seeds(1, 8)["blocks.0.ffn2.matmul"]
        (((1, 8), (1, 8)), None)
        >>> megatron_seeds(1, 8, data_parallel=8)["blocks.0.ffn1.matmul"]
        (((8, 1), (8, 1)), None)
    """
    dp, mp = data_parallel, model_parallel
    column, row = ((dp, 1), (mp, 1)), ((dp, mp), (1, mp))
    per_layer = {
        "attention.query.matmul": column,
        "attention.key.matmul": column,
        "attention.value.matmul": column,
        "attention.projection.matmul": row,
        "ffn1.matmul": column,
        "ffn2.matmul": row,
    }
    count = 1 if first_layer_only else layers
    return {f"blocks.{i}.{op}": (strategy, None) for i in range(count) for op, strategy in per_layer.items()}
