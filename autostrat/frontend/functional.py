"""MindSpore 2.x's functional training loop: ``value_and_grad``, ``jit`` and ``optimizer(grads)``.

    grad_fn = ms.value_and_grad(forward_fn, None, optimizer.parameters, has_aux=True)
    @ms.jit                                   # optional: the same three calls without it run alike
    def train_step(data, label):
        (loss, _), grads = grad_fn(data, label)
        grads = grad_reducer(grads)           # optional: nn.DistributedGradReducer
        optimizer(grads)
        return loss

A call of `value_and_grad`'s function computes nothing yet: it returns its value and gradients
as deferred tensors (`frontend.deferred`). When ``optimizer(grads)`` receives those gradients,
untouched or through a grad reducer, the whole training step is planned as `Model.train` plans
it (forward, loss, backward, gradient synchronisation, the optimiser update split over the
devices; pipeline stages, recompute, the parallel optimizer, the strategy checkpoint and
``save_graphs`` honoured) and run (`frontend.functional_step`); the loss then holds the
step's loss. `jit` is therefore the identity: deferring the gradients already joins the three
calls into one planned step, with or without it.

Reading a value or a gradient before ``optimizer(grads)`` (or changing the gradients with any
op other than a grad reducer) computes them on the spot by a plan of the forward pass and its
backward, as before: ``fn``'s first output is the loss, and with ``gradients_mean=False`` (the
default, as in MindSpore, whose parallel step sums a parameter's gradient over its replicas)
each gradient is its parameter's replica count in the plan (`Plan.replicas`) times the
whole-batch gradient. A context setting that needs the whole step then refuses before the step
runs (`functional_step.refuse_partial_step`). With ``AUTOSTRAT_CHECK=1`` every such call is
checked against the same graph on one device.

The inputs of each call are this rank's share of the global batch, or the whole batch with
``full_batch=True`` (`frontend.global_batch`).
"""

from __future__ import annotations

import inspect

import numpy as np

from autostrat.autodiff import build_backward, gradient_name
from autostrat.errors import ConfigError, RuntimeBackendError
from autostrat.frontend.cell import Cell
from autostrat.frontend.context import current_context
from autostrat.frontend.deferred import DeferredCall
from autostrat.frontend.batches import batch_split
from autostrat.frontend.global_batch import global_arrays, global_shapes, rank_share
from autostrat.frontend.ms_context import graphs_folder
from autostrat.frontend.tensor import Parameter, Tensor
from autostrat.frontend.tracing import trace
from autostrat.frontend.world import CheckTally, checking, world_backend
from autostrat.ir import Graph
from autostrat.runtime.executor import graph_values, run_single_device
from autostrat.runtime.job import check_indices
from autostrat.runtime.kernels.optimizer import summed_gradient
from autostrat.runtime.local import execute_on_ranks
from autostrat.runtime.program import lower_programs
from autostrat.search import search


def jit(fn=None, **options):
    """MindSpore's ``@jit`` (with or without options): the function, unchanged. The step it
    marks is planned whole anyway: its gradients are deferred until ``optimizer(grads)``."""
    return (lambda function: function) if fn is None else fn


class FunctionCell(Cell):
    """`fn` as a Cell, with the Cells it reads (its globals and closure) as children, so that
    ops get their attribute paths as names (``net.dense1.matmul``); parameters keep the names
    the network gives them (``dense1.weight``, as MindSpore names them). With `loss_only` it
    returns `fn`'s first output alone (the loss a training step minimises)."""

    def __init__(self, fn, loss_only: bool = False):
        super().__init__(auto_prefix=False)
        object.__setattr__(self, "fn", fn)
        object.__setattr__(self, "loss_only", loss_only)
        closure = inspect.getclosurevars(fn) if inspect.isfunction(fn) else None
        found = {} if closure is None else closure.globals | closure.nonlocals
        if isinstance(fn, Cell):
            found = {"net": fn}
        for name, value in sorted(found.items()):
            if isinstance(value, Cell):
                setattr(self, name, value)

    def construct(self, *inputs):
        outputs = self.fn(*inputs)
        return outputs[0] if self.loss_only and isinstance(outputs, tuple) else outputs


