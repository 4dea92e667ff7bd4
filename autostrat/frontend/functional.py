"""MindSpore 2.x's functional training loop: ``value_and_grad``, ``jit`` and ``optimizer(grads)``.

    grad_fn = ms.value_and_grad(forward_fn, None, optimizer.parameters)
    for data, label in dataset:
        loss, grads = grad_fn(data, label)
        optimizer(grads)

`value_and_grad(fn, ...)` traces ``fn`` (a function of Cells, or a Cell) on its inputs' shapes,
plans its forward pass with the backward of the loss (its first output) under the parallel
context, runs that plan on the ranks (threads, or MPI ranks under mpiexec) and returns the loss
and the gradients of `weights` as whole tensors on every rank; a plan is made once per input
shapes. With ``gradients_mean=False`` (the default, as in MindSpore, whose parallel step sums
a parameter's gradient over its replicas) each gradient is its parameter's replica count in the
plan (`Plan.replicas`) times the whole-batch gradient, as `Model.train` sums it.
``optimizer(grads)`` applies the optimiser's update ops (the same kernels a planned training
step runs) to the parameters' whole values on every rank, keeping its state, so every rank
holds the same parameters for the next step. Unlike `Model.train`, whose plan includes
gradient synchronisation and the update, the update here runs unsplit: the loop may change the
gradients between the two calls, as MindSpore allows.

`jit` is accepted and returns the function unchanged: a call of `value_and_grad`'s function
already runs a planned graph. With ``AUTOSTRAT_CHECK=1`` every call is checked against the same
graph on one device.
"""

from __future__ import annotations

import atexit
import inspect

import numpy as np

from autostrat.autodiff import build_backward, gradient_name
from autostrat.autodiff.builder import GradBuilder
from autostrat.errors import ConfigError, RuntimeBackendError
from autostrat.frontend.cell import Cell
from autostrat.frontend.context import current_context
from autostrat.frontend.tensor import Parameter, Tensor
from autostrat.frontend.tracing import trace
from autostrat.frontend.world import checking, get_rank, world_backend
from autostrat.ir import Graph, TensorInfo
from autostrat.runtime.executor import graph_values, run_single_device, single_device_step
from autostrat.runtime.job import check_indices
from autostrat.runtime.kernels.optimizer import summed_gradient
from autostrat.runtime.local import execute_on_ranks
from autostrat.runtime.program import lower_programs
from autostrat.search import search


def jit(fn=None, **options):
    """MindSpore's ``@jit`` (with or without options): the function, unchanged."""
    return (lambda function: function) if fn is None else fn


class _FunctionCell(Cell):
    """`fn` as a Cell, with the Cells it reads (its globals and closure) as children, so that
    ops and parameters get their attribute paths as names (``net.dense1.matmul``)."""

    def __init__(self, fn):
        super().__init__()
        object.__setattr__(self, "fn", fn)
        closure = inspect.getclosurevars(fn) if inspect.isfunction(fn) else None
        found = {} if closure is None else closure.globals | closure.nonlocals
        if isinstance(fn, Cell):
            found = {"net": fn}
        for name, value in sorted(found.items()):
            if isinstance(value, Cell):
                setattr(self, name, value)

    def construct(self, *inputs):
        return self.fn(*inputs)


class GradFunction:
    """What `value_and_grad` returns: call it with the step's inputs."""

    def __init__(self, fn, weights, has_aux: bool, values: bool = True):
        if weights is None:
            raise ConfigError("value_and_grad: pass the parameters to differentiate as weights (such as "
                              "optimizer.parameters or net.trainable_params()); gradients of the inputs are not supported")
        self.cell, self.weights, self.has_aux, self.values = _FunctionCell(fn), tuple(weights), has_aux, values
        if not all(isinstance(w, Parameter) for w in self.weights):
            raise ConfigError(f"value_and_grad: weights must be Parameters, got {[type(w).__name__ for w in self.weights]}")
        self._plans: dict = {}

    def __call__(self, *inputs):
        arrays = [np.asarray(x.asnumpy() if isinstance(x, Tensor) else x) for x in inputs]
        plan, programs, outputs, grads, replicas = self._plan(arrays)
        given = {info.name: array for info, array in zip(plan.graph.inputs(), arrays)}
        check_indices(plan.graph, given, f"{plan.graph.name} inputs")
        values = graph_values(plan.graph, given)
        result = execute_on_ranks(programs, values, world_backend()).outputs
        if checking():
            _check(plan.graph, values, result)
        # A collective hands a 0-d loss back as shape (1,): every result takes its graph shape again.
        whole = {name: np.reshape(result[name], plan.graph.tensors[name].shape) for name in outputs + grads}
        forward = [Tensor(whole[name]) for name in outputs]
        value = tuple(forward) if len(forward) > 1 else forward[0]  # (loss, aux...) with has_aux
        # The sum over replicas (gradients_mean=False) scales the checked whole-batch gradients.
        gradients = tuple(Tensor(summed_gradient(whole[name], count)) for name, count in zip(grads, replicas))
        return (value, gradients) if self.values else gradients

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
            replicas = tuple(1 if context.gradients_mean else plan.replicas(names[id(weight)]) for weight in self.weights)
            self._plans[key] = plan, lower_programs(plan), graph.outputs, grads, replicas
        return self._plans[key]


