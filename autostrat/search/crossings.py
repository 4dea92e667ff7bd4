"""Partial tensors crossing pipeline stages: reduced on the sending stage, then sent.

A tensor one stage writes partial (its producer split a reduction factor) and a stage on
another device group reads is resolved by the reader's redistribution, whose first steps
leave no partial axis: a ReduceScatter into a dim the reader splits, an AllReduce where it
wants the tensor whole (DESIGN: partial is a state, resolved on the edge). Those steps run on
the sending stage's devices (`Crossing.reduce`), which then send the resolved pieces, a
ReduceScatter over ``g`` devices leaving each a ``g``-th of the piece it would have sent
whole; the rest of each reader's redistribution runs on the reading stage (`Crossing.rests`),
from the sent layout. The redistributions are the plan's, cut in two: the bytes and time of
the collectives stay those the search priced, the point-to-point send shrinks.

Cases, per (partial tensor, reading stage on another device group):
1. Every reader of the tensor on that stage redistributes it into a layout that is not
   partial: a `Crossing`. The sent layout is one reader's resolution, the one whose
   collectives, send and other readers' redistributions from it (the plan's own rest where a
   reader resolves alike, else planned as the plan plans an edge) send the fewest bytes per
   device, the first reader's among equals; a reader that wants the tensor whole makes the
   sender AllReduce it (the rest are free slices), never worse than sending it partial.
2. A reader takes the tensor partial (no redistribution, or one into a partial layout), or
   sending it partial and resolving it on the reading stage costs fewer bytes: the partial
   pieces are sent whole, as any key (`runtime.stage_program`), and every reader's
   redistribution runs on the reading stage.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from autostrat.layout import Layout
from autostrat.redistribution import RedistributionPlan
from autostrat.redistribution.algorithms import plan_with_algorithms
from autostrat.search.buffers import DeviceProgram, Event


@dataclass(frozen=True)
class Crossing:
    """Partial `tensor` read on model stage `stage`: `reduce` (the readers' first steps, on the
    writing stage) resolves it into the layout sent; `rests` per reader ``(consumer, input
    index)`` the rest of its redistribution, on the reading stage (no steps: it reads what
    arrives)."""

    tensor: str
    stage: int
    reduce: RedistributionPlan
    rests: tuple[tuple[tuple[str, int], RedistributionPlan], ...]

    @property
    def key(self) -> str:
        """The store key of the resolved pieces (written on the sender, received on the reader)."""
        return f"{self.tensor}>stage{self.stage}"

    @property
    def layout(self) -> Layout:
        """The layout the sender resolves the tensor into and sends."""
        return self.reduce.dst


def resolution(redistribution: RedistributionPlan) -> tuple[RedistributionPlan, RedistributionPlan] | None:
    """`redistribution` of a partial layout cut after its first step leaving no partial axis:
    (the steps up to it, the rest); None when its source is not partial or its target is.

    Example (a partial sum wanted split by rows: one ReduceScatter, nothing after it):
        >>> from autostrat.layout import DeviceMatrix, TensorMap
        >>> from autostrat.redistribution import plan_redistribution
        >>> src = Layout(DeviceMatrix((4,)), TensorMap((-1, -1)), (8, 8), partial=(0,))
        >>> reduce, rest = resolution(plan_redistribution(src, Layout(DeviceMatrix((4,)), TensorMap((0, -1)), (8, 8))))
        >>> [step.kind for step in reduce.steps], str(reduce.dst), rest.steps
        (['ReduceScatter'], '[8, 8] dm[4] tm(0, -1)', ())
    """
    if not redistribution.src.partial or redistribution.dst.partial:
        return None
    steps = redistribution.steps
    end = next(index for index, step in enumerate(steps) if not step.after.partial) + 1
    resolved = redistribution.dst if end == len(steps) else steps[end - 1].after  # the reader's own when no step is left
    return (RedistributionPlan(redistribution.src, resolved, steps[:end], sum(step.bytes for step in steps[:end])),
            RedistributionPlan(resolved, redistribution.dst, steps[end:], sum(step.bytes for step in steps[end:])))


def resolved_readers(plan, tensor: str, readers) -> tuple[RedistributionPlan, tuple] | None:
    """The reduce and the rests (`Crossing`) of partial `tensor` of `plan` for `readers`, its
    ``(consumer, input index)`` pairs on one stage (case 1 of the module docstring); None when
    sending it partial costs fewer bytes (case 2).

    Example: see `stage_crossings`.
    """
    edges = {(edge.consumer, edge.input_index): edge for edge in plan.redistributions if edge.tensor == tensor}
    own = {}  # reader -> (its reduce, its rest): the cut of its own redistribution
    for reader in readers:
        edge = edges.get(reader)
        if edge is not None and edge.shares:
            continue  # it reads an earlier reader's result, not the tensor
        cut = None if edge is None else resolution(edge.plan)
        if cut is None:
            return None  # it reads the tensor partial
        own[reader] = cut
    best, sizes = None, plan.sizes
    whole = _piece_bytes(plan.layouts[tensor], sizes(tensor)) + sum(edges[reader].plan.cost for reader in own)
    for reduce, _ in own.values():  # each reader's resolution a candidate, the first reader's first
        rests = tuple((reader, rest if mine.steps == reduce.steps else _replanned(plan, tensor, reduce.dst, edges[reader].plan.dst))
                      for reader, (mine, rest) in own.items())
        total = reduce.cost + _piece_bytes(reduce.dst, sizes(tensor)) + sum(rest.cost for _, rest in rests)
        if total <= whole and (best is None or total < best[0]):
            best = (total, reduce, rests)
    return None if best is None else best[1:]


def _piece_bytes(layout: Layout, size: int) -> int:
    return math.prod(layout.slice_shape) * size


def _replanned(plan, tensor: str, resolved: Layout, wanted: Layout) -> RedistributionPlan:
    """A reader's redistribution from another reader's resolution, planned as the plan's own
    edges are (`plan.build_plan`: the plan's cost model, the tensor's priced size, each
    collective's algorithm chosen on the plan's hardware)."""
    timing = plan.hardware.alpha_beta(plan.device_num)
    model = timing if plan.cost_model == "time" else None
    return plan_with_algorithms(resolved, wanted, plan.sizes.priced(tensor), model, timing, plan.cost_model)


def stage_crossings(plan, pipeline) -> tuple[Crossing, ...]:
    """Every `Crossing` of the pipeline plan `plan` (`pipeline`: its stages, not yet in `plan`),
    in the graph's tensor order, then by reading stage.

    Example (a split-k matmul ending stage 0, read by a ReLU on stage 1 that splits its rows: the
    ReduceScatter runs on stage 0's devices, each sending a quarter of its partial piece):
        see `tests/test_pipeline_crossings.py`.
    """
    graph, found = plan.graph, []
    for name, info in graph.tensors.items():
        layout, consumers = plan.layouts.get(name), graph.consumers(name)
        if layout is None or not layout.partial or info.producer not in graph.ops:
            continue
        if any(op in pipeline.shared for op in (info.producer, *(consumer for consumer, _ in consumers))):
            continue  # an op every stage runs: the tensor is everywhere, or read everywhere as it is
        writer, by_stage = pipeline.op_stages[info.producer], {}
        for consumer, index in consumers:
            stage = pipeline.op_stages[consumer]
            if pipeline.device_of(stage) != pipeline.device_of(writer):
                by_stage.setdefault(stage, []).append((consumer, index))
        for stage, readers in sorted(by_stage.items()):
            resolved = resolved_readers(plan, name, readers)
            if resolved is not None:
                found.append(Crossing(name, stage, *resolved))
    return tuple(found)


def crossed(plan, program: DeviceProgram) -> DeviceProgram:
    """The device's step `program` with every crossing of the pipeline plan `plan`
    (`crossings.Crossing`) resolved where it is written: its reduce right after the tensor's last
    write, as the producer's, into the crossing's key; each reader's steps replaced by its rest
    from that key (a reader left with no steps reads the key).

    Example (no crossing: the step as it was):
        >>> from types import SimpleNamespace
        >>> program = DeviceProgram([Event((), {"x": 4})])
        >>> crossed(SimpleNamespace(pipeline=SimpleNamespace(crossings=())), program) is program
        True
    """
    if not plan.pipeline.crossings:
        return program
    size, events = plan.sizes, program.events
    last_write = {key: index for index, event in enumerate(events) for key in event.writes}
    after, instead, removed, renamed = {}, {}, set(), {}
    for crossing in plan.pipeline.crossings:
        tensor, written = crossing.tensor, last_write[crossing.tensor]
        owner = events[written].owner
        after.setdefault(written, []).extend(_step_events(crossing.reduce, tensor, crossing.key, size(tensor), owner))
        for (consumer, index), rest in crossing.rests:
            key = f"{tensor}>{consumer}[{index}]"
            steps = [position for position, event in enumerate(events) if event.owner == consumer and key in event.writes]
            removed.update(steps)
            instead[steps[0]] = _step_events(rest, crossing.key, key, size(tensor), consumer)
            if not rest.steps:
                renamed[key] = crossing.key
    found = []
    for index, event in enumerate(events):
        kept = [] if index in removed else [_renamed(event, renamed)]
        found += instead.get(index, []) + kept + after.get(index, [])
    return replace(program, events=found)


def _step_events(redistribution, source: str, target: str, size: int, owner: str) -> list[Event]:
    """A redistribution's steps as events (as `buffers.device_program` counts them)."""
    events = []
    for step in redistribution.steps:
        events.append(Event((source,), {target: math.prod(step.after.slice_shape) * size}, (), owner, owner))
        source = target
    return events


def _renamed(event: Event, renamed: dict[str, str]) -> Event:
    if not any(key in renamed for key in event.reads):
        return event
    over = tuple((renamed.get(read, read), written) for read, written in event.over)
    return replace(event, reads=tuple(renamed.get(key, key) for key in event.reads), over=over)
