"""``optimizer(grads)`` of MindSpore's functional loop: the whole training step, planned.

When the gradients of a `value_and_grad` call reach the optimiser deferred (`frontend.deferred`)
and differentiate exactly the optimiser's parameters, `PlannedStep` plans the training step as
`Model.train` does (`api.plan_for` with the optimiser: forward, loss, backward, gradient
synchronisation, the update split over the devices; the context's recompute, parallel
optimizer, strategy checkpoint and ``save_graphs`` honoured; pipeline stages when the loss
function only calls an `nn.PipelineCell`) and runs it on the ranks: threads,
or the MPI ranks under mpiexec. Between steps the trained parameters are written back into the
network's Parameters (a loop may read or change them) and the optimiser state is kept on the
optimiser. With ``AUTOSTRAT_CHECK=1`` every step is checked against the stand-alone run of the
same step (`train.compare`), and the process reports the checks when it exits.

Otherwise (gradients computed or changed before the optimiser) the update runs unsplit on the
whole gradients on every rank, as before, unless a context setting needs the whole step:
`refuse_partial_step` then raises before the step runs, naming the setting and the path.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from autostrat.autodiff import gradient_name
from autostrat.autodiff.builder import GradBuilder
from autostrat.autodiff.recompute import RECOMPUTE_PREFIX, in_cell
from autostrat.errors import ConfigError, RuntimeBackendError
from autostrat.frontend.api import plan_for
from autostrat.frontend.cell import recomputed_cells
from autostrat.frontend.context import current_context
from autostrat.frontend.deferred import pending_call
from autostrat.frontend.batches import batch_split
from autostrat.frontend.global_batch import global_arrays
from autostrat.frontend.ms_context import graphs_folder
from autostrat.frontend.tensor import Parameter, Tensor
from autostrat.frontend.world import CheckTally, checking, get_rank, world_backend
from autostrat.ir import Graph, TensorInfo
from autostrat.runtime.executor import graph_values, single_device_step
from autostrat.runtime.job import check_indices
from autostrat.runtime.training import reference_graph, train_collective, train_locally, train_reference
from autostrat.search.precision import check_fp32_loop


def whole_step_settings(context, cell=None) -> list[str]:
    """The context settings (and `cell`'s recompute marks) that act only on a planned whole
    training step, as ``key=value``.

    Example:
        >>> from autostrat.frontend.context import ParallelContext
        >>> whole_step_settings(ParallelContext(enable_parallel_optimizer=True, pipeline_stages=2))
        ['pipeline_stages=2', 'enable_parallel_optimizer=True']
    """
    settings = [f"{key}={getattr(context, key)!r}" for key, default in
                (("pipeline_stages", 1), ("enable_parallel_optimizer", False), ("auto_recompute", False),
                 ("strategy_ckpt_save_file", ""), ("strategy_ckpt_load_file", "")) if getattr(context, key) != default]
    marked = recomputed_cells(cell) if cell is not None else ()
    return settings + ([f"recompute() on {', '.join(path or '<network>' for path in marked)}"] if marked else [])


def refuse_partial_step(path: str, cell=None) -> None:
    """A `ConfigError` when a setting that needs the whole training step planned is set while
    `path` runs only part of it (see `whole_step_settings`)."""
    settings = whole_step_settings(current_context(), cell)
    if settings:
        raise ConfigError(f"{settings[0]} needs the whole training step planned, but {path}: pass value_and_grad's "
                          f"gradients unchanged (or through nn.DistributedGradReducer) to optimizer(grads), or use "
                          f"Model.train")


class FunctionalStep:
    """The functional half of a MindSpore optimizer: ``optimizer.parameters`` and
    ``optimizer(grads)`` (mixed into `nn.SGD`, `nn.Momentum`, `nn.Adam`)."""

    @property
    def parameters(self) -> tuple:
        return self.__dict__.get("_parameters", ())

    def __call__(self, grads) -> None:
        """Run the planned training step of deferred `grads` (see the module docstring), or
        update `parameters` with computed `grads` (one per parameter, in order)."""
        parameters = self.parameters
        if len(grads) != len(parameters):
            raise ConfigError(f"{type(self).__name__}(grads): expected {len(parameters)} gradients (one per parameter), "
                              f"got {len(grads)}")
        call, mean = pending_call(grads)
        if call is not None:
            if [id(w) for w in call.grad_fn.weights] == [id(p) for p in parameters]:
                return _run_whole_step(self, call, mean, getattr(grads, "reducer", ""))
            call.compute("optimizer(grads) updates other parameters than value_and_grad differentiates")
        refuse_partial_step(f"{type(self).__name__}(grads) updates with gradients computed before it")
        _update_unsplit(self, parameters, grads)


def _run_whole_step(optimizer, call, mean: bool | None, reducer: str) -> None:
    """Run `call`'s training step with `optimizer`, its replicas' gradients combined as `mean`
    says (None: as the context's `gradients_mean`)."""
    context = current_context()
    mean = context.gradients_mean if mean is None else mean
    whole = global_arrays(call.arrays, batch_split(context))
    key = (id(optimizer), mean, tuple((array.shape, array.dtype.name) for array in whole))
    if key not in call.grad_fn.steps:
        call.grad_fn.steps[key] = PlannedStep(call.grad_fn, optimizer, mean, whole, reducer, call.arrays)
    call.stepped_with(call.grad_fn.steps[key].run(whole))


class PlannedStep:
    """The plan of one training step of a functional loop, run step after step."""

    def __init__(self, grad_fn, optimizer, mean: bool, whole: list, reducer: str, given: list):
        from autostrat.frontend.functional import FunctionCell  # it imports this module's users
        from autostrat.frontend.model import stand_ins

        context = replace(current_context(), gradients_mean=mean, phase="train")
        self.optimizer, self.context = optimizer, context
        network = planned_network(FunctionCell(grad_fn.fn, loss_only=True), stand_ins(whole), context.device_num)
        self.plan = plan_for(network, stand_ins(whole), context, optimizer=optimizer)
        check_fp32_loop(self.plan.precision, "the functional loop (value_and_grad with an optimizer)")
        self.graph = reference_graph(self.plan)
        trained = {id(value) for name, value in self.graph.values.items() if gradient_name(name) in self.graph.tensors}
        if trained != {id(p) for p in optimizer.parameters}:
            raise ConfigError(f"{type(optimizer).__name__}(grads): the network trains {len(trained)} parameters, the "
                              f"optimizer holds {len(optimizer.parameters)}: give the optimizer net.trainable_params()")
        self.steps = 0
        if get_rank() == 0:
            print("\n".join(describe_step(self.plan, context, optimizer, reducer, whole, given)), flush=True)

    def run(self, whole: list) -> np.ndarray:
        """One step on the global batch `whole`: the loss; the parameters written back."""
        from autostrat.frontend.model import batch_values

        batch = batch_values(tuple(whole), self.graph.inputs(), self.steps)
        check_indices(self.graph, batch, f"value_and_grad inputs of step {self.steps + 1}")
        state = self.optimizer.__dict__.setdefault("_planned_state", {})
        values = graph_values(self.graph, {}) | state
        backend = world_backend()
        if backend is None:
            result = train_locally(self.plan, values, [batch])
        else:
            result = train_collective(self.plan, backend, values, [batch], every_rank=True)
        owners = self.graph.values
        for name, array in result.parameters.items():
            if isinstance(owners[name], Parameter):
                owners[name].set_data(array)
            else:
                state[name] = array
        self.steps += 1
        if checking() and (backend is None or backend.rank == 0):
            _check_step(self.plan, result, values, batch, self.steps)
        return np.asarray(result.losses[0], np.float32)


def planned_network(function, inputs, device_num: int):
    """The cell a functional step plans: the `nn.PipelineCell` that `function` (a
    `FunctionCell` returning the loss) does nothing but call, so that its stages and
    micro-batches are planned as `Model.train` plans them; else `function` itself."""
    from autostrat.frontend.pipeline import PipelineCell
    from autostrat.frontend.tracing import trace

    pipelines = [(path, cell) for path, cell in function.cells_and_names() if isinstance(cell, PipelineCell)]
    if len(pipelines) != 1:
        return function
    path, cell = pipelines[0]
    graph = trace(function, *inputs, device_num=device_num)
    inside = all(in_cell(name, path) for name in graph.ops) and graph.outputs[0] in graph.tensors
    return cell if inside and graph.tensors[graph.outputs[0]].producer in graph.ops else function


def describe_step(plan, context, optimizer, reducer: str, whole: list, given: list) -> list[str]:
    """What the settings did to a functional loop's planned step, one line each."""
    from autostrat.frontend.train import world_size  # train imports this module: read at call time

    rows = whole[0].shape[0] if whole and whole[0].ndim else 0
    split = batch_split(context)
    shares = ("every rank given the whole batch (full_batch=True)" if split.full_batch or split.ranks == 1
              else f"{split.ranks} data-parallel ranks' shares of {given[0].shape[0]} rows (full_batch=False)")
    lines = [f"functional loop: one training step planned whole (forward, loss, backward, gradient synchronisation, "
             f"{type(optimizer).__name__} update) on {world_size(plan)} devices, {plan.mode}; global batch {rows} rows: "
             f"{shares}",
             f"  gradients: the {'mean' if context.gradients_mean else 'sum'} over each parameter's replicas "
             f"({reducer + ', ' if reducer else ''}gradients_mean={context.gradients_mean})"]
    if plan.pipeline is not None:
        pipeline = plan.pipeline
        chunks = f" ({pipeline.chunks} on each of {pipeline.devices} device groups)" if pipeline.chunks > 1 else ""
        lines.append(f"  pipeline: {pipeline.stages} stages{chunks} of {pipeline.group_size} devices, {pipeline.micro_batches} "
                     f"micro-batches, {pipeline.schedule} schedule")
    if plan.optimizer_shard is not None:
        lines.append(f"  optimizer sharded (enable_parallel_optimizer): {_sharded_updates(plan)}")
    recomputed = [name.removeprefix(RECOMPUTE_PREFIX) for name in plan.graph.ops if name.startswith(RECOMPUTE_PREFIX)]
    if recomputed:
        lines.append(f"  recomputed in the backward: {', '.join(recomputed)}")
    if context.strategy_ckpt_load_file:
        lines.append(f"  strategy checkpoint loaded from {context.strategy_ckpt_load_file}")
    if context.strategy_ckpt_save_file:
        lines.append(f"  strategy checkpoint saved to {context.strategy_ckpt_save_file}")
    folder = graphs_folder(context.global_rank)
    if folder is not None:
        lines.append(f"  IR dumped to {folder} (save_graphs)")
    return lines


def _sharded_updates(plan) -> str:
    """Which parameters' updates the parallel optimizer split further than the parameter
    itself is split (its forward layout), and over how many devices."""
    split = []
    for name in sorted(plan.graph.values):
        update = plan.ops.get(f"optimizer/{name}")
        if update is None:
            continue
        parts = int(np.prod(update.strategy.to_tuples()[0]))
        if parts > plan.device_num // plan.replicas(name):  # the slices the forward reads it in
            split.append(f"{name} over {parts}")
    threshold = plan.optimizer_shard.threshold_bytes
    return ("updates split: " + ", ".join(split)) if split else (
        f"no update split further (each parameter is under parallel_optimizer_threshold, {threshold} bytes, or "
        f"already split over every device)")


TOLERANCE = 1e-5
_TALLY = CheckTally(lambda t: f"functional loop: {t.count} planned training step(s) checked against one device ({t.note}): "
                              f"max relative error {t.error:.3g} (limit {TOLERANCE:g}), bytes per phase measured = predicted: OK")


def _check_step(plan, result, values: dict, batch: dict, step: int, tolerance: float = TOLERANCE) -> None:
    """Compare step `step` (from 1) of a plan with the stand-alone run of it; a plan's first
    step's full report is printed, a difference raises, and the process reports the checks
    when it exits."""
    from autostrat.frontend.train import compare  # train imports this module: read at call time

    report = compare(plan, result, train_reference(reference_graph(plan), values, [batch]), tolerance)
    if step == 1 or not report.ok:
        print(f"functional loop, step {step} against one device:\n{report.text}", flush=True)
    if not report.ok:
        raise RuntimeBackendError("the functional loop's planned step differs from the stand-alone run (see the report above)")
    _TALLY.add(max(report.loss_error, report.parameter_error), report.reference.reference or "autostrat's kernels")


def _update_unsplit(optimizer, parameters: tuple, grads) -> None:
    """The optimiser's update of `parameters` with whole gradients `grads`, unsplit on every
    rank, keeping its state (the loop may have changed the gradients)."""
    if "_update" not in optimizer.__dict__:
        object.__setattr__(optimizer, "_update", _update_graph(optimizer, parameters))
    graph, state = optimizer._update
    values = dict(state)
    for index, (parameter, gradient) in enumerate(zip(parameters, grads)):
        array = np.asarray(gradient.asnumpy() if isinstance(gradient, Tensor) else gradient)
        if array.shape != parameter.shape:
            raise ConfigError(f"{type(optimizer).__name__}(grads): gradient {index} has shape {list(array.shape)}, its "
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
