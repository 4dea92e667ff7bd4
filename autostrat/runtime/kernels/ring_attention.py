"""Kernels of ring attention: fused attention whose keys and values are held split like the
query rows (`layout.Strategy.ring`), their blocks passed around the ring of devices holding the
other rows, each block merged with the running softmax as it arrives.

A kernel takes the rank's slices and a `ring` (`runtime.ring.Ring`: the rank's `position` among
`size` members, members ordered by the block of the sequence they hold, and ``pass_on(arrays)``,
which sends them to the next member and returns the previous member's). Member p holds key
block p, whose first key is number ``p · block``. What each kernel passes on, per member, for
a ring of g members:

- forward: K and V, g-1 times, merging (m, l, o) as `kernels.attention` does;
- query gradient: K and V, g-1 times, in one pass. With e = exp(score - m) over the keys seen,
  it keeps l = Σe, O = Σe·V, B = Σe·K and A = Σ(e ∘ dP)·K (dP = dy·Vᵀ), every sum rescaled to
  the running max; then D = rowsum(dy ∘ O/l) and dQ = scale · (A - D·B) / l, which is
  scale · Σ P ∘ (dP - D) · K written with sums a single pass can keep;
- key and value gradient: K and V, g-1 times, for each row's m, l and D first; then K, V and
  the running dK and dV of each block g-1 times, every member adding its rows' share; then the
  finished dK and dV once more, to the member owning the block.
"""

from __future__ import annotations

import numpy as np

from autostrat.runtime.kernels.attention import _finite, _scores, merge_partial_attention, partial_attention


def _around(ring, blocks: tuple):
    """(owner, blocks) of every member, this rank's first, then as they arrive from the left."""
    for step in range(ring.size):
        if step:
            blocks = ring.pass_on(blocks)
        yield (ring.position - step) % ring.size, blocks


def _statistics(query, key, value, ring, scale, causal, query_offset):
    """Every row's (m, l, o) over the keys of all members (o unnormalised)."""
    total = None
    for owner, (k, v) in _around(ring, (key, value)):
        part = partial_attention(query, k, v, scale, causal, query_offset, owner * key.shape[2])
        total = part if total is None else merge_partial_attention(total, part)
    return total


def ring_attention(query, key, value, ring, scale_value=1.0, sparse_mode=0, query_offset=0):
    """softmax attention of the rank's query rows over the keys of every member of `ring`.

    Example (one member: plain blockwise attention):
        >>> from autostrat.runtime.kernels.attention import blockwise_attention
        >>> class Alone: position, size = 0, 1
        >>> q = np.random.default_rng(0).standard_normal((1, 1, 3, 2))
        >>> bool(np.allclose(ring_attention(q, q, q, Alone(), 0.5, 2), blockwise_attention(q, q, q, 0.5, True)))
        True
    """
    _, row_sum, out = _statistics(query, key, value, ring, scale_value, sparse_mode == 2, query_offset)
    return (out / row_sum).astype(query.dtype)


def _rescaled(first, second):
    """Two running sums (m, l, ...) over disjoint keys as one, every sum rescaled to the larger max."""
    row_max = np.maximum(first[0], second[0])
    scale1, scale2 = np.exp(first[0] - _finite(row_max)), np.exp(second[0] - _finite(row_max))
    return (row_max,) + tuple(a * scale1 + b * scale2 for a, b in zip(first[1:], second[1:]))


def ring_query_grad(query, key, value, dy, ring, scale_value=1.0, sparse_mode=0, query_offset=0):
    """dquery of the rank's rows, in one pass of the key and value blocks (module docstring)."""
    total = None
    for owner, (k, v) in _around(ring, (key, value)):
        scores = _scores(query, k, scale_value, sparse_mode == 2, query_offset, owner * key.shape[2])
        row_max = scores.max(axis=-1, keepdims=True)
        weights = np.exp(scores - _finite(row_max))
        dprobabilities = np.einsum("bnsd,bntd->bnst", dy, v)
        part = (row_max, weights.sum(axis=-1, keepdims=True), np.einsum("bnst,bntd->bnsd", weights, v),
                np.einsum("bnst,bntd->bnsd", weights, k), np.einsum("bnst,bntd->bnsd", weights * dprobabilities, k))
        total = part if total is None else _rescaled(total, part)
    _, row_sum, out, keys, weighted = total
    rowdot = (dy * out / row_sum).sum(axis=-1, keepdims=True)
    return (scale_value * (weighted - rowdot * keys) / row_sum).astype(query.dtype)


def ring_key_value_grad(query, key, value, dy, ring, scale_value=1.0, sparse_mode=0, query_offset=0):
    """dkey and dvalue of the rank's key block, every member's rows added along the ring."""
    causal = sparse_mode == 2
    row_max, row_sum, out = _statistics(query, key, value, ring, scale_value, causal, query_offset)
    rowdot = (dy * out / row_sum).sum(axis=-1, keepdims=True)
    blocks = (key, value, np.zeros(key.shape, np.result_type(key, query)), np.zeros(value.shape, np.result_type(value, dy)))
    for step in range(ring.size):  # not `_around`: the running sums change on the way
        if step:
            blocks = ring.pass_on(blocks)
        k, v, dkey, dvalue = blocks
        scores = _scores(query, k, scale_value, causal, query_offset, (ring.position - step) % ring.size * key.shape[2])
        probabilities = np.exp(scores - _finite(row_max)) / row_sum
        dscores = probabilities * (np.einsum("bnsd,bntd->bnst", dy, v) - rowdot) * scale_value
        blocks = (k, v, dkey + np.einsum("bnst,bnsd->bntd", dscores, query), dvalue + np.einsum("bnst,bnsd->bntd", probabilities, dy))
    dkey, dvalue = blocks[2:] if ring.size == 1 else ring.pass_on(blocks[2:])  # home to the block's owner
    return dkey.astype(key.dtype), dvalue.astype(value.dtype)


RING_KERNELS = {"FlashAttentionScore": ring_attention, "FlashAttentionScoreKeyValueGrad": ring_key_value_grad,
                "FlashAttentionScoreQueryGrad": ring_query_grad}
