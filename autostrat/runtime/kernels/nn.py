"""Kernels of the neural-network ops."""

from __future__ import annotations

import numpy as np

from autostrat.rules.common import normalize_axes
from autostrat.rules.nn import conv2d_geometry
from autostrat.runtime.kernels.registry import kernel
from autostrat.runtime.kernels import special


@kernel("LayerNorm")
def layer_norm(x, gamma, beta, begin_norm_axis=-1, begin_params_axis=-1, epsilon=1e-7):
    axes = tuple(range(normalize_axes(begin_norm_axis, x.ndim, "LayerNorm")[0], x.ndim))
    mean = x.mean(axis=axes, keepdims=True)
    variance = ((x - mean) ** 2).mean(axis=axes, keepdims=True)
    return ((x - mean) / np.sqrt(variance + epsilon) * gamma + beta).astype(x.dtype)


@kernel("RmsNorm")
def rms_norm(x, gamma, epsilon=1e-6):
    axes = tuple(range(x.ndim - gamma.ndim, x.ndim))
    return (x / np.sqrt((x * x).mean(axis=axes, keepdims=True) + epsilon) * gamma).astype(x.dtype)


def rotate_half(x):
    """``cat(-x2, x1)`` of the halves x1, x2 of the last dim (RoPE's rotation by 90 degrees)."""
    first, second = np.split(x, 2, axis=-1)
    return np.concatenate([-second, first], axis=-1)


@kernel("RotaryPositionEmbedding")
def rotary_position_embedding(x, cos, sin, mode=0):
    return (x * cos + rotate_half(x) * sin).astype(x.dtype)


@kernel("Gather")
def gather(params, indices, axis=0, context=None):
    # A rank holding rows [offset, offset + n) of the gathered dim looks those up and writes
    # zeros for the others; summing over the ranks gives the full lookup.
    axis = normalize_axes(axis, params.ndim, "Gather")[0]
    offset = 0 if context is None else context.input_offset(0, axis)
    local = np.asarray(indices) - offset
    held = (local >= 0) & (local < params.shape[axis])
    out = np.take(params, np.where(held, local, 0), axis=axis)
    mask = held.reshape((1,) * axis + held.shape + (1,) * (params.ndim - axis - 1))
    return np.where(mask, out, 0).astype(params.dtype)


@kernel("OneHot")
def one_hot(indices, depth=2, on_value=1.0, off_value=0.0, axis=-1, context=None):
    axis = normalize_axes(axis, np.ndim(indices) + 1, "OneHot")[0]
    low, high = (0, depth) if context is None else context.output_ranges[0][axis]
    columns = np.arange(low, high).reshape((1,) * axis + (-1,) + (1,) * (np.ndim(indices) - axis))
    hot = np.expand_dims(indices, axis) == columns
    return np.where(hot, on_value, off_value).astype(np.float32)


@kernel("SoftmaxCrossEntropyWithLogits")
def softmax_cross_entropy(logits, labels):
    return -(labels * special.log_softmax(logits, axis=-1)).sum(axis=-1).astype(logits.dtype)


def conv2d_windows(x, w_shape, geometry):
    """The input patch under every output position: [n, c, oh, ow, kh, kw] (a strided view)."""
    top, bottom, left, right = geometry.pads
    padded = np.pad(x, ((0, 0), (0, 0), (top, bottom), (left, right)))
    (dh, dw), (sh, sw), (oh, ow) = geometry.dilation, geometry.stride, geometry.out_hw
    span = (dh * (w_shape[2] - 1) + 1, dw * (w_shape[3] - 1) + 1)
    windows = np.lib.stride_tricks.sliding_window_view(padded, span, axis=(2, 3))
    return windows[:, :, : (oh - 1) * sh + 1 : sh, : (ow - 1) * sw + 1 : sw, ::dh, ::dw]


@kernel("Conv2D")
def conv2d(x, w, out_channel=None, kernel_size=None, pad_mode="valid", pad=0, stride=1, dilation=1, group=1, data_format="NCHW"):
    geometry = conv2d_geometry(x.shape, w.shape, pad_mode, pad, stride, dilation)
    return np.einsum("nchwij,ocij->nohw", conv2d_windows(x, w.shape, geometry), w).astype(x.dtype)
