"""Pipeline plans: a training step split into stages, each on its own group of devices.

A pipeline plan is the plan of one micro-batch's training graph on one stage's devices
(``device_num / stages`` of them: every stage's ops get their strategies from the same search,
seeds included), plus the stage every op runs on (`Pipeline`). Rank ``r`` is device
``r % group`` of stage ``r // group``; the ranks of a stage run its ops exactly as the plan says,
and a tensor one stage produces and another reads is sent point to point, each device its slice
to the same device of the other stage, in the producer's layout; the receiving stage then
redistributes it like any edge (the sender's layout to the consumer's), so the plan's
redistributions stay the ones on every stage. A partial tensor is first resolved on the
sending stage into the layout its readers want (`crossings`: the same steps, run there), and
its smaller pieces sent.

Which stage runs what (cases):
1. Searched: the stages split the model's units (`stages.op_units`: what precedes the
   repeated layers, each repeated layer, what follows) into contiguous ranges
   (`schedule_split.split_stages`). Given by the cells' ``pipeline_stage`` (any cells, as MindSpore
   marks them): every op takes its stage by MindSpore's rule (`cell_stages`), each stage one unit.
2. A backward op runs where its forward op runs, a parameter's update where the parameter is
   first read; the sum of a tensor's gradients from several readers (``accumulate/``) runs on
   their stage when they all run on one, so that the sum, not each part, travels back.
3. An update op that reads no gradient (an optimiser's step counters and the step's learning
   rate) runs on every stage: each keeps its own copy, the same number everywhere, instead of
   waiting for one stage's at the end of every step.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field, replace

from autostrat.autodiff import op_phase
from autostrat.errors import ConfigError, InfeasibleError
from autostrat.search.cell_stages import marked_units, stage_cells
from autostrat.search.crossings import stage_crossings
from autostrat.search.prediction import op_times
from autostrat.search.schedules import SCHEDULE_ORDERS, Schedule, schedule_orders
from autostrat.search.search import search
from autostrat.search.stage_buffers import stage_peaks
from autostrat.search.schedule_split import AUTO, choose_schedule, priced_split, split_stages
from autostrat.search.stages import StageSplit, op_units, unit_costs

BUDGET_ROUNDS = 16  # splits tried under a budget before the search gives up (`_fitting`)
MODEL_MARGIN = 10  # percent: how far the split's model may miss a stage's exact peak, either way (tested)


@dataclass(frozen=True)
class Pipeline:
    """The pipeline dimension of a training plan: `stages` model stages, `chunks` of them on each
    of `devices` groups of `group_size` devices (stage ``k`` on the group `device_of` says:
    ``k mod devices``, zbv's V otherwise), run `micro_batches` micro-batches per step in the
    orders of `schedule` (`search.schedules`); `op_stages` gives the stage of every op but the
    `shared` ones, which every stage runs; `split` is the stage split over the model's units
    with its predicted slots, step time, bubble and the peaks of the model it was searched with;
    `peak_bytes` the exact peak per device of every device group's buffers
    (`stage_buffers.stage_peaks`), what a run measures; `origin` says who chose it."""

    stages: int
    group_size: int
    micro_batches: int
    schedule: str
    split: StageSplit
    op_stages: dict
    shared: frozenset = frozenset()
    origin: str = "searched"

    once_ns: tuple[int, ...] = ()  # per stage: its gradient synchronisation and updates, once per step
    shared_once_ns: int = 0  # of which the shared update ops' (`shared_update_ops`), which a device group runs once
    peak_bytes: tuple[int, ...] = ()  # per stage, per device: the exact peak of its buffers
    cells: tuple[str, ...] = ()  # per stage, its marked cells and unmarked ops (`cell_stages.stage_cells`), when marked
    chunks: int = 1  # model stages per device group (virtual stages: interleaved_1f1b, zbv)
    crossings: tuple = ()  # partial tensors reduced on the sending stage before they are sent (`crossings.Crossing`)
    # Builds the whole batch's training graph (the reference) when first asked (`batch_graph`):
    # an estimate never reads it, and it costs what building the micro-batch's graph costs.
    batch_graph_of: object = field(default=None, compare=False, repr=False)

    @functools.cached_property
    def batch_graph(self):
        """The whole batch's training graph (the single-device reference a run is checked against)."""
        return None if self.batch_graph_of is None else self.batch_graph_of()

    @property
    def devices(self) -> int:
        """The device groups (each holding `chunks` model stages)."""
        return self.stages // self.chunks

    @property
    def device_num(self) -> int:
        return self.devices * self.group_size

    @property
    def orders(self) -> Schedule:
        """Every device group's instruction order (`schedules.schedule_orders`)."""
        return schedule_orders(self.schedule, self.devices, self.micro_batches, self.chunks)

    def device_of(self, stage: int) -> int:
        """The device group that runs model stage `stage`."""
        return self.orders.device(stage)

    @property
    def device_once_ns(self) -> tuple[int, ...]:
        """Per device group, the synchronisation and updates it runs once per step: those of
        every model stage it holds (`chunks` of them when interleaved), the shared update ops
        once (a group runs them on its first chunk only, `runtime.stage_program`)."""
        totals = [-(self.chunks - 1) * self.shared_once_ns] * self.devices if self.once_ns else []
        for stage, once in enumerate(self.once_ns):
            totals[self.device_of(stage)] += once
        return tuple(totals)

    @property
    def step_time_ns(self) -> int:
        """The micro-batches' slots (`StageSplit.step_time_ns`), then the slowest device
        group's synchronisation and updates (each runs its own at the end of the step: with
        virtual stages, every chunk's it holds; the slowest model stage's alone undercounted an
        interleaved group by its other chunks')."""
        return self.split.step_time_ns + max(self.device_once_ns, default=0)

    def runs_on(self, op: str, stage: int) -> bool:
        return op in self.shared or self.op_stages[op] == stage

    def stage_label(self, op: str) -> str:
        return "all" if op in self.shared else str(self.op_stages[op])

    def summary(self) -> str:
        """Two lines: the stages and their units, and the predicted step, bubble and peaks.

        Example: see `plan_pipeline`.
        """
        units = ", ".join(f"{s}: units {first}-{end - 1}" for s, (first, end) in enumerate(self.split.bounds))
        if self.cells:
            units = "; ".join(f"stage {s}: {cells}" for s, cells in enumerate(self.cells))
        chunks = f" ({self.chunks} on each of {self.devices} device groups)" if self.chunks > 1 else ""
        return (f"pipeline: {self.stages} stages{chunks} x {self.group_size} devices, {self.micro_batches} micro-batches, "
                f"{self.schedule} ({self.origin}; {units})\n"
                f"pipeline predicted: step {self.step_time_ns / 1e6:,.3f} ms, bubble {self.split.bubble:.1%}, "
                f"slot per stage (ms) {', '.join(f'{t / 1e6:,.3f}' for t in self.split.slot_ns)}, "
                f"peak per device per stage (bytes) {', '.join(f'{p:,}' for p in self.peak_bytes)} "
                f"(the split's model: {', '.join(f'{p:,}' for p in self.split.peak_bytes)})")

    def to_dict(self) -> dict:
        return {
            "stages": self.stages, "group_size": self.group_size, "micro_batches": self.micro_batches,
            "schedule": self.schedule, "origin": self.origin, "bounds": [list(b) for b in self.split.bounds],
            "slot_ns": list(self.split.slot_ns), "peak_bytes": list(self.peak_bytes),
            "model_peak_bytes": list(self.split.peak_bytes),
            "once_ns": list(self.once_ns), "step_time_ns": self.step_time_ns, "bubble": self.split.bubble,
            **({"cells": list(self.cells)} if self.cells else {}),
            **({"chunks": self.chunks} if self.chunks > 1 else {}),
        }


def shared_update_ops(graph) -> frozenset[str]:
    """The update ops that read no gradient, directly or through another op (case 3 above).

    Example (Adam's step counters and step rate; Momentum has none):
        >>> from autostrat.autodiff import Adam, build_training
        >>> from autostrat.frontend import trace
        >>> from autostrat.models import FFN
        >>> from autostrat.nn import Tensor
        >>> sorted(shared_update_ops(build_training(trace(FFN(), Tensor(shape=(64, 64))), Adam())))[:3]
        ['optimizer/bias1', 'optimizer/bias2', 'optimizer/next_beta1_power']
    """
    shared: set[str] = set()
    for name, op in graph.ops.items():  # in topological order
        if op_phase(name) != "update":
            continue
        producers = (graph.tensors[t].producer for t in op.inputs)
        if all(producer not in graph.ops or producer in shared for producer in producers):
            shared.add(name)
    return frozenset(shared)


def plan_pipeline(graph, device_num: int, stages: int, micro_batches: int, options, schedule: str = "1f1b",
                  marks: dict[str, int] | None = None, progress=None, chunks: int | None = None):
    """The pipeline plan of `graph` (the training graph of one micro-batch) on `device_num`
    devices in `stages` equal groups, each holding `chunks` model stages (default: the
    schedule's, `schedules.schedule_orders`): the search (`options`, seeds included) on one
    group's devices, then the split into ``stages * chunks`` model stages, searched under
    ``options.max_device_memory`` (a budget for a group's share, checked on every group's exact
    peak: `_fitting`) or given by `marks` (cell path -> ``pipeline_stage``: `cell_stages`,
    checked before the search). The split is priced by its schedule's orders
    (`schedule_split`: the simulated step, the memory model replayed per device group).

    Example (a 4-block stack on 8 devices as 2 stages of 4, 4 micro-batches):
        >>> from autostrat.autodiff import Adam, build_training
        >>> from autostrat.frontend import trace
        >>> from autostrat.models import TransformerStack
        >>> from autostrat.search import SearchOptions
        >>> net = TransformerStack(layers=4, hidden=64, heads=8, seq=16, batch=2)
        >>> plan = plan_pipeline(build_training(trace(net, *net.example_inputs()), Adam()), 8, 2, 4, SearchOptions())
        >>> plan.device_num, plan.pipeline.split.bounds, plan.pipeline.op_stages["blocks.3.ffn2.matmul"]
        (4, ((0, 3), (3, 6)), 1)
        >>> plan.pipeline.summary().splitlines()[0]
        'pipeline: 2 stages x 4 devices, 4 micro-batches, 1f1b (searched; 0: units 0-2, 1: units 3-5)'
    """
    if schedule not in SCHEDULE_ORDERS + (AUTO,):
        raise ConfigError(f"pipeline_schedule must be one of {', '.join(SCHEDULE_ORDERS + (AUTO,))}, got {schedule!r}")
    if stages < 1 or device_num % stages:
        raise ConfigError(f"pipeline_stages must divide device_num: {stages} stages on {device_num} devices")
    if schedule == AUTO:
        if marks:
            raise ConfigError("pipeline_schedule auto chooses the schedule with the split, but cells set pipeline_stage: "
                              "name a schedule for marked stages, or leave the split to the search")
        return _chosen(graph, device_num, stages, micro_batches, options, progress, chunks)
    chunks = schedule_orders(schedule, stages, micro_batches, chunks).chunks  # checks the chunks and micro-batches
    group, model_stages = device_num // stages, stages * chunks
    marked = marked_units(graph, marks, model_stages) if marks else None
    plan = search(graph, group, replace(options, max_device_memory=None, micro_batches=micro_batches), progress)
    layout = _Layout(model_stages, group, micro_batches, schedule, chunks)
    if marked is None:
        units = op_units(graph) if model_stages > 1 else dict.fromkeys(graph.ops, 0)  # micro-batches alone: one unit
        staging = _Staging(plan, units, layout, options.hardware)
        return _fitting(staging, unit_costs(plan, options.hardware, units), options.max_device_memory)
    staging = _Staging(plan, marked, layout, options.hardware)
    split = priced_split(unit_costs(plan, options.hardware, marked, stage_units=True),
                         tuple((stage, stage + 1) for stage in range(model_stages)), layout.orders)
    staged = staging.staged(split, "pipeline_stage of cells")
    staged = replace(staged, pipeline=replace(staged.pipeline, cells=stage_cells(graph, marks, marked, model_stages)))
    peak, budget = max(staged.pipeline.peak_bytes), options.max_device_memory
    if budget is not None and peak > budget:
        raise InfeasibleError(f"the stages the cells' pipeline_stage gives peak at {peak:,} bytes per device, over "
                              f"max_device_memory = {budget:,}; mark other stages or let the split be searched")
    return staged


def _chosen(graph, device_num: int, stages: int, micro_batches: int, options, progress, chunks: int | None):
    """`plan_pipeline` with ``pipeline_schedule: auto``: every candidate schedule and chunks
    (`schedule_split.choose_schedule`) split under the budget by the split's model, the
    fastest whose exact peaks fit (`_fitting`), as the search's choice."""
    group = device_num // stages
    plan = search(graph, group, replace(options, max_device_memory=None, micro_batches=micro_batches), progress)
    units = op_units(graph) if stages > 1 else dict.fromkeys(graph.ops, 0)
    costs, budget = unit_costs(plan, options.hardware, units), options.max_device_memory
    allowed = None if budget is None else budget * (100 + MODEL_MARGIN) // 100
    refused = []
    for choice in choose_schedule(lambda m: costs, stages, (micro_batches,), budget, allowed, chunks):
        layout = _Layout(stages * choice.chunks, group, micro_batches, choice.schedule, choice.chunks)
        try:
            staged = _fitting(_Staging(plan, units, layout, options.hardware), costs, budget)
        except InfeasibleError as error:
            refused.append(f"{choice.schedule} x {choice.chunks}: {error}")
            continue
        return replace(staged, pipeline=replace(staged.pipeline, origin="schedule and split searched"))
    reasons = "; ".join(refused) or "no schedule's split fits by the split's memory model"
    raise InfeasibleError(f"pipeline_schedule auto: no schedule of {stages} device groups x {group} devices with "
                          f"{micro_batches} micro-batches fits max_device_memory = {budget:,}: {reasons}")


@dataclass(frozen=True)
class _Layout:
    """The model stages of a pipeline and how its device groups run them."""

    stages: int
    group: int
    micro_batches: int
    schedule: str
    chunks: int

    @property
    def orders(self) -> Schedule:
        """The orders the device groups run (`schedules.schedule_orders`)."""
        return schedule_orders(self.schedule, self.stages // self.chunks, self.micro_batches, self.chunks)


@dataclass(frozen=True)
class _Staging:
    """The plan of one stage's devices and how its ops make stages: turns a split into the
    pipeline plan."""

    plan: object
    units: dict
    layout: _Layout
    hardware: object

    def staged(self, split, origin: str):
        """The pipeline plan of `split`, with the exact peak of every device group's buffers."""
        graph, shared, layout = self.plan.graph, shared_update_ops(self.plan.graph), self.layout
        unit_stage = {unit: stage for stage, (first, end) in enumerate(split.bounds) for unit in range(first, end)}
        op_stages = {name: unit_stage[self.units[name]] for name in graph.ops if name not in shared}
        for name, op in graph.ops.items():  # in topological order: an accumulate's inputs are placed first
            producers = {op_stages.get(graph.tensors[t].producer) for t in op.inputs}
            if name.startswith("accumulate/") and len(producers) == 1 and None not in producers:
                op_stages[name] = producers.pop()
        once, shared_once = _once_ns(self.plan, op_stages, shared, layout.stages, self.hardware)
        pipeline = Pipeline(layout.stages, layout.group, layout.micro_batches, layout.schedule, split, op_stages, shared,
                            origin, once, shared_once_ns=shared_once, chunks=layout.chunks)
        pipeline = replace(pipeline, crossings=stage_crossings(self.plan, pipeline))
        staged = replace(self.plan, pipeline=pipeline)
        return replace(staged, pipeline=replace(pipeline, peak_bytes=stage_peaks(staged)))


def _fitting(staging: _Staging, costs, budget: int | None):
    """The searched split's pipeline plan whose stages' exact peaks fit `budget`.

    The split is searched with its model (`schedule_split.group_peaks`), which misses a stage's exact
    peak by up to `MODEL_MARGIN` either way (it counts whole micro-batches' activations and
    gradients, not each buffer): it allows stages whose model is that much over `budget`, so
    that no split that fits is left out, and the exact peak decides. A stage's exact peak
    depends only on its units and its position, so a stage found over is excluded and the
    split searched again (`BUDGET_ROUNDS` at most)."""
    allowed, excluded, staged = None if budget is None else budget * (100 + MODEL_MARGIN) // 100, set(), None
    layout = staging.layout
    for _ in range(BUDGET_ROUNDS):
        try:
            split = split_stages(costs, layout.orders, budget, allowed, frozenset(excluded))
        except InfeasibleError:
            if staged is None:
                raise
            others = f"every other split has a stage over by its buffers or over {MODEL_MARGIN} % by its model"
            break
        staged = staging.staged(split, "searched")
        peaks = staged.pipeline.peak_bytes
        if budget is None or max(peaks) <= budget:
            return staged
        pipeline = staged.pipeline  # a device group over: every stage it runs is excluded
        excluded |= {(stage, *split.bounds[stage]) for stage in range(layout.stages) if peaks[pipeline.device_of(stage)] > budget}
    else:
        others = f"the search stopped after {BUDGET_ROUNDS} splits"
    pipeline = staged.pipeline
    raise InfeasibleError(
        f"no split into {layout.stages} pipeline stages found that fits max_device_memory = {budget:,} bytes per device: "
        f"the last split's stages peak at {', '.join(f'{p:,}' for p in pipeline.peak_bytes)} bytes (their buffers; the "
        f"split's model put them at {', '.join(f'{p:,}' for p in pipeline.split.peak_bytes)}); {others}")


def _once_ns(plan, op_stages: dict, shared: frozenset, stages: int, hardware) -> tuple[tuple[int, ...], int]:
    """Per stage, the predicted time of its update ops, the redistributions into them
    (gradient synchronisation) and their writebacks, which run once per step; and of those,
    the shared update ops' (counted in every stage)."""
    totals, shared_ns = [0] * stages, 0
    for name, time_ns in op_times(plan, hardware, ("update",)).items():
        shared_ns += time_ns if name in shared else 0
        for stage in range(stages) if name in shared else (op_stages[name],):
            totals[stage] += time_ns
    return tuple(totals), shared_ns
