"""Pipeline parallelism, MindSpore's way: ``set_auto_parallel_context(pipeline_stages=S)``,
``cell.pipeline_stage = i`` on any sub-cells (optional: the split of a network's repeated
layers is searched otherwise; `search.cell_stages` says where unmarked ops go), `PipelineCell`
(``nn.PipelineCell(net, micro_size)``) for the micro-batches and, in the functional loop,
`PipelineGradReducer` for the gradients.

Planning traces the network twice: on the whole batch (the stand-alone reference, the values
and the batches a run draws) and on one micro-batch (``batch / micro_size`` along dim 0 of
every input), whose training graph `search.pipeline.plan_pipeline` plans on one stage's
devices. So a network's shapes must follow its inputs' batch (``x.shape[0]``), as MindSpore's
`PipelineCell` requires too.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from autostrat.errors import AutostratError, ConfigError
from autostrat.frontend.cell import Cell
from autostrat.frontend.context import current_context
from autostrat.frontend.tensor import Parameter, Tensor
from autostrat.frontend.tracing import trace
from autostrat.search.pipeline import plan_pipeline


class PipelineCell(Cell):
    """MindSpore's ``nn.PipelineCell(network, micro_size)``: `network` (returning its loss)
    trained on `micro_size` micro-batches per step, their gradients summed before one update.

    Example:
        >>> from autostrat.models import FFN
        >>> cell = PipelineCell(FFN(), micro_size=4)
        >>> cell.micro_size, type(cell.network).__name__
        (4, 'FFN')
    """

    def __init__(self, network, micro_size: int, stage_config=None):
        super().__init__(auto_prefix=False)
        if isinstance(micro_size, bool) or not isinstance(micro_size, int) or micro_size < 1:
            raise ConfigError(f"PipelineCell: micro_size must be a positive integer, got {micro_size!r}")
        if stage_config is not None:
            raise ConfigError("PipelineCell: stage_config is not supported; set cell.pipeline_stage on the sub-cells instead")
        self.network, self.micro_size = network, micro_size

    def construct(self, *inputs):
        return self.network(*inputs)


class PipelineGradReducer(Cell):
    """MindSpore's ``nn.PipelineGradReducer(parameters, scale_sense=1.0, opt_shard=None)`` of
    the functional loop (``grads = reducer(grads)`` between ``grad_fn`` and ``optimizer``).

    In MindSpore, a pipeline step adds every micro-batch's gradients into a buffer per
    parameter and the compiler inserts their reduction over a stage's replicas; the reducer
    returns the buffers divided by `scale_sense` (the loss scale) and zeroes them. A planned
    autostrat step does that summing and reduction itself, as its gradient synchronisation (the
    plan's sync phase, averaged or summed as ``gradients_mean`` says), so the reducer has one
    thing left to do: a call returns the gradients it is given, one per parameter, each divided
    by `scale_sense` (unchanged at 1.0). The functional loop recognises a reducer by
    `is_pipeline_grad_reducer` and leaves the reduction to its plan. `opt_shard` None follows
    the context's ``enable_parallel_optimizer`` as MindSpore does; given, it must agree with it.

    Example:
        >>> import numpy as np
        >>> from autostrat import nn
        >>> weight = nn.Parameter(nn.Tensor(np.ones((2, 2), np.float32)), name="weight")
        >>> reducer = PipelineGradReducer([weight], scale_sense=4.0)
        >>> reducer.is_pipeline_grad_reducer, reducer((nn.Tensor(np.full((2, 2), 2.0, np.float32)),))[0].asnumpy()[0]
        (True, array([0.5, 0.5], dtype=float32))
    """

    is_pipeline_grad_reducer = True

    def __init__(self, parameters, scale_sense=1.0, opt_shard=None):
        super().__init__(auto_prefix=False)
        parameters = tuple(parameters)
        strangers = [type(p).__name__ for p in parameters if not isinstance(p, Parameter)]
        if strangers:
            raise ConfigError(f"PipelineGradReducer: parameters must be Parameters (optimizer.parameters), got {strangers[0]}")
        if isinstance(scale_sense, bool) or not isinstance(scale_sense, (int, float)) or not 0 < scale_sense < math.inf:
            raise ConfigError(f"PipelineGradReducer: scale_sense must be a positive finite number, got {scale_sense!r}")
        if opt_shard not in (None, True, False):
            raise ConfigError(f"PipelineGradReducer: opt_shard must be None, True or False, got {opt_shard!r}")
        object.__setattr__(self, "parameters", parameters)  # not the reducer's own: the optimiser's
        self.scale_sense, self.opt_shard = float(scale_sense), opt_shard

    def construct(self, grads):
        sharded = current_context().enable_parallel_optimizer
        if self.opt_shard is not None and self.opt_shard != sharded:
            raise ConfigError(f"PipelineGradReducer: opt_shard={self.opt_shard} disagrees with the context's "
                              f"enable_parallel_optimizer={sharded}; leave opt_shard None to follow the context")
        grads = tuple(grads)
        if len(grads) != len(self.parameters):
            raise ConfigError(f"PipelineGradReducer: {len(grads)} gradients for {len(self.parameters)} parameters")
        if self.scale_sense == 1.0:
            return grads
        return tuple(Tensor((array / self.scale_sense).astype(array.dtype))
                     for array in (np.asarray(g.asnumpy() if isinstance(g, Tensor) else g) for g in grads))


def pipeline_parts(net) -> tuple:
    """The network a `PipelineCell` wraps and its micro-batch count; (net, 1) for another cell."""
    if isinstance(net, PipelineCell):
        return net.network, net.micro_size
    return net, 1


def pipeline_marks(net) -> dict[str, int]:
    """Cell path -> the ``pipeline_stage`` the user set on that cell (MindSpore's attribute).

    Example:
        >>> from autostrat.models import TransformerStack
        >>> net = TransformerStack(layers=2, hidden=16, heads=2, seq=4, batch=2)
        >>> net.blocks[1].pipeline_stage = 1
        >>> pipeline_marks(net)
        {'blocks.1': 1}
    """
    marks = {}
    for path, cell in net.cells_and_names():
        stage = cell.__dict__.get("pipeline_stage")
        if stage is not None:
            if isinstance(stage, bool) or not isinstance(stage, int) or stage < 0:
                raise ConfigError(f"{path or type(net).__name__}.pipeline_stage must be a non-negative integer, got {stage!r}")
            marks[path] = stage
    return marks


def micro_inputs(inputs, micro_batches: int) -> tuple:
    """Shape-only stand-ins of one micro-batch of `inputs` (dim 0 cut `micro_batches` ways)."""
    cut = []
    for index, tensor in enumerate(inputs):
        shape = tuple(tensor.shape)
        if not shape or shape[0] % micro_batches:
            raise ConfigError(f"PipelineCell: input {index} of shape {list(shape)} cannot be cut into {micro_batches} "
                              f"micro-batches along dim 0 (its batch)")
        cut.append(Tensor(shape=(shape[0] // micro_batches,) + shape[1:], dtype=tensor.dtype))
    return tuple(cut)


def plan_pipeline_for(net, inputs, micro_batches: int, context, training, progress=None):
    """The pipeline plan of `net` (see the module docstring): ``training(graph, device_num)``
    builds the training graph of a traced one, seeded for `device_num` devices; the whole
    batch's training graph rides along as ``plan.pipeline.batch_graph``, built when first read."""
    stages = context.pipeline_stages
    if context.device_num % stages:
        raise ConfigError(f"pipeline_stages {stages} must divide device_num {context.device_num}")
    if context.auto_recompute:
        raise ConfigError("auto_recompute does not combine with pipeline_stages yet: mark cells with Cell.recompute instead")
    group = context.device_num // stages

    def whole():  # the whole batch's, built when a run asks for its reference (`Pipeline.batch_graph`)
        return training(trace(net, *inputs, device_num=group), group)

    try:
        micro = training(trace(net, *micro_inputs(inputs, micro_batches), device_num=group), group)
    except AutostratError as error:
        raise type(error)(f"tracing one micro-batch ({micro_batches} per batch): {error}; a network under PipelineCell "
                          f"must take its shapes from its inputs (x.shape[0]), not from a fixed batch") from None
    schedule, chunks = context.pipeline_schedule_chunks()
    plan = plan_pipeline(micro, context.device_num, stages, micro_batches, context.search_options(), schedule,
                         pipeline_marks(net), progress, chunks)
    return replace(plan, pipeline=replace(plan.pipeline, batch_graph_of=whole))
