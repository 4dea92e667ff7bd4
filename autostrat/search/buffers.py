"""The buffers one rank holds as it runs a plan, and their peak: the run's memory, from the plan.

`memory.peak_bytes` prices memory per op so that the solver can bound it; a run holds more:
every redistribution writes a copy of its tensor in the consumer's layout (and each of its steps
an intermediate one), which exists only for some pairs of producer and consumer strategies. This
module follows the order a rank's program runs in (`runtime.program`: every load first, then
per op the redistributions of its inputs and its kernel, then the writebacks) and counts its
buffers by the rule of `cost.live_bytes`, which the executor's runs follow and measure apart
(`runtime.held_memory`). Ranks hold slices of equal sizes, so rank 0 stands for all.

The plan's predicted peak (`prediction.Prediction.peak_bytes`) is this; the search checks a
budgeted plan against it too (`search.search`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from autostrat.autodiff import UPDATE_OP_TYPES
from autostrat.cost import dtype_size
from autostrat.cost.live_bytes import LiveBytes, release_after
from autostrat.layout import Layout, TensorMap
from autostrat.redistribution import plan_redistribution
from autostrat.search.precision import TensorSizes


@dataclass
class Event:
    """One instruction: the keys it reads, the bytes of each key it writes, and the (read key,
    written key) pairs whose buffer a result may take (`LiveBytes.write`)."""

    reads: tuple[str, ...]
    writes: dict[str, int]
    over: tuple[tuple[str, str], ...] = ()  # (read key, written key) pairs that may share a buffer
    op: str = ""  # the op whose input or kernel this is ("" for loads and writebacks)
    owner: str | None = None  # the op whose part of a training step it runs in (None for loads)
    output: bool = False  # assembles a graph output for the check: not the plan's memory (no bytes)

    @property
    def touched(self) -> tuple[str, ...]:
        return (*self.reads, *self.writes)


@dataclass
class DeviceProgram:
    """One device's step of a plan as `Event`s, in the order `runtime.program` lowers it: the
    loads, per op its input redistributions and its kernel, the outputs assembled, the
    writebacks; the keys kept from step to step, and the (graph output, key) and (parameter or
    state, key of its next value) pairs."""

    events: list[Event] = field(default_factory=list)
    kept: set[str] = field(default_factory=set)
    outputs: list[tuple[str, str]] = field(default_factory=list)
    updates: list[tuple[str, str]] = field(default_factory=list)


def plan_peak(plan) -> int:
    """The most bytes one rank's buffers hold at once while it runs a step of `plan`.

    Example (the tutorial FFN's training step: the redistributed copies add 6 080 bytes to
    what the per-op model counts):
        >>> from autostrat.autodiff import Momentum
        >>> from autostrat.models import tutorial_plan
        >>> plan = tutorial_plan(optimizer=Momentum(0.01, 0.9))
        >>> plan_peak(plan), plan.prediction.model_peak_bytes
        (59904, 53824)
    """
    return max((high for _, high in memory_over_step(plan)), default=0)


def memory_over_step(plan) -> tuple[tuple[str, int], ...]:
    """Per instruction of one rank's step, in order, the op it belongs to ("" for the loads
    and the writebacks) and the most bytes the rank holds while it runs; `plan_peak` is their
    maximum.

    Example (the tutorial FFN's forward pass: the loads, then one instruction per op):
        >>> from autostrat.models import tutorial_plan
        >>> steps = memory_over_step(tutorial_plan(seed=None))
        >>> [op for op, _ in steps][-2:], max(high for _, high in steps)
        (['dense2.matmul', 'dense2.bias_add'], 66048)
    """
    return _replay(plan, LiveBytes())


def peak_buffers(plan, counted=None) -> tuple[tuple[tuple[str, int], ...], int]:
    """The (key, bytes) pairs one rank holds at its peak over a step of `plan` (they sum to
    `plan_peak`: a tensor's name, or for a copy its name, ``>`` and whom it is for), and the
    most bytes of the keys `counted` accepts held at once (0 without it).

    Example (the tutorial FFN's forward pass unseeded; its input x, 64 x 64 float32, is whole on each device):
        >>> from autostrat.models import tutorial_plan
        >>> plan = tutorial_plan(seed=None)
        >>> pairs, most_x = peak_buffers(plan, lambda key: key == "x")
        >>> sum(size for _, size in pairs) == plan_peak(plan), most_x
        (True, 16384)
    """
    memory = LiveBytes(keep_peak=True, counted=counted)
    _replay(plan, memory)
    return memory.at_peak, memory.counted_peak


def _replay(plan, memory: LiveBytes) -> tuple[tuple[str, int], ...]:
    program = device_program(plan)
    events = [event for event in program.events if not event.output]
    schedule = release_after((event.touched for event in events), program.kept)
    highs = []
    for event, released in zip(events, schedule):
        memory.write(event.writes, event.over, released)
        highs.append((event.op, memory.high))
        memory.release(released)
    return tuple(highs)


def _bytes(layout, size: int) -> int:
    return math.prod(layout.slice_shape) * size


def device_program(plan) -> DeviceProgram:
    """Device 0's step of `plan` as events (ranks hold slices of equal sizes).

    Example (the tutorial FFN's training step: its loads first; its output gathered last for
    the check, which the plan's memory does not count):
        >>> from autostrat.autodiff import Momentum
        >>> from autostrat.models import tutorial_plan
        >>> program = device_program(tutorial_plan(optimizer=Momentum(0.01, 0.9)))
        >>> program.events[0].writes, program.events[-1].writes, program.outputs
        ({'x': 8192}, {'dense2.bias_add:0>output': 0}, [('dense2.bias_add:0', 'dense2.bias_add:0>output')])
    """
    graph = plan.graph
    program = DeviceProgram()
    size = TensorSizes.of(graph, plan.precision)
    loaded = [name for name, info in graph.tensors.items() if info.kind != "output" and graph.consumers(name)]
    for name in loaded:
        program.events.append(Event((), {name: _bytes(plan.layouts[name], size(name))}))
    main_copies = _main_copies(plan, size)
    program.events += [Event((), {key: held}) for key, held in main_copies.items()]
    edges = {(edge.consumer, edge.input_index): edge for edge in plan.redistributions}
    for name, op in graph.ops.items():
        keys = []
        for index, tensor in enumerate(op.inputs):
            edge, key = edges.get((name, index)), tensor
            if edge is not None and edge.shares:  # an earlier op's input holds it already
                key = f"{tensor}>{edge.shares[0]}[{edge.shares[1]}]"
            elif edge is not None and edge.plan.steps:
                key = f"{tensor}>{name}[{index}]"
                _steps(program, edge.plan, tensor, key, size(tensor), name, name)
            keys.append(key)
        if op.op_type in UPDATE_OP_TYPES and f"{op.inputs[0]}>main" in main_copies:
            keys.append(f"{op.inputs[0]}>main")  # read by the update (loaded on its pipeline stage)
        layouts = plan.ops[name].strategy.output_layouts
        writes = {out: _bytes(layout, size(out)) for out, layout in zip(op.outputs, layouts)}
        over = tuple(zip(keys, op.outputs)) if op.op_type in UPDATE_OP_TYPES else ()
        program.events.append(Event(tuple(keys), writes, over, name, name))
    for tensor in graph.outputs:
        program.outputs.append((tensor, _assembled(program, plan, tensor)))
    program.kept |= {key for output in program.outputs for key in output}
    writebacks = {w.parameter: w for w in plan.writebacks}
    for parameter, value in graph.updates:
        key = value
        if parameter in writebacks:
            key = f"{value}>{parameter}"
            _steps(program, writebacks[parameter].plan, value, key, size(value), "", graph.tensors[value].producer)
        program.updates.append((parameter, key))
    program.kept |= {key for _, key in program.updates} | set(main_copies)
    updated = {parameter for parameter, _ in graph.updates}
    program.kept |= {name for name in loaded if graph.tensors[name].kind != "input" and name not in updated}
    return program


def _assembled(program: DeviceProgram, plan, tensor: str) -> str:
    """The key of graph output `tensor` made whole on every device for the check (its own
    when its layout is whole already); the steps write no bytes the plan counts."""
    layout = plan.layouts[tensor]
    whole = Layout(layout.device_matrix, TensorMap((-1,) * len(layout.shape)), layout.shape)
    if layout.equivalent(whole):
        return tensor
    key, info = f"{tensor}>output", plan.graph.tensors[tensor]
    start = len(program.events)
    _steps(program, plan_redistribution(layout, whole, info.dtype), tensor, key, dtype_size(info.dtype), "", info.producer)
    for event in program.events[start:]:
        event.writes, event.output = dict.fromkeys(event.writes, 0), True
    return key


def _steps(program: DeviceProgram, redistribution, source: str, target: str, size: int, op: str = "",
           owner: str | None = None) -> None:
    """A redistribution's steps (of `size` bytes per element): the first reads `source`, every
    one writes `target`."""
    for step in redistribution.steps:
        program.events.append(Event((source,), {target: _bytes(step.after, size)}, (), op, owner))
        source = target


def _main_copies(plan, size: TensorSizes) -> dict[str, int]:
    """Under a 16-bit precision, per trained parameter the bytes of its fp32 main copies, held
    throughout in the layout its update runs in (its optimiser state's)."""
    held = {}
    for name, op in plan.graph.ops.items() if size.main_bytes else ():
        if op.op_type in UPDATE_OP_TYPES and op.inputs[0] in size.parameters:
            strategy = plan.ops[name].strategy
            held[f"{op.inputs[0]}>main"] = _bytes(strategy.input_layouts[0], size.main_bytes)
    return held
