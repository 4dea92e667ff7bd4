"""Kernels of the shape ops."""

from __future__ import annotations

import numpy as np

from autostrat.rules.common import normalize_axes
from autostrat.runtime.kernels.registry import kernel


@kernel("Reshape")
def reshape(x, shape=(), context=None):
    # A slice reshapes to its own share of the target shape, not to the global one.
    return x.reshape(tuple(shape) if context is None else context.output_local_shape(0))


@kernel("Transpose")
def transpose(x, perm=()):
    return np.transpose(x, perm)


@kernel("ExpandDims")
def expand_dims(x, axis=0):
    return np.expand_dims(x, normalize_axes(axis, x.ndim + 1, "ExpandDims"))


@kernel("Squeeze")
def squeeze(x, axis=(), context=None):
    # Only dims of global size 1 go: a split dim may be 1 long on a rank without being one.
    shape = x.shape if context is None else context.input_shapes[0]
    if axis == () or axis is None:
        axes = tuple(i for i, size in enumerate(shape) if size == 1)
    else:
        axes = normalize_axes(axis, x.ndim, "Squeeze")
    return np.squeeze(x, axis=axes)


@kernel("Concat")
def concat(*inputs, axis=0):
    return np.concatenate(inputs, axis=axis)


@kernel("BroadcastTo")
def broadcast_to(x, shape=(), context=None):
    # A rank holding a slice of a grown dim makes only its own part of it.
    return np.broadcast_to(x, tuple(shape) if context is None else context.output_local_shape(0)).copy()


@kernel("Slice")
def slice_(x, begin=(), size=(), context=None):
    # Cut dims are whole on every rank; a dim kept whole may be split and is taken as it is.
    shape = x.shape if context is None else context.input_shapes[0]
    box = tuple(slice(None) if (b, s) == (0, n) else slice(b, b + s) for b, s, n in zip(begin, size, shape))
    return x[box]
