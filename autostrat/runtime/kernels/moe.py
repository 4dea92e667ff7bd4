"""Kernels of the mixture-of-experts routing (`rules.moe`): the dispatch mask, the combine
weights and their gradient, from one routing of the logits."""

from __future__ import annotations

import numpy as np

from autostrat.runtime.kernels import special
from autostrat.runtime.kernels.registry import kernel


def _scores(logits, gate: str):
    return special.softmax(logits, axis=-1) if gate == "softmax" else special.expit(logits)


def route(logits, top_k: int, capacity: int, gate: str, norm_topk_prob: bool):
    """(choices [g, s, top_k], weights [g, s, top_k], mask [g, s, e, c]) of router `logits`:
    the experts by falling gate (ties to the lower expert), their weights, and the buffer slots,
    filled choice by choice in token order (GShard's priority), beyond `capacity` dropped.

    Example:
        >>> choices, weights, mask = route(np.array([[[2.0, 1.0], [3.0, 0.0]]]), 1, 1, "softmax", False)
        >>> choices[..., 0].tolist(), mask[0, :, 0, 0].tolist()
        ([[0, 0]], [1.0, 0.0])
    """
    scores = _scores(np.asarray(logits, np.float64), gate)
    choices = np.argsort(-scores, axis=-1, kind="stable")[..., :top_k]
    weights = np.take_along_axis(scores, choices, axis=-1)
    if norm_topk_prob:
        weights = weights / weights.sum(axis=-1, keepdims=True)
    groups, tokens, experts = scores.shape
    mask = np.zeros((groups, tokens, experts, capacity))
    filled = np.zeros((groups, 1, experts), dtype=np.int64)
    for rank in range(top_k):
        hot = choices[..., rank, None] == np.arange(experts)
        position = np.cumsum(hot, axis=1) - 1 + filled
        filled = filled + hot.sum(axis=1, keepdims=True)
        group, token, expert = np.nonzero(hot & (position < capacity))
        mask[group, token, expert, position[group, token, expert]] = 1
    return choices, weights, mask


def _dense(values, choices, experts: int):
    """[g, s, top_k] values placed at their experts: [g, s, e]."""
    out = np.zeros(choices.shape[:2] + (experts,))
    np.put_along_axis(out, choices, values, axis=-1)
    return out


@kernel("MoeDispatchMask")
def moe_dispatch_mask(logits, top_k=2, capacity=1, gate="softmax", norm_topk_prob=False):
    return route(logits, top_k, capacity, gate, norm_topk_prob)[2].astype(logits.dtype)


@kernel("MoeCombineWeights")
def moe_combine_weights(logits, top_k=2, capacity=1, gate="softmax", norm_topk_prob=False):
    choices, weights, mask = route(logits, top_k, capacity, gate, norm_topk_prob)
    return (mask * _dense(weights, choices, logits.shape[-1])[..., None]).astype(logits.dtype)


@kernel("MoeCombineWeightsGrad")
def moe_combine_weights_grad(logits, dcombine, top_k=2, capacity=1, gate="softmax", norm_topk_prob=False):
    # Back through combine = mask * weight: dweight sums dcombine over the kept slots (a dropped
    # choice gets none), then through the top-k normalisation and the gate.
    choices, weights, mask = route(logits, top_k, capacity, gate, norm_topk_prob)
    dchosen = np.take_along_axis((dcombine * mask).sum(axis=-1), choices, axis=-1)
    scores = _scores(np.asarray(logits, np.float64), gate)
    if norm_topk_prob:
        total = np.take_along_axis(scores, choices, axis=-1).sum(axis=-1, keepdims=True)
        dchosen = (dchosen - (weights * dchosen).sum(axis=-1, keepdims=True)) / total
    dscores = _dense(dchosen, choices, logits.shape[-1])
    if gate == "softmax":
        dlogits = scores * (dscores - (scores * dscores).sum(axis=-1, keepdims=True))
    else:
        dlogits = scores * (1 - scores) * dscores
    return dlogits.astype(logits.dtype)
