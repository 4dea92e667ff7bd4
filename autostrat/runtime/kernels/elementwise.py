"""Kernels of the elementwise ops."""

from __future__ import annotations

import math

import numpy as np

from autostrat.runtime.kernels.registry import kernel
from autostrat.runtime.kernels import special

_UNARY = {
    "Exp": np.exp,
    "GeLU": lambda x: 0.5 * x * (1 + special.erf(x / math.sqrt(2))),
    "Identity": np.copy,
    "Log": np.log,
    "Neg": np.negative,
    "ReLU": lambda x: np.maximum(x, 0),
    "Sigmoid": lambda x: special.expit(x),
    "SiLU": lambda x: x * special.expit(x),
    "Sqrt": np.sqrt,
    "Tanh": np.tanh,
}
_BINARY = {
    "Add": np.add,
    "Maximum": np.maximum,
    "Minimum": np.minimum,
    "Mul": np.multiply,
    "RealDiv": np.divide,
    "Sub": np.subtract,
}


def _register_unary(op_type: str, fn) -> None:
    kernel(op_type)(lambda x: np.asarray(fn(x), dtype=np.asarray(x).dtype))


def _register_binary(op_type: str, fn) -> None:
    kernel(op_type)(lambda x, y: fn(x, y))


for _name, _fn in _UNARY.items():
    _register_unary(_name, _fn)
for _name, _fn in _BINARY.items():
    _register_binary(_name, _fn)


@kernel("BiasAdd")
def bias_add(x, bias, data_format="NCHW"):
    return x + bias.reshape((1, -1) + (1,) * (x.ndim - 2))


@kernel("Cast")
def cast(x, dtype="float32"):
    return x.astype(np.dtype(dtype))


def _uniform(indices: np.ndarray, seed: int) -> np.ndarray:
    """Uniform [0, 1) numbers from a splitmix64 hash of global element indices."""
    z = indices.astype(np.uint64) + np.uint64((seed * 0x9E3779B97F4A7C15 + 0x632BE59BD9B4E019) % 2**64)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    z = z ^ (z >> np.uint64(31))
    return (z >> np.uint64(11)).astype(np.float64) * 2.0**-53


@kernel("Dropout")
def dropout(x, keep_prob=0.5, seed=0, context=None):
    offsets = [0] * x.ndim if context is None else [start for start, _ in context.input_ranges[0]]
    shape = x.shape if context is None else context.input_shapes[0]
    grid = np.indices(x.shape, dtype=np.int64)
    flat = np.ravel_multi_index(tuple(g + o for g, o in zip(grid, offsets)), shape) if x.ndim else np.zeros((), np.int64)
    keep = _uniform(np.asarray(flat), seed) < keep_prob
    return np.where(keep, x / keep_prob, 0).astype(x.dtype), keep
