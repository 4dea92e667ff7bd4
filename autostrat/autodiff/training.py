"""The training graph: forward, loss, backward and one optimiser update per parameter.

A step of it reads the parameters and optimiser state and computes their next values
(`Graph.updates`); its only output is the loss. The search shards it like any graph, so the
gradient synchronisation is the redistribution from a gradient's layout (partial over the
devices that split the batch) to its update op's layout.
"""

from __future__ import annotations

import re
from dataclasses import replace

from autostrat.autodiff.backward import build_backward
from autostrat.autodiff.builder import GradBuilder
from autostrat.autodiff.optimizers import UPDATE_PREFIX
from autostrat.autodiff.recompute import RECOMPUTE_PREFIX, recompute_cells
from autostrat.ir import Graph

PHASES = ("forward", "backward", "update")
# The prefixes of backward ops' names (a bprop's ops, gradient sums, recomputed forward ops).
BACKWARD_PREFIXES = ("bprop/", "accumulate/", "identity/", RECOMPUTE_PREFIX)
# Any run of them, of an update op's, and of a gradient's or an optimiser state's tensor name.
_DERIVED = re.compile("^(?:" + "|".join(re.escape(p) for p in (*BACKWARD_PREFIXES, UPDATE_PREFIX, "grad/", "moments.",
                                                                 "moment1.", "moment2.")) + ")+")


def op_phase(name: str) -> str:
    """Which part of a training step an op of a training graph belongs to.

    Example:
        >>> op_phase("dense1.matmul"), op_phase("bprop/dense1.matmul/mat_mul"), op_phase("optimizer/dense1.weight")
        ('forward', 'backward', 'update')
    """
    if name.startswith(UPDATE_PREFIX):
        return "update"
    if name.startswith(BACKWARD_PREFIXES):
        return "backward"
    return "forward"


def forward_name(name: str) -> str:
    """The forward op or parameter a training op's (or tensor's) name derives from.

    Example:
        >>> forward_name("bprop/blocks.3.ffn1.matmul/mat_mul"), forward_name("optimizer/moments.dense1.weight")
        ('blocks.3.ffn1.matmul/mat_mul', 'dense1.weight')
    """
    return _DERIVED.sub("", name)


def build_training(graph: Graph, optimizer, loss: str | None = None, gradients_mean: bool = True,
                   recompute: tuple[str, ...] = ()) -> Graph:
    """`graph` (whose output is the loss) plus its backward ops and `optimizer`'s updates;
    every update carries `gradients_mean` (False: it sums its replicas' gradients, see the
    context's `gradients_mean`); the forward ops of the cells at the paths `recompute` run
    again inside the backward (`recompute.recompute_cells`).

    Example:
        >>> from autostrat.autodiff.optimizers import Momentum
        >>> from autostrat.frontend import trace
        >>> from autostrat.models import FFN
        >>> from autostrat.nn import Tensor
        >>> training = build_training(trace(FFN(), Tensor(shape=(64, 64))), Momentum(0.01, 0.9))
        >>> training.outputs, training.updates[:2]
        (('dense2.bias_add:0',), (('dense1.weight', 'optimizer/dense1.weight:0'), ('moments.dense1.weight', 'optimizer/dense1.weight:1')))
    """
    backward = build_backward(graph, loss)
    if recompute:
        backward = recompute_cells(backward, tuple(recompute), set(graph.ops))
    loss = loss or graph.outputs[0]
    builder = GradBuilder(backward.tensors)
    builder.scope = "optimizer"
    updates: list[tuple[str, str]] = []
    shared = optimizer.prepare(builder, updates)
    for gradient in backward.outputs:
        parameter = gradient.removeprefix("grad/")
        updates += optimizer.update(builder, parameter, gradient, shared)
        _mark_gradients_mean(builder, UPDATE_PREFIX + parameter, gradients_mean)
    values = dict(backward.values) | builder.values
    ops = dict(backward.ops) | builder.ops
    return Graph(builder.tensors, ops, (loss,), f"{graph.name}.train", values, tuple(updates))


def _mark_gradients_mean(builder: GradBuilder, update: str, gradients_mean: bool) -> None:
    """The update says how it combines its replicas' gradients, either way, so that no kernel
    default decides it (the lowering adds their count when it sums them)."""
    op = builder.ops[update]
    builder.ops[update] = replace(op, attrs=tuple(sorted(op.attrs + (("gradients_mean", gradients_mean),))))
