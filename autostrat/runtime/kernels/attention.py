"""Kernels of fused attention: blockwise over key blocks with the running-softmax merge.

A block of keys gives each query row a partial result (m, l, o): the row's largest score m, the
sum l of exp(score - m) and the unnormalised output o = sum exp(score - m) * value. Two partial
results over disjoint keys merge exactly (`merge_partial_attention`) by rescaling both to the
larger max; o / l over all keys is softmax attention. FlashAttention merges key blocks this way
on one device; ring attention merges the blocks that arrive from other ranks.
"""

from __future__ import annotations

import numpy as np

from autostrat.runtime.kernels.registry import kernel

KEY_BLOCK = 128  # keys per block: bounds the score block held at once to [b, n, s, KEY_BLOCK]


def partial_attention(query, key, value, scale, causal=False, query_offset=0, key_offset=0):
    """The partial result (m, l, o) of query rows against one block of keys.

    Rows and keys are numbered globally from `query_offset` and `key_offset`; with `causal`,
    row i sees key j only if j <= i. A row that sees no key of the block has m = -inf, l = 0,
    o = 0, which any merge leaves without effect.

    Example:
        >>> q, k = np.zeros((1, 1, 2, 2)), np.zeros((1, 1, 3, 2))
        >>> m, l, o = partial_attention(q, k, np.ones((1, 1, 3, 2)), 1.0, causal=True)
        >>> l[..., 0].tolist(), o[..., 0].tolist()
        ([[[1.0, 2.0]]], [[[1.0, 2.0]]])
    """
    scores = _scores(query, key, scale, causal, query_offset, key_offset)
    row_max = scores.max(axis=-1, keepdims=True)
    weights = np.exp(scores - _finite(row_max))
    return row_max, weights.sum(axis=-1, keepdims=True), np.einsum("bnst,bntd->bnsd", weights, value)


def _scores(query, key, scale, causal, query_offset, key_offset):
    """query @ key^T * scale, with -inf where the causal mask hides a key."""
    scores = np.einsum("bnsd,bntd->bnst", query, key) * scale
    if not causal:
        return scores
    rows = query_offset + np.arange(query.shape[2])[:, None]
    return np.where(key_offset + np.arange(key.shape[2])[None, :] <= rows, scores, -np.inf)


def merge_partial_attention(first, second):
    """The partial result (m, l, o) over the keys of both `first` and `second` (disjoint keys).

    Example:
        >>> one = (np.array([[0.0]]), np.array([[1.0]]), np.array([[2.0]]))
        >>> other = (np.array([[np.log(3.0)]]), np.array([[1.0]]), np.array([[0.0]]))
        >>> m, l, o = merge_partial_attention(one, other)
        >>> float((o / l)[0, 0])  # weights 1 and 3: (1 * 2 + 3 * 0) / 4
        0.5
    """
    (m1, l1, o1), (m2, l2, o2) = first, second
    row_max = np.maximum(m1, m2)
    scale1, scale2 = np.exp(m1 - _finite(row_max)), np.exp(m2 - _finite(row_max))
    return row_max, l1 * scale1 + l2 * scale2, o1 * scale1 + o2 * scale2


def blockwise_attention(query, key, value, scale, causal=False, query_offset=0, block=KEY_BLOCK):
    """Softmax attention computed over key blocks of `block` keys merged one by one.

    Example:
        >>> q = np.random.default_rng(0).standard_normal((1, 1, 3, 2))
        >>> bool(np.allclose(blockwise_attention(q, q, q, 1.0, block=2), blockwise_attention(q, q, q, 1.0, block=3)))
        True
    """
    total = None
    for start in range(0, key.shape[2], block):
        part = partial_attention(query, key[:, :, start:start + block], value[:, :, start:start + block], scale, causal,
                                 query_offset, start)
        total = part if total is None else merge_partial_attention(total, part)
    _, row_sum, out = total
    return out / row_sum


def _finite(row_max):
    # A row that saw no key yet has max -inf: shift by 0 instead, so exp gives 0, not nan.
    return np.where(np.isneginf(row_max), 0.0, row_max)


def _offset(context) -> int:
    return 0 if context is None else context.input_offset(0, 2)


@kernel("FlashAttentionScore")
def flash_attention_score(query, key, value, head_num=None, keep_prob=1.0, scale_value=1.0, pre_tokens=None,
                          next_tokens=None, inner_precise=0, input_layout="BNSD", sparse_mode=0, context=None):
    out = blockwise_attention(query, key, value, scale_value, sparse_mode == 2, _offset(context))
    return out.astype(query.dtype)


def _attention_grads(query, key, value, dy, scale, causal, query_offset):
    """dquery, dkey, dvalue of the rows held (key and value whole), the attention recomputed."""
    m, l, o = partial_attention(query, key, value, scale, causal, query_offset)
    probabilities = np.exp(_scores(query, key, scale, causal, query_offset, 0) - _finite(m)) / l
    dvalue = np.einsum("bnst,bnsd->bntd", probabilities, dy)
    dprobabilities = np.einsum("bnsd,bntd->bnst", dy, value)
    # d softmax: p * (dp - sum_t p * dp), and sum_t p * dp is the row's dy . out.
    dscores = probabilities * (dprobabilities - (dy * (o / l)).sum(axis=-1, keepdims=True)) * scale
    return np.einsum("bnst,bntd->bnsd", dscores, key), np.einsum("bnst,bnsd->bntd", dscores, query), dvalue


@kernel("FlashAttentionScoreQueryGrad")
def flash_attention_score_query_grad(query, key, value, dy, head_num=None, keep_prob=1.0, scale_value=1.0,
                                     pre_tokens=None, next_tokens=None, inner_precise=0, input_layout="BNSD",
                                     sparse_mode=0, context=None):
    dquery, _, _ = _attention_grads(query, key, value, dy, scale_value, sparse_mode == 2, _offset(context))
    return dquery.astype(query.dtype)


@kernel("FlashAttentionScoreKeyValueGrad")
def flash_attention_score_key_value_grad(query, key, value, dy, head_num=None, keep_prob=1.0, scale_value=1.0,
                                         pre_tokens=None, next_tokens=None, inner_precise=0, input_layout="BNSD",
                                         sparse_mode=0, context=None):
    # Rows held elsewhere add their share: the rule makes these partial over a split query seq.
    _, dkey, dvalue = _attention_grads(query, key, value, dy, scale_value, sparse_mode == 2, _offset(context))
    return dkey.astype(key.dtype), dvalue.astype(value.dtype)