_checked = {"calls": 0, "error": 0.0}


def _check(graph, values: dict, result: dict, tolerance: float = 1e-5) -> None:
    """Compare a call's outputs (value and gradients) with the graph run on one device; a
    difference over `tolerance` (relative to the largest reference magnitude) raises, and the
    process reports how many calls it checked when it exits (rank 0)."""
    from autostrat.frontend.train import relative_error  # train imports this module: read at call time

    error = relative_error(result, run_single_device(graph, values))
    if error > tolerance:
        raise RuntimeBackendError(f"value_and_grad: the distributed value and gradients differ from one device's by "
                                  f"{error:.3g} (relative; limit {tolerance:g})")
    if _checked["calls"] == 0:
        atexit.register(_report_checks, tolerance)
    _checked["calls"] += 1
    _checked["error"] = max(_checked["error"], error)


def _report_checks(tolerance: float) -> None:
    if get_rank() == 0:
        print(f"value_and_grad: {_checked['calls']} call(s) checked against one device: max relative error "
              f"{_checked['error']:.3g} (limit {tolerance:g}): OK", flush=True)


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


class FunctionalStep:
    """The functional half of a MindSpore optimizer: ``optimizer.parameters`` and
    ``optimizer(grads)`` (mixed into `nn.SGD`, `nn.Momentum`, `nn.Adam`)."""

    @property
    def parameters(self) -> tuple:
        return self.__dict__.get("_parameters", ())

    def __call__(self, grads) -> None:
        """Update `parameters` with `grads` (one per parameter, in order), keeping the state."""
        parameters = self.parameters
        if len(grads) != len(parameters):
            raise ConfigError(f"{type(self).__name__}(grads): expected {len(parameters)} gradients (one per parameter), "
                              f"got {len(grads)}")
        if "_update" not in self.__dict__:
            object.__setattr__(self, "_update", _update_graph(self, parameters))
        graph, state = self._update
        values = dict(state)
        for index, (parameter, gradient) in enumerate(zip(parameters, grads)):
            array = np.asarray(gradient.asnumpy() if isinstance(gradient, Tensor) else gradient)
            if array.shape != parameter.shape:
                raise ConfigError(f"{type(self).__name__}(grads): gradient {index} has shape {list(array.shape)}, its "
                                  f"parameter {list(parameter.shape)}")
            values[f"p{index}"], values[gradient_name(f"p{index}")] = parameter.asnumpy(), array.astype(parameter.dtype)
        _, updated = single_device_step(graph, values)
        for index, parameter in enumerate(parameters):
            parameter.set_data(updated.pop(f"p{index}"))
        state.update(updated)


def _update_graph(optimizer, parameters) -> tuple[Graph, dict]:
    """The optimiser's update ops for `parameters` (named p0, p1...; gradients grad/p0...) as a
    graph, and its state's initial values."""
    tensors = {}
    for index, parameter in enumerate(parameters):
        tensors[f"p{index}"] = TensorInfo(f"p{index}", parameter.shape, parameter.dtype, "parameter")
        gradient = gradient_name(f"p{index}")
        tensors[gradient] = TensorInfo(gradient, parameter.shape, parameter.dtype, "input")
    builder = GradBuilder(tensors)
    builder.scope = "optimizer"
    updates: list = []
    shared = optimizer.prepare(builder, updates)
    for index in range(len(parameters)):
        updates += optimizer.update(builder, f"p{index}", gradient_name(f"p{index}"), shared)
    graph = Graph(builder.tensors, builder.ops, (), "update", builder.values, tuple(updates))
    state = {name: np.asarray(value.asnumpy()) for name, value in builder.values.items()}
    return graph, state
