"""Training, MindSpore style: `WithLossCell`, optimisers over `net.trainable_params()`,
`TrainOneStepCell`, and `Model.train`, checked against the stand-alone run.

A training step is one graph (see `autodiff.build_training`), planned once and run step after
step: under mpiexec every process is one rank (MpiBackend), otherwise all ranks run as threads
of this process. The stand-alone reference runs the same training graph on one device.

Example (three Momentum steps of the tutorial FFN with a cross-entropy loss, on 8 threads):
    >>> from autostrat import nn, set_auto_parallel_context, reset_auto_parallel_context
    >>> from autostrat.models import FFN
    >>> set_auto_parallel_context(parallel_mode="auto_parallel", device_num=8)
    >>> net = FFN(); _ = net.dense1.matmul.shard(((2, 1), (1, 4)))
    >>> loss = WithLossCell(net, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"))
    >>> cell = TrainOneStepCell(loss, Momentum(net.trainable_params(), 0.01, 0.9))
    >>> report = train(cell, (nn.Tensor(shape=(64, 64)), nn.Tensor(shape=(64,), dtype="int32")), steps=3, log=None)
    >>> reset_auto_parallel_context()
    >>> report.ok, len(report.result.losses)
    (True, 3)
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass

import numpy as np

from autostrat.autodiff import optimizers
from autostrat.errors import ConfigError
from autostrat.frontend.api import plan_for, training_parts
from autostrat.frontend.cell import Cell
from autostrat.frontend.context import current_context
from autostrat.frontend.functional_step import FunctionalStep
from autostrat.frontend.world import get_rank, launched_by_mpiexec
from autostrat.runtime import checkpoint
from autostrat.runtime.executor import graph_values
from autostrat.runtime.job import random_batch
from autostrat.runtime.report import PHASE_LEGEND, memory_line
from autostrat.runtime.reference import reference_line, tensor_errors
from autostrat.runtime.training import (TrainingResult, reference_graph, train_collective, train_locally, train_reference,
                                        train_single_device)


# The optimisers with MindSpore's functional half (``optimizer.parameters``, ``optimizer(grads)``).
_FUNCTIONAL = {kind: type(kind.__name__, (kind, FunctionalStep), {"__doc__": kind.__doc__})
               for kind in (optimizers.SGD, optimizers.Momentum, optimizers.Adam)}


def _optimizer(kind, params, **settings):
    if params is not None and not isinstance(params, (list, tuple)):
        raise TypeError(f"{kind.__name__}: params must be a list such as net.trainable_params(), got {type(params).__name__}")
    optimizer = _FUNCTIONAL[kind](**settings)
    object.__setattr__(optimizer, "_parameters", tuple(params or ()))  # a frozen dataclass: set once, here
    return optimizer


def SGD(params, learning_rate: float = 0.01) -> optimizers.SGD:  # noqa: N802  (MindSpore's name)
    """MindSpore ``nn.SGD(params, learning_rate)`` (every parameter of the network is trained)."""
    return _optimizer(optimizers.SGD, params, learning_rate=learning_rate)


def Momentum(params, learning_rate: float, momentum: float, use_nesterov: bool = False) -> optimizers.Momentum:  # noqa: N802
    """MindSpore ``nn.Momentum(params, learning_rate, momentum)``."""
    return _optimizer(optimizers.Momentum, params, learning_rate=learning_rate, momentum=momentum, use_nesterov=use_nesterov)


def Adam(params, learning_rate: float = 1e-3, beta1: float = 0.9, beta2: float = 0.999, eps: float = 1e-8) -> optimizers.Adam:  # noqa: N802
    """MindSpore ``nn.Adam(params, learning_rate, beta1, beta2, eps)``."""
    return _optimizer(optimizers.Adam, params, learning_rate=learning_rate, beta1=beta1, beta2=beta2, eps=eps)


class WithLossCell(Cell):
    """``loss_fn(backbone(data), label)``: a network that returns its loss."""

    def __init__(self, backbone, loss_fn):
        super().__init__(auto_prefix=False)
        self.backbone, self.loss_fn = backbone, loss_fn

    def construct(self, data, label):
        return self.loss_fn(self.backbone(data), label)


class TrainOneStepCell(Cell):
    """One training step of `network` (which returns its loss) with `optimizer`; planning it
    plans forward, backward, gradient synchronisation and update together."""

    def __init__(self, network, optimizer):
        super().__init__(auto_prefix=False)
        self.network, self.optimizer = network, optimizer

    def train_parts(self) -> tuple:
        return self.network, self.optimizer

    def construct(self, *inputs):
        return self.network(*inputs)


@dataclass(frozen=True)
class TrainReport:
    """A distributed run next to the stand-alone run of the same steps (rank 0 only)."""

    result: TrainingResult
    reference: TrainingResult
    loss_error: float
    parameter_error: float
    tolerance: float
    text: str
    tensor_errors: tuple = (0.0, 0.0, 1.0, "")  # `reference.tensor_errors` of every parameter and state (JAX's reference)

    @property
    def ok(self) -> bool:
        return (self.loss_error <= self.tolerance and self.parameter_error <= self.tolerance and self.result.bytes_match
                and self.tensor_errors[1] <= self.tensor_errors[2])


def synthetic_batches(graph, steps: int, seed: int = 0, dataset_size: int = 2) -> tuple[dict, ...]:
    """`steps` batches cycling through a fixed synthetic dataset of `dataset_size` batches of
    every graph input (normal floats, valid integer labels): the same on every rank and in
    every run with this seed, and small enough that the loss visibly falls."""
    rng = np.random.default_rng(seed)
    dataset = [random_batch(graph, rng) for _ in range(dataset_size)]
    return tuple(dataset[step % dataset_size] for step in range(steps))


def training_plan(net, optimizer, inputs=(), steps: int = 2, seed: int = 0, context=None, initial: dict | None = None) -> tuple:
    """The training plan of `net` (returning a loss, or not: its output's mean is then the loss)
    under `context` (default: the current one), its initial values and a synthetic dataset.

    `initial` (whole arrays by name, such as `load_checkpoint(path)`) replaces the initial
    parameters and optimiser state: the run continues a saved one, under this plan's strategy
    and `device_num` whatever the saved run's were. It must hold exactly the tensors the plan
    updates (`CheckpointError` otherwise).
    """
    context = context or current_context()
    check_training(net, optimizer, context, steps)
    if not inputs:
        from autostrat.frontend.tensor import Tensor
        inputs = (Tensor(shape=(64, 64)),)
    plan = plan_for(net, inputs, context, optimizer=optimizer)
    graph = reference_graph(plan)
    values = graph_values(graph, {})
    if initial is not None:
        values = checkpoint.load_param_into_plan(plan, values, initial, where="initial")
    return plan, values, synthetic_batches(graph, steps, seed)


def world_size(plan) -> int:
    """How many ranks run `plan`: its devices, or every stage's for a pipeline plan."""
    return plan.device_num if plan.pipeline is None else plan.pipeline.device_num


def check_training(net, optimizer, context, steps: int) -> None:
    """A `ConfigError` before anything is planned when `net` cannot be trained as asked: no
    optimiser anywhere (a forward-only cell would "train" steps that change nothing), or not a
    positive number of steps."""
    if training_parts(net, context, optimizer)[1] is None:
        raise ConfigError(
            f"training needs a loss and an optimiser: pass TrainOneStepCell(WithLossCell(net, loss_fn), optimizer) "
            f"(or an optimizer, or set phase='train'), got a {type(net).__name__} that only computes a forward pass"
        )
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ConfigError(f"training needs a positive whole number of steps, got steps={steps!r}")


class Progress:
    """A one-line progress bar on a terminal (stderr), one log line per step otherwise."""

    def __init__(self, total: int, log=print, stream=sys.stderr):
        self.total, self.log, self.stream, self.started = total, log, stream, time.perf_counter()
        self.bar = stream.isatty() and total >= 20

    def __call__(self, step: int, loss: float) -> None:
        if self.log is not None:
            self.log(f"step {step + 1}/{self.total}: loss {loss:.7f}")
        if self.bar:
            done = (step + 1) * 30 // self.total
            rate = (step + 1) / max(time.perf_counter() - self.started, 1e-9)
            self.stream.write(f"\r[{'#' * done}{'.' * (30 - done)}] {step + 1}/{self.total} {rate:.1f} steps/s")
            self.stream.write("\n" if step + 1 == self.total else "")
            self.stream.flush()


def relative_error(got: dict | tuple, expected: dict | tuple) -> float:
    """The largest difference relative to the largest reference magnitude, over all the
    values together (a loss curve, or every parameter of the model).

    Why not per tensor: a parameter whose exact gradient is zero (an attention key's bias:
    softmax ignores a constant shift) gets rounding noise as gradient, which Adam scales up to
    full steps of either sign; on its own scale no two summation orders agree.

    Example:
        >>> relative_error((1.0, 2.5), (1.0, 2.0)), relative_error({"w": np.ones(2), "b": np.zeros(1)}, {"w": np.ones(2), "b": np.ones(1)})
        (0.25, 1.0)
    """
    if isinstance(expected, tuple):
        got, expected = {"loss": got}, {"loss": expected}
    difference = max(float(np.max(np.abs(np.asarray(got[k], np.float64) - expected[k]), initial=0.0)) for k in expected)
    scale = max(float(np.max(np.abs(np.asarray(expected[k], np.float64)), initial=0.0)) for k in expected)
    return difference / (scale or 1.0)


def model_parameters(graph, values: dict) -> dict:
    """The trained parameters among `values` (not the optimiser state)."""
    return {name: array for name, array in values.items() if f"grad/{name}" in graph.tensors}


def train(cell, inputs, steps: int = 20, seed: int = 0, log=print, context=None, initial: dict | None = None,
          save_checkpoint=None) -> TrainReport | None:
    """Plan `cell` (a `TrainOneStepCell`), train it `steps` steps on a synthetic dataset and
    compare the loss curve and final parameters with the stand-alone run. Rank 0 (or the only
    process) returns the report; other MPI ranks return None.

    Training starts from `initial` when given (see `training_plan`); with `save_checkpoint` (a
    path) rank 0 saves the final whole parameters and optimiser state there (`.npz`,
    `runtime.checkpoint.save_checkpoint`).
    """
    plan, values, batches = training_plan(cell, None, inputs, steps, seed, context, initial)
    if log is not None and get_rank() == 0:
        devices = f"{world_size(plan)} device{'s' if world_size(plan) > 1 else ''}"
        log(f"{type(cell).__name__} on {devices}, {plan.mode}: the plan of one training step\n{plan.table()}")
    if launched_by_mpiexec():
        from autostrat.runtime.mpi import MpiBackend
        result = train_collective(plan, MpiBackend(), values, batches, Progress(steps, log))
        if result is None:
            return None
    else:
        result = train_locally(plan, values, batches, Progress(steps, log))
    if save_checkpoint is not None:
        checkpoint.save_checkpoint(result, save_checkpoint)
    return compare(plan, result, train_reference(reference_graph(plan), values, batches))


def compare(plan, result: TrainingResult, reference: TrainingResult, tolerance: float = 1e-5) -> TrainReport:
    """The report: both loss curves, the largest relative differences, the bytes per phase and
    the peak memory per rank."""
    loss_error = relative_error(result.losses, reference.losses)
    # Against an independent reference (`train_reference`), each parameter and state on its own scale too.
    worst = tensor_errors(result.parameters, reference.parameters, reference.pooled) if reference.reference else None
    parameter_error = relative_error(model_parameters(plan.graph, result.parameters), model_parameters(plan.graph, reference.parameters))
    lines = [f"{'step':>4}  {world_size(plan)}-rank loss  stand-alone loss"]
    lines += [f"{i + 1:>4}  {a:>14.7f}  {b:>16.7f}" for i, (a, b) in enumerate(zip(result.losses, reference.losses))]
    if any(not op.attr_dict.get("gradients_mean", True) for op in plan.graph.ops.values()):
        lines.append("gradients_mean=False (MindSpore's default): a replicated parameter's gradient is the sum over its "
                     "replicas; the stand-alone run sums as many copies of it (reference_graph)")
    measured = result.measured[0] if result.measured else {}
    phases = ", ".join(f"{k} {v}" for k, v in measured.items() if k not in ("gather", "pipeline") or v)  # ZeRO-3, pipelines only
    lines += [
        f"bytes per step on rank 0 (counted on the wire, at every send): {phases}; "
        f"{'measured = predicted on every rank' if result.bytes_match else 'MISMATCH between measured and predicted'}",
        f"  ({PHASE_LEGEND})",
        *([memory_line(list(result.predicted_peaks) or result.predicted_peak, list(result.measured_peaks))]
          if result.measured_peaks else []),
        *result.notes,
        f"loss curve vs stand-alone: max relative error {loss_error:.3g}; final parameters: {parameter_error:.3g} "
        f"(limit {tolerance:g}): {'OK' if max(loss_error, parameter_error) <= tolerance else 'FAILED'}",
        *([reference_line(reference.reference, worst[3], worst[1], worst[2])] if worst else []),
    ]
    return TrainReport(result, reference, loss_error, parameter_error, tolerance, "\n".join(lines), worst or (0.0, 0.0, 1.0, ""))
