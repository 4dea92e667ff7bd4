"""Kernels of the reductions and the softmax family."""

from __future__ import annotations

import math

import numpy as np

from autostrat.rules.common import normalize_axes
from autostrat.runtime.kernels.registry import kernel
from autostrat.runtime.kernels import special


def _axes(x, axis) -> tuple[int, ...]:
    return normalize_axes(axis, x.ndim, "reduce")


@kernel("ReduceSum")
def reduce_sum(x, axis=(), keep_dims=False):
    return np.sum(x, axis=_axes(x, axis), keepdims=keep_dims)


@kernel("ReduceMax")
def reduce_max(x, axis=(), keep_dims=False):
    return np.max(x, axis=_axes(x, axis), keepdims=keep_dims)


@kernel("ReduceMean")
def reduce_mean(x, axis=(), keep_dims=False, context=None):
    # On a split reduced dim each rank divides by the global count, so the ranks' results
    # sum to the mean.
    axes = _axes(x, axis)
    shape = x.shape if context is None else context.input_shapes[0]
    count = math.prod(shape[a] for a in axes)
    return (np.sum(x, axis=axes, keepdims=keep_dims) / count).astype(x.dtype)


@kernel("Softmax")
def softmax(x, axis=-1):
    return special.softmax(x, axis=axis).astype(x.dtype)


@kernel("LogSoftmax")
def log_softmax(x, axis=-1):
    return special.log_softmax(x, axis=axis).astype(x.dtype)
