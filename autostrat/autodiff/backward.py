"""The training graph: a traced forward graph plus the backward ops its bprops compose.

Algorithm (reverse-mode automatic differentiation over `ir.Graph`):

1. The tensors needing a gradient are the floating-point ones that depend on a parameter.
2. The loss's gradient starts as the sensitivity: a constant ``grad/<loss>`` of ones
   (MindSpore's default `sens`), which an executor may feed with other values.
3. Ops are visited in reverse topological order. When an op is reached every consumer of its
   output has contributed a gradient; several contributions are accumulated with Add ops
   (``accumulate/<tensor>``). The op's bprop then contributes to its inputs' gradients.
4. A gradient computed by an op of its own is renamed ``grad/<tensor>``; a parameter whose
   gradient is another tensor's gets an Identity op, so ``grad/<parameter>`` always exists. A
   parameter the loss does not depend on gets a zero constant.
5. Backward ops no gradient output needs are dropped (a bprop emits every input's gradient).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from autostrat.autodiff.builder import GradBuilder
from autostrat.autodiff.registry import get_bprop
from autostrat.errors import ConfigError
from autostrat.ir import Graph, OpNode, TensorInfo


def gradient_name(tensor: str) -> str:
    """The name of `tensor`'s gradient in a training graph.

    Example:
        >>> gradient_name("dense1.weight")
        'grad/dense1.weight'
    """
    return f"grad/{tensor}"


def _needing_gradient(graph: Graph, builder: GradBuilder, sources: tuple[str, ...]) -> set[str]:
    needed = set(sources)
    for op in graph.ops.values():
        if any(t in needed for t in op.inputs):
            needed.update(t for t in op.outputs if builder.is_float(t))
    return needed


class _Backward:
    """The state of one `build_backward` run: contributions per tensor and the final names."""

    def __init__(self, graph: Graph, loss: str):
        self.builder = GradBuilder(graph.tensors)
        self.contributions: dict[str, list[str]] = {loss: []}
        self.renames: dict[str, str] = {}
        sensitivity = self.builder.constant(gradient_name(loss), graph.tensors[loss].shape, graph.tensors[loss].dtype, 1.0)
        self.contributions[loss].append(sensitivity)

    def finish(self, tensor: str) -> str | None:
        """The gradient of `tensor`: its contributions summed, renamed grad/<tensor> if fresh."""
        parts = self.contributions.pop(tensor, [])
        if not parts:
            return None
        total = parts[0]
        for part in parts[1:]:
            total = self.builder.emit("Add", total, part, name=f"accumulate/{tensor}")
        fresh = self.builder.tensors[total].producer in self.builder.ops
        if fresh and total not in self.renames:
            self.renames[total] = gradient_name(tensor)
        return total

    def run_bprop(self, op: OpNode, needing: set[str]) -> None:
        if not any(t in needing for t in op.inputs):
            return
        grads = [self.finish(t) for t in op.outputs]
        if all(g is None for g in grads):
            return
        if any(g is not None for g in grads[1:]):  # Dropout's mask: a bool no loss differentiates
            raise ConfigError(f"{op.name}: bprops take the gradient of an op's first output only, {op.op_type}'s "
                              f"outputs {', '.join(t for t, g in zip(op.outputs[1:], grads[1:]) if g is not None)} have one")
        self.builder.scope = op.name
        results = get_bprop(op.op_type, where=op.name)(self.builder, op, grads[0])
        assert len(results) == len(op.inputs), f"the {op.op_type} bprop returned {len(results)} gradients"
        for tensor, grad in zip(op.inputs, results):
            if grad is not None and tensor in needing:
                assert self.builder.shape(grad) == self.builder.shape(tensor), (op.name, tensor)
                self.contributions.setdefault(tensor, []).append(grad)

    def parameter_gradient(self, parameter: TensorInfo) -> str:
        name = gradient_name(parameter.name)
        grad = self.finish(parameter.name)
        if grad is None:
            return self.builder.constant(name, parameter.shape, parameter.dtype, 0.0)
        if self.renames.get(grad) == name:
            return grad
        self.builder.scope = parameter.name
        identity = self.builder.emit("Identity", grad, name=f"identity/{parameter.name}")
        self.renames[identity] = name
        return identity


def _prune(builder: GradBuilder, outputs: tuple[str, ...]) -> dict[str, OpNode]:
    """The backward ops some output needs, in emission order."""
    needed, kept = set(outputs), []
    for op in reversed(builder.ops.values()):
        if any(t in needed for t in op.outputs):
            kept.append(op)
            needed.update(op.inputs)
    return {op.name: op for op in reversed(kept)}


def _renamed(op: OpNode, renames: dict[str, str]) -> OpNode:
    inputs = tuple(renames.get(name, name) for name in op.inputs)
    return replace(op, inputs=inputs, outputs=tuple(renames.get(name, name) for name in op.outputs))


def build_backward(graph: Graph, loss: str | None = None) -> Graph:
    """The training graph of `graph`: its ops, then the backward ops computing the gradient of
    `loss` (default: the graph's only output) with respect to every floating-point parameter.
    Its outputs are those gradients, ``grad/<parameter>``, in `graph.parameters()` order.

    Example:
        >>> from autostrat.frontend import trace
        >>> from autostrat.models import FFN
        >>> from autostrat.nn import Tensor
        >>> training = build_backward(trace(FFN(), Tensor(shape=(64, 64))))
        >>> training.outputs
        ('grad/dense1.weight', 'grad/dense1.bias', 'grad/dense2.weight', 'grad/dense2.bias')
        >>> [(op.name, op.op_type) for op in training.ops.values()][5:8]
        [('bprop/dense2.bias_add/reduce_sum', 'ReduceSum'), ('bprop/dense2.matmul/mat_mul', 'MatMul'), ('bprop/dense2.matmul/mat_mul_1', 'MatMul')]
    """
    if loss is None:
        if len(graph.outputs) != 1:
            raise ConfigError(f"{graph.name} has {len(graph.outputs)} outputs {list(graph.outputs)}; name the loss to differentiate")
        loss = graph.outputs[0]
    if loss not in graph.tensors:
        raise ConfigError(f"the loss must be a tensor of {graph.name}, got {loss!r}")
    if not np.issubdtype(np.dtype(graph.tensors[loss].dtype), np.floating):
        raise ConfigError(f"the loss {loss} must be floating point, got {graph.tensors[loss].dtype}")
    state = _Backward(graph, loss)
    parameters = tuple(p for p in graph.parameters() if state.builder.is_float(p.name))
    needing = _needing_gradient(graph, state.builder, tuple(p.name for p in parameters))
    for op in reversed(graph.ops.values()):
        state.run_bprop(op, needing)
    outputs = tuple(state.parameter_gradient(p) for p in parameters)
    return _assemble(graph, state.builder, outputs, state.renames)


def _assemble(graph: Graph, builder: GradBuilder, outputs: tuple[str, ...], renames: dict[str, str]) -> Graph:
    """The forward graph plus the backward ops the outputs need, gradients renamed."""
    kept = _prune(builder, outputs)
    ops = dict(graph.ops) | {name: _renamed(op, renames) for name, op in kept.items()}
    tensors = dict(graph.tensors)
    used = [t for op in kept.values() for t in op.inputs + op.outputs] + list(outputs)  # outputs: zero constants too
    for tensor in used:
        name = renames.get(tensor, tensor)
        tensors.setdefault(name, replace(builder.tensors[tensor], name=name))
    values = dict(graph.values) | {name: value for name, value in builder.values.items() if name in tensors}
    return Graph(tensors, ops, tuple(renames.get(n, n) for n in outputs), f"{graph.name}.train", values)
