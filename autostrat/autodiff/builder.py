"""The builder bprops emit backward ops with, and the constant values it creates.

Op names: ``bprop/<forward op>/<op type in snake case>``, then ``_1``, ``_2``... for repeats;
their outputs ``<op name>:<index>`` as in a traced graph. Shapes come from the op's rule, dtypes
from `ir.output_dtypes`, so a bprop only says which op computes what.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from autostrat.errors import AutostratError
from autostrat.ir import OpNode, TensorInfo, output_dtypes
from autostrat.rules import make_rule


@dataclass(frozen=True)
class Constant:
    """A constant tensor filled with one value, made on demand (`Graph.values` entries give
    their data through `.asnumpy()`, as frontend tensors do).

    Example:
        >>> Constant((2,), "float32", 0.5).asnumpy()
        array([0.5, 0.5], dtype=float32)
    """

    shape: tuple[int, ...]
    dtype: str
    fill: float

    def asnumpy(self) -> np.ndarray:
        return np.full(self.shape, self.fill, np.dtype(self.dtype))


def _snake(op_type: str) -> str:
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", op_type).lower()


def _hashable(value):
    if isinstance(value, (list, tuple)):
        return tuple(_hashable(v) for v in value)
    return value


class GradBuilder:
    """Collects the backward ops and tensors of one graph, in emission (topological) order.

    Example:
        >>> builder = GradBuilder({"dy": TensorInfo("dy", (4, 8), "float32", "input")})
        >>> builder.scope = "relu"
        >>> builder.emit("Neg", "dy")
        'bprop/relu/neg:0'
        >>> builder.sum_to("dy", (8,))
        'bprop/relu/reduce_sum:0'
    """

    def __init__(self, tensors: dict[str, TensorInfo]):
        self.tensors = dict(tensors)
        self.ops: dict[str, OpNode] = {}
        self.values: dict[str, Constant] = {}
        self.scope = ""  # the forward op whose bprop is emitting, for names and errors

    def shape(self, tensor: str) -> tuple[int, ...]:
        return self.tensors[tensor].shape

    def dtype(self, tensor: str) -> str:
        return self.tensors[tensor].dtype

    def is_float(self, tensor: str) -> bool:
        return np.issubdtype(np.dtype(self.dtype(tensor)), np.floating)

    def _name(self, base: str) -> str:
        name, count = base, 0
        while name in self.ops:
            count += 1
            name = f"{base}_{count}"
        return name

    def emit_many(self, op_type: str, *inputs: str, name: str | None = None, **attrs) -> tuple[str, ...]:
        """Add an op applying `op_type` to `inputs`; returns its output tensor names."""
        name = self._name(name or f"bprop/{self.scope}/{_snake(op_type)}")
        attrs = {key: _hashable(value) for key, value in attrs.items()}
        try:
            rule = make_rule(op_type, [self.shape(t) for t in inputs], **attrs)
        except AutostratError as error:
            raise type(error)(f"{name} (the gradient of {self.scope}): {error}") from None
        dtypes = output_dtypes(op_type, [self.dtype(t) for t in inputs], attrs, len(rule.output_shapes))
        outputs = tuple(f"{name}:{i}" for i in range(len(rule.output_shapes)))
        for tensor, shape, dtype in zip(outputs, rule.output_shapes, dtypes):
            self.tensors[tensor] = TensorInfo(tensor, shape, dtype, "output", name)
        self.ops[name] = OpNode(name, op_type, tuple(sorted(attrs.items())), tuple(inputs), outputs, rule)
        return outputs

    def emit(self, op_type: str, *inputs: str, name: str | None = None, **attrs) -> str:
        """`emit_many` for an op with one output; returns that output's name."""
        [output] = self.emit_many(op_type, *inputs, name=name, **attrs)
        return output

    def constant(self, name: str, shape: tuple[int, ...], dtype: str, fill: float) -> str:
        """A constant tensor `name` of `shape` filled with `fill`."""
        self.tensors[name] = TensorInfo(name, tuple(shape), dtype, "constant")
        self.values[name] = Constant(tuple(shape), dtype, fill)
        return name

    def scalar(self, fill: float, like: str) -> str:
        """A scalar constant of `like`'s dtype, named after the scope."""
        base, count = f"bprop/{self.scope}/scalar", 0
        name = base
        while name in self.tensors:
            count += 1
            name = f"{base}_{count}"
        return self.constant(name, (), self.dtype(like), fill)

    def sum_to(self, tensor: str, shape: tuple[int, ...]) -> str:
        """`tensor` summed over the dims numpy broadcasting added or grew to reach it from
        `shape` — the gradient of a broadcast operand."""
        have, shape = self.shape(tensor), tuple(shape)
        if have == shape:
            return tensor
        lead = len(have) - len(shape)
        grown = tuple(lead + i for i, size in enumerate(shape) if size == 1 and have[lead + i] != 1)
        axes = tuple(range(lead)) + grown
        # An empty axis list would mean "every axis" to ReduceSum: only size-1 dims differ then.
        summed = self.emit("ReduceSum", tensor, axis=axes) if axes else tensor
        return summed if self.shape(summed) == shape else self.emit("Reshape", summed, shape=shape)
