"""Kernels of the backward ops (rules in `autostrat.rules.grad`)."""

from __future__ import annotations

import math

import numpy as np

from autostrat.rules.common import normalize_axes
from autostrat.rules.nn import conv2d_geometry
from autostrat.runtime.kernels.nn import conv2d_windows, rotate_half
from autostrat.runtime.kernels.registry import kernel
from autostrat.runtime.kernels import special


@kernel("ReluGrad")
def relu_grad(dy, y):
    return np.where(y > 0, dy, 0).astype(dy.dtype)


@kernel("DropoutGrad")
def dropout_grad(dy, mask, keep_prob=0.5):
    return np.where(mask, dy / keep_prob, 0).astype(dy.dtype)


@kernel("GeLUGrad")
def gelu_grad(dy, x):
    cdf = 0.5 * (1 + special.erf(x / math.sqrt(2)))
    pdf = np.exp(-0.5 * x * x) / math.sqrt(2 * math.pi)
    return (dy * (cdf + x * pdf)).astype(dy.dtype)


@kernel("SiLUGrad")
def silu_grad(dy, x):
    sigmoid = special.expit(x)
    return (dy * sigmoid * (1 + x * (1 - sigmoid))).astype(dy.dtype)


@kernel("SigmoidGrad")
def sigmoid_grad(y, dy):
    return dy * y * (1 - y)


@kernel("TanhGrad")
def tanh_grad(y, dy):
    return dy * (1 - y * y)


@kernel("SqrtGrad")
def sqrt_grad(y, dy):
    return dy / (2 * y)


def _select(mask, dy):
    mask = np.broadcast_to(mask, dy.shape)
    return np.where(mask, dy, 0).astype(dy.dtype), np.where(mask, 0, dy).astype(dy.dtype)


@kernel("MaximumGrad")
def maximum_grad(x, y, dy):
    # Ties go to x, as MindSpore's MaximumGrad does.
    return _select(x >= y, dy)


@kernel("MinimumGrad")
def minimum_grad(x, y, dy):
    return _select(x <= y, dy)


@kernel("SoftmaxGrad")
def softmax_grad(y, dy, axis=-1):
    axes = normalize_axes(axis, y.ndim, "SoftmaxGrad")
    return y * (dy - np.sum(dy * y, axis=axes, keepdims=True))


@kernel("LogSoftmaxGrad")
def log_softmax_grad(y, dy, axis=-1):
    axes = normalize_axes(axis, y.ndim, "LogSoftmaxGrad")
    return dy - np.exp(y) * np.sum(dy, axis=axes, keepdims=True)


@kernel("ReduceMaxGrad")
def reduce_max_grad(x, y, dy, axis=(), keep_dims=False):
    axes = normalize_axes(axis, x.ndim, "ReduceMaxGrad")
    if not keep_dims:
        y, dy = np.expand_dims(y, axes), np.expand_dims(dy, axes)
    return np.where(x == y, dy, 0).astype(dy.dtype)


@kernel("LayerNormGrad")
def layer_norm_grad(x, dy, gamma, begin_norm_axis=-1, begin_params_axis=-1, epsilon=1e-7):
    axes = tuple(range(normalize_axes(begin_norm_axis, x.ndim, "LayerNormGrad")[0], x.ndim))
    mean = x.mean(axis=axes, keepdims=True)
    inverse = 1 / np.sqrt(((x - mean) ** 2).mean(axis=axes, keepdims=True) + epsilon)
    x_hat = (x - mean) * inverse
    scaled = dy * gamma
    # d x_hat / dx removes the mean and the component along x_hat, then scales by 1/sigma.
    dx = inverse * (scaled - scaled.mean(axis=axes, keepdims=True) - x_hat * (scaled * x_hat).mean(axis=axes, keepdims=True))
    return dx.astype(x.dtype), (dy * x_hat).astype(x.dtype)


@kernel("RmsNormGrad")
def rms_norm_grad(dy, x, gamma, epsilon=1e-6):
    axes = tuple(range(x.ndim - gamma.ndim, x.ndim))
    rstd = 1 / np.sqrt((x * x).mean(axis=axes, keepdims=True) + epsilon)
    x_hat = x * rstd
    scaled = dy * gamma
    # d x_hat / dx scales by rstd and removes the component along x_hat (no mean to remove).
    dx = rstd * (scaled - x_hat * (scaled * x_hat).mean(axis=axes, keepdims=True))
    return dx.astype(x.dtype), (dy * x_hat).astype(x.dtype)


@kernel("RotaryPositionEmbeddingGrad")
def rotary_position_embedding_grad(dy, cos, sin, mode=0):
    # rotate_half is a rotation by 90 degrees: its transpose is minus itself.
    return (dy * cos - rotate_half(dy * sin)).astype(dy.dtype)


@kernel("SoftmaxCrossEntropyWithLogitsGrad")
def softmax_cross_entropy_grad(logits, labels, dloss):
    # Labels need not sum to one (any distribution-like tensor): keep their sum.
    probabilities = special.softmax(logits, axis=-1) * labels.sum(axis=-1, keepdims=True)
    return ((probabilities - labels) * dloss[..., None]).astype(logits.dtype)


@kernel("GatherGrad")
def gather_grad(dy, indices, axis=0, size=1, context=None):
    # A rank holding rows [low, high) of the result adds only the indices that fall there.
    indices = np.asarray(indices)
    axis = normalize_axes(axis, dy.ndim - indices.ndim + 1, "GatherGrad")[0]
    low, high = (0, size) if context is None else context.output_ranges[0][axis]
    rows = dy.reshape(dy.shape[:axis] + (indices.size,) + dy.shape[axis + indices.ndim:])
    local = indices.ravel() - low
    held = (local >= 0) & (local < high - low)
    result = np.zeros(dy.shape[:axis] + (high - low,) + dy.shape[axis + indices.ndim:], dy.dtype)
    lead = (slice(None),) * axis
    np.add.at(result, lead + (local[held],), rows[lead + (held,)])
    return result


@kernel("Conv2DBackpropFilter")
def conv2d_backprop_filter(dy, x, filter_shape=(), pad_mode="valid", pad=0, stride=1, dilation=1):
    geometry = conv2d_geometry(x.shape, filter_shape, pad_mode, pad, stride, dilation)
    return np.einsum("nchwij,nohw->ocij", conv2d_windows(x, filter_shape, geometry), dy).astype(dy.dtype)


@kernel("Conv2DBackpropInput")
def conv2d_backprop_input(dy, w, input_shape=(), pad_mode="valid", pad=0, stride=1, dilation=1, context=None):
    # Every kernel tap (i, j) scatters dy back onto the input positions it read.
    shape = tuple(input_shape) if context is None else context.output_local_shape(0)
    geometry = conv2d_geometry(tuple(input_shape), w.shape, pad_mode, pad, stride, dilation)
    top, bottom, left, right = geometry.pads
    (dh, dw), (sh, sw), (oh, ow) = geometry.dilation, geometry.stride, geometry.out_hw
    padded = np.zeros(shape[:2] + (shape[2] + top + bottom, shape[3] + left + right), dy.dtype)
    for i in range(w.shape[2]):
        for j in range(w.shape[3]):
            rows, columns = slice(i * dh, i * dh + (oh - 1) * sh + 1, sh), slice(j * dw, j * dw + (ow - 1) * sw + 1, sw)
            padded[:, :, rows, columns] += np.einsum("nohw,oc->nchw", dy, w[:, :, i, j])
    return padded[:, :, top : top + shape[2], left : left + shape[3]]
