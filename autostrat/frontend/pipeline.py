"""Pipeline parallelism, MindSpore's way: ``set_auto_parallel_context(pipeline_stages=S)``,
``cell.pipeline_stage = i`` on sub-cells (optional: the split is searched otherwise) and
`PipelineCell` (``nn.PipelineCell(net, micro_size)``) for the micro-batches.

Planning traces the network twice: on the whole batch (the stand-alone reference, the values
and the batches a run draws) and on one micro-batch (``batch / micro_size`` along dim 0 of
every input), whose training graph `search.pipeline.plan_pipeline` plans on one stage's
devices. So a network's shapes must follow its inputs' batch (``x.shape[0]``), as MindSpore's
`PipelineCell` requires too.
"""

from __future__ import annotations

from dataclasses import replace

from autostrat.errors import AutostratError, ConfigError
from autostrat.frontend.cell import Cell
from autostrat.frontend.tensor import Tensor
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
    batch's training graph rides along as ``plan.pipeline.batch_graph``."""
    stages = context.pipeline_stages
    if context.device_num % stages:
        raise ConfigError(f"pipeline_stages {stages} must divide device_num {context.device_num}")
    if context.auto_recompute:
        raise ConfigError("auto_recompute does not combine with pipeline_stages yet: mark cells with Cell.recompute instead")
    group = context.device_num // stages
    whole = training(trace(net, *inputs, device_num=group), group)
    try:
        micro = training(trace(net, *micro_inputs(inputs, micro_batches), device_num=group), group)
    except AutostratError as error:
        raise type(error)(f"tracing one micro-batch ({micro_batches} per batch): {error}; a network under PipelineCell "
                          f"must take its shapes from its inputs (x.shape[0]), not from a fixed batch") from None
    plan = plan_pipeline(micro, context.device_num, stages, micro_batches, context.search_options(), context.pipeline_scheduler(),
                         pipeline_marks(net), progress)
    return replace(plan, pipeline=replace(plan.pipeline, batch_graph=whole))