class GradFunction:
    """What `value_and_grad` returns: call it with the step's inputs."""

    def __init__(self, fn, weights, has_aux: bool, values: bool = True):
        if weights is None:
            raise ConfigError("value_and_grad: pass the parameters to differentiate as weights (such as "
                              "optimizer.parameters or net.trainable_params()); gradients of the inputs are not supported")
        self.fn, self.cell, self.weights, self.has_aux, self.values = fn, FunctionCell(fn), tuple(weights), has_aux, values
        if not all(isinstance(w, Parameter) for w in self.weights):
            raise ConfigError(f"value_and_grad: weights must be Parameters, got {[type(w).__name__ for w in self.weights]}")
        self._plans: dict = {}
        self._counts: dict = {}
        self.steps: dict = {}  # (optimizer, gradients_mean, inputs) -> its `functional_step.PlannedStep`

    def __call__(self, *inputs):
        arrays = [np.asarray(x.asnumpy() if isinstance(x, Tensor) else x) for x in inputs]
        call = DeferredCall(self, arrays)
        value = call.value_tensors()
        value = value if len(value) > 1 else value[0]  # (loss, aux...) with has_aux
        return (value, call.gradients) if self.values else call.gradients

    def output_count(self, arrays: list) -> int:
        """How many outputs `fn` returns on inputs like `arrays` (traced once per shapes)."""
        key = tuple((array.shape, array.dtype.name) for array in arrays)
        if key not in self._counts:
            context = current_context()
            shapes = global_shapes(arrays, batch_split(context))
            graph = trace(self.cell, *(Tensor(shape=shape, dtype=a.dtype) for shape, a in zip(shapes, arrays)),
                          device_num=context.device_num)
            self._counts[key] = len(graph.outputs)
        return self._counts[key]

    def compute(self, arrays: list) -> tuple[list, tuple]:
        """`fn`'s outputs (this rank's rows) and the gradients of `weights` on `arrays` (this
        rank's inputs), by the plan of the forward pass and its backward."""
        context = current_context()
        split = batch_split(context)
        whole_batch = global_arrays(arrays, split)
        plan, outputs, grads, replicas = self._plan(whole_batch)
        given = {info.name: array for info, array in zip(plan.graph.inputs(), whole_batch)}
        check_indices(plan.graph, given, f"{plan.graph.name} inputs")
        values = graph_values(plan.graph, given)
        result = execute_on_ranks(lower_programs(plan), values, world_backend()).outputs
        if checking():
            _check(plan.graph, values, result)
        # A collective hands a 0-d loss back as shape (1,): every result takes its graph shape again.
        whole = {name: np.reshape(result[name], plan.graph.tensors[name].shape) for name in outputs + grads}
        rows = arrays[0].shape[0] if arrays and arrays[0].ndim else 0
        forward = [rank_share(whole[name], rows, split) for name in outputs]
        # The sum over replicas (gradients_mean=False) scales the checked whole-batch gradients.
        return forward, tuple(summed_gradient(whole[name], count) for name, count in zip(grads, replicas))

    def _plan(self, arrays: list):
        key = tuple((array.shape, array.dtype.name) for array in arrays)
        if key not in self._plans:
            context = current_context()
            graph = trace(self.cell, *(Tensor(shape=a.shape, dtype=a.dtype) for a in arrays), device_num=context.device_num)
            backward = build_backward(graph, graph.outputs[0])
            names = {id(value): name for name, value in graph.values.items()}
            grads = tuple(gradient_name(names[id(weight)]) if id(weight) in names else None for weight in self.weights)
            if None in grads:
                unused = [w.name or repr(w) for w, g in zip(self.weights, grads) if g is None]
                raise ConfigError(f"value_and_grad: weights {unused} are not read by the function")
            whole = Graph(backward.tensors, backward.ops, graph.outputs + grads, f"{graph.name}.grad", backward.values)
            plan = search(whole, context.device_num, context.search_options())
            folder = graphs_folder(context.global_rank)
            if folder is not None:  # save_graphs: as every plan made under it (`api.plan_for`)
                plan.dump_ir(folder, context.global_rank)
            replicas = tuple(1 if context.gradients_mean else plan.replicas(names[id(weight)]) for weight in self.weights)
            self._plans[key] = plan, graph.outputs, grads, replicas
        return self._plans[key]


TOLERANCE = 1e-5
_TALLY = CheckTally(lambda t: f"value_and_grad: {t.count} call(s) checked against one device: max relative error "
                              f"{t.error:.3g} (limit {TOLERANCE:g}): OK")


def _check(graph, values: dict, result: dict, tolerance: float = TOLERANCE) -> None:
    """Compare a call's outputs (value and gradients) with the graph run on one device; a
    difference over `tolerance` (relative to the largest reference magnitude) raises, and the
    process reports how many calls it checked when it exits (rank 0)."""
    from autostrat.frontend.train import relative_error  # train imports this module: read at call time

    error = relative_error(result, run_single_device(graph, values))
    if error > tolerance:
        raise RuntimeBackendError(f"value_and_grad: the distributed value and gradients differ from one device's by "
                                  f"{error:.3g} (relative; limit {tolerance:g})")
    _TALLY.add(error)


def value_and_grad(fn, grad_position=None, weights=None, has_aux: bool = False) -> GradFunction:
    """MindSpore's ``value_and_grad(fn, grad_position, weights, has_aux)``: a function returning
    ``fn``'s value and the gradients of its first output with respect to `weights`.

    Example:
        >>> from autostrat import nn, set_auto_parallel_context, reset_auto_parallel_context
        >>> from autostrat.models import FFN
        >>> set_auto_parallel_context(parallel_mode="data_parallel", device_num=2)
        >>> net, loss_fn = FFN(), nn.MSELoss()
        >>> grad_fn = value_and_grad(lambda x, y: loss_fn(net(x), y), None, net.trainable_params())
        >>> loss, grads = grad_fn(np.ones((4, 64), np.float32), np.zeros((4, 64), np.float32))
        >>> len(grads), grads[0].shape
        (4, (64, 64))
        >>> reset_auto_parallel_context()
    """
    if grad_position is not None:
        raise ConfigError(f"value_and_grad: gradients of the inputs (grad_position={grad_position!r}) are not supported; "
                          f"pass grad_position=None and the parameters as weights")
    return GradFunction(fn, weights, has_aux)


def grad(fn, grad_position=None, weights=None, has_aux: bool = False) -> GradFunction:
    """MindSpore's ``grad``: like `value_and_grad`, the gradients alone."""
    if grad_position is not None:
        raise ConfigError(f"grad: gradients of the inputs (grad_position={grad_position!r}) are not supported")
    return GradFunction(fn, weights, has_aux, values=False)
