"""Pipeline stages: the split of a layer sequence into contiguous stages that minimises the
predicted step time of the pipeline under a per-device memory budget (Alpa's inter-op pass).

A model is a sequence of *units* (the layers before the repeated ones, each repeated layer, the
layers after: `UnitCosts`), each priced per micro-batch on one stage's devices. ``S`` stages
run ``m`` micro-batches; a stage's *slot* is what one micro-batch costs it: the forward and
backward of its units, plus sending its output activation on and its input's gradient back.
Every micro-batch passes every stage, and a stage starts a micro-batch only when the one
before has left it, so a step takes ``(m + S - 1)`` slots of the slowest stage (the classic
fill-and-drain bound, the same for GPipe and 1F1B); the bubble is the idle share
``(S - 1) / (m + S - 1)`` of it.

Memory of stage ``s`` (from 0), the model the split is searched with: its units' parameters
and optimiser state, plus the most it holds at the end of a micro-batch's forward or backward
as its schedule runs them (`held_moments`): the saved activations of the micro-batches in
flight (1F1B starts the backward of micro-batch 0 after ``S - s`` forwards, so it holds
``min(S - s, m)`` micro-batches; GPipe runs every forward first and holds all ``m``), each with
the activation the stage received (on every stage but the first), the gradient sums once the
first backward has made them, and the gradients a backward writes next to them. The exact
peak of the plan's buffers (`stage_buffers.stage_peaks`) is what a budget is checked against
(`pipeline.plan_pipeline`).

`split_stages` minimises the slowest slot by dynamic programming over (units, stages), exact
(tested against every split on small models): the best last stage ``[j, n)`` of a split of
the first ``n`` units into ``k`` stages leaves the best split of the first ``j`` units into
``k - 1``, whose slowest slot is what the earlier stages contribute, and a stage's memory
depends only on its own units and its position.
"""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass
from functools import cached_property

from autostrat.autodiff import BACKWARD_PREFIXES, op_phase
from autostrat.autodiff.optimizers import UPDATE_PREFIX
from autostrat.cost import Hardware
from autostrat.errors import ConfigError, InfeasibleError
from autostrat.search.prediction import op_times
from autostrat.search.precision import TensorSizes
from autostrat.search.problem import layers_of

SCHEDULES = ("1f1b", "gpipe")


@dataclass(frozen=True)
class UnitCosts:
    """Per unit (in model order), on one stage's devices, per micro-batch: forward plus backward
    nanoseconds, saved activation bytes, and parameter plus optimiser-state bytes; `send_ns` is
    one activation's (or its gradient's) send between two stages."""

    time_ns: tuple[int, ...]
    activation_bytes: tuple[int, ...]
    weight_bytes: tuple[int, ...]
    send_ns: int = 0
    gradient_bytes: tuple[int, ...] = ()  # per unit, its parameters' gradients (none given: zeros)
    send_bytes: int = 0  # the activation a stage receives per micro-batch (`send_ns`'s)
    transient_bytes: tuple[int, ...] = ()  # per unit, the largest activation gradient its backward writes

    def __post_init__(self) -> None:
        if not self.time_ns or not len(self.time_ns) == len(self.activation_bytes) == len(self.weight_bytes):
            raise ConfigError(f"unit costs need one time, activation and weight figure per unit, got "
                              f"{len(self.time_ns)}, {len(self.activation_bytes)} and {len(self.weight_bytes)}")
        for name, figures in (("gradient", self.gradient_bytes), ("transient", self.transient_bytes)):
            if figures and len(figures) != len(self.time_ns):
                raise ConfigError(f"unit costs need one {name} figure per unit, got {len(figures)} for {len(self.time_ns)} units")


@dataclass(frozen=True)
class StageSplit:
    """Stages as ``[first unit, end)`` ranges, and what the pipeline is predicted to cost."""

    bounds: tuple[tuple[int, int], ...]
    slot_ns: tuple[int, ...]  # per stage, one micro-batch's forward, backward and sends
    peak_bytes: tuple[int, ...]  # per stage, per device
    micro_batches: int
    weight_bytes: tuple[int, ...] = ()  # per stage, per device: parameters and optimiser state

    @property
    def stages(self) -> int:
        return len(self.bounds)

    @cached_property
    def step_time_ns(self) -> int:
        return (self.micro_batches + self.stages - 1) * max(self.slot_ns)

    @property
    def bubble(self) -> float:
        """The share of the step a stage is idle, on average over the stages."""
        busy = self.micro_batches * sum(self.slot_ns)
        return 1 - busy / (self.stages * self.step_time_ns)


def in_flight(stage: int, stages: int, micro_batches: int, schedule: str) -> int:
    """How many micro-batches' activations stage `stage` holds at most.

    Example (4 stages, 8 micro-batches: 1F1B's first stage holds 4, its last 1; GPipe all 8):
        >>> [in_flight(s, 4, 8, "1f1b") for s in range(4)], in_flight(3, 4, 8, "gpipe")
        ([4, 3, 2, 1], 8)
    """
    return micro_batches if schedule == "gpipe" else min(stages - stage, micro_batches)


def slot_order(stage: int, stages: int, micro_batches: int, schedule: str) -> tuple[tuple[str, int], ...]:
    """The order stage `stage` runs its micro-batches' forward and backward slots in, as the
    plan's schedule says: 1F1B (Megatron's non-interleaved) fills the pipeline with
    ``stages - stage - 1`` forwards, then alternates one forward and one backward, then drains;
    GPipe runs every forward, then every backward. (The ranks run `search.schedules`'s orders,
    the same for these two: tested.)

    Example (the first of 2 stages, 3 micro-batches):
        >>> slot_order(0, 2, 3, "1f1b")
        (('forward', 0), ('forward', 1), ('backward', 0), ('forward', 2), ('backward', 1), ('backward', 2))
    """
    if schedule == "gpipe":
        return tuple(("forward", i) for i in range(micro_batches)) + tuple(("backward", i) for i in range(micro_batches))
    warmup = min(stages - stage - 1, micro_batches)
    slots = [("forward", i) for i in range(warmup)]
    for i in range(micro_batches - warmup):
        slots += [("forward", warmup + i), ("backward", i)]
    return tuple(slots + [("backward", i) for i in range(micro_batches - warmup, micro_batches)])


@functools.lru_cache(maxsize=4096)
def held_moments(stage: int, stages: int, micro_batches: int, schedule: str) -> tuple[tuple[int, int, int], ...]:
    """What stage `stage` holds at the moments its memory peaks as its schedule runs, as
    (gradient sets, micro-batches' activations, whether a backward's first activation gradient
    is there): where a backward starts, after a forward, the activations of the micro-batches in
    flight, the sums (there once the first backward made them) and the gradient the backward
    writes first; at the end of a backward, its gradients next to the sums, its micro-batch's
    activations freed. Only the moments no other one covers.

    Example (the first of 2 stages, 3 micro-batches, 1F1B: two micro-batches in flight next to
    the sums; a backward's gradients next to the sums and the other micro-batch):
        >>> held_moments(0, 2, 3, "1f1b")
        ((1, 2, 1), (2, 1, 0))
    """
    moments, sums, activations = set(), 0, 0
    for slot, _ in slot_order(stage, stages, micro_batches, schedule):
        if slot == "forward":
            activations += 1
            moments.add((sums, activations, 1))
        else:
            activations -= 1
            moments.add((sums + 1, activations, 0))
            sums = 1
    covered = {m for m in moments for n in moments if n != m and all(a >= b for a, b in zip(n, m))}
    return tuple(sorted(moments - covered))


def stage_cost(costs: UnitCosts, first: int, end: int, stage: int, stages: int, micro_batches: int,
               schedule: str) -> tuple[int, int]:
    """(slot nanoseconds, peak bytes per device) of units ``[first, end)`` as stage `stage`."""
    sends = costs.send_ns * ((stage < stages - 1) + (stage > 0))  # output on, input's gradient back
    slot = sum(costs.time_ns[first:end]) + sends
    activations = sum(costs.activation_bytes[first:end]) + costs.send_bytes * (stage > 0)
    gradients = sum(costs.gradient_bytes[first:end])
    first_gradient = costs.transient_bytes[end - 1] if costs.transient_bytes else 0  # the backward starts at the last unit
    held = max(count * gradients + kept * activations + starting * first_gradient
               for count, kept, starting in held_moments(stage, stages, micro_batches, schedule))
    return slot, sum(costs.weight_bytes[first:end]) + held


def split_stages(costs: UnitCosts, stages: int, micro_batches: int, budget: int | None = None,
                 schedule: str = "1f1b", allowed: int | None = None, excluded: frozenset = frozenset()) -> StageSplit:
    """The split of the units into `stages` contiguous non-empty stages with the smallest slowest
    slot whose every stage's model fits `allowed` bytes per device (default `budget`) and none
    of whose stages, as ``(stage, first, end)``, is `excluded` (a caller checking the exact
    peaks against `budget` allows more and excludes the stages found over:
    `pipeline.plan_pipeline`); among equally slow splits, the first the DP keeps: at every
    prefix the least slow, then the earliest boundaries (deterministic).

    Example (four equal layers after a heavy embedding: the embedding's stage takes one layer):
        >>> costs = UnitCosts((30, 10, 10, 10, 10), (1, 1, 1, 1, 1), (5, 1, 1, 1, 1))
        >>> split = split_stages(costs, 2, micro_batches=4)
        >>> split.bounds, split.slot_ns, split.step_time_ns
        (((0, 1), (1, 5)), (30, 40), 200)
    """
    units = len(costs.time_ns)
    if schedule not in SCHEDULES:
        raise ConfigError(f"pipeline schedule must be one of {', '.join(SCHEDULES)}, got {schedule!r}")
    if not 1 <= stages <= units:
        raise ConfigError(f"{stages} pipeline stages cannot split {units} layer unit(s): each stage needs one at least")
    if micro_batches < 1:
        raise ConfigError(f"micro_batches must be a positive integer, got {micro_batches!r}")

    allowed = budget if allowed is None else allowed

    def slot(stage: int, first: int, end: int) -> int | None:
        time_ns, peak = stage_cost(costs, first, end, stage, stages, micro_batches, schedule)
        return None if (allowed is not None and peak > allowed) or (stage, first, end) in excluded else time_ns

    def peak(stage: int, first: int, end: int) -> int:
        return stage_cost(costs, first, end, stage, stages, micro_batches, schedule)[1]

    found = _min_max_split(units, stages, slot)
    if found is None:
        smallest = _min_max_split(units, stages, peak)[0]
        over = f" (the model allows {allowed:,})" if allowed != budget else ""
        raise InfeasibleError(f"no split into {stages} pipeline stages fits max_device_memory = {budget:,} bytes per "
                              f"device: the least stage peak the split's memory model gives any split is "
                              f"{smallest:,} bytes{over}")
    ends = found[1]
    return priced_split(costs, tuple(zip((0,) + ends[:-1], ends)), micro_batches, schedule)


def priced_split(costs: UnitCosts, bounds: tuple[tuple[int, int], ...], micro_batches: int, schedule: str = "1f1b") -> StageSplit:
    """The `StageSplit` of the given stage bounds (contiguous ``[first, end)`` unit ranges).

    Example:
        >>> priced_split(UnitCosts((30, 10, 10), (1, 1, 1), (5, 1, 1)), ((0, 1), (1, 3)), 4).slot_ns
        (30, 20)
    """
    stages = len(bounds)
    priced = [stage_cost(costs, first, end, stage, stages, micro_batches, schedule) for stage, (first, end) in enumerate(bounds)]
    weights = tuple(sum(costs.weight_bytes[first:end]) for first, end in bounds)
    return StageSplit(bounds, tuple(time_ns for time_ns, _ in priced), tuple(held for _, held in priced), micro_batches, weights)


def _min_max_split(units: int, stages: int, value) -> tuple[int, tuple[int, ...]] | None:
    """(the largest ``value(stage, first, end)``, the end boundaries) of the split of `units`
    into `stages` contiguous non-empty stages where that largest is least, a stage whose value
    is None not allowed; None when no split allows every stage. By dynamic programming: the best
    split of the first ``n`` units into ``k`` stages ends with some stage ``[j, n)`` after the
    best split of the first ``j`` into ``k - 1`` (at every prefix the least, then the earliest
    boundaries: deterministic)."""
    best: list[list[tuple[int, tuple[int, ...]] | None]] = [[None] * (units + 1) for _ in range(stages + 1)]
    best[0][0] = (0, ())
    for k in range(1, stages + 1):
        for n in range(k, units - (stages - k) + 1):
            for j in range(k - 1, n):
                before = best[k - 1][j]
                cost = None if before is None else value(k - 1, j, n)
                if cost is None:
                    continue
                found = (max(before[0], cost), before[1] + (n,))
                if best[k][n] is None or found < best[k][n]:
                    best[k][n] = found
    return best[stages][units]


_WRAPPERS = (*BACKWARD_PREFIXES, UPDATE_PREFIX)


def op_units(graph) -> dict[str, int]:
    """Per op of a training graph, its unit: 0 for what precedes the repeated layers (an
    embedding), ``i + 1`` for repeated layer ``i``, the last for what follows (head, loss); a
    backward, recomputed or update op takes its forward op's (or parameter's) unit; ops of no
    layer (an optimiser's shared step counters) the last.

    Example:
        >>> from autostrat.autodiff import Adam, build_training
        >>> from autostrat.frontend import trace
        >>> from autostrat.models import GPT
        >>> net = GPT(layers=2, hidden=64, heads=8, seq=16, batch=8, vocab=128)
        >>> units = op_units(build_training(trace(net, *net.example_inputs()), Adam()))
        >>> units["embedding.gather"], units["bprop/blocks.1.ffn2.matmul/mat_mul"], units["optimizer/blocks.0.ffn1.weight"], units["loss.reduce_mean"]
        (0, 2, 1, 3)
    """
    forward = [name for name in graph.ops if op_phase(name) == "forward"]
    layers = layers_of(forward)
    if len(layers) != 1:
        raise ConfigError(f"pipeline stages split one sequence of repeated layers (a CellList); {graph.name} has "
                          f"{len(layers)}: {', '.join(sorted(layers)) or 'none'}")
    [(prefix, by_index)] = layers.items()
    first = min(forward.index(op) for ops in by_index.values() for op in ops.values())
    last_unit = len(by_index) + 1
    pattern = re.compile(rf"^{re.escape(prefix)}\.(\d+)\.")

    def unit(index: int, name: str) -> int:
        match = pattern.match(name + ".")
        if match:
            return int(match[1]) + 1
        return 0 if index < first else last_unit

    return spread_units(graph, {name: unit(index, name) for index, name in enumerate(forward)}, last_unit)


def spread_units(graph, forward_units: dict[str, int], rest: int) -> dict[str, int]:
    """Per op of a training graph, its unit from its forward op's (`forward_units`): a
    backward, recomputed or update op takes its forward op's (or its parameter's: the unit of
    the op reading it first), an op of no forward op and no parameter (an optimiser's shared
    step counters) `rest`.

    Example:
        >>> from autostrat.autodiff import SGD, build_training
        >>> from autostrat.frontend import trace
        >>> from autostrat.models import FFN
        >>> from autostrat.nn import Tensor
        >>> graph = build_training(trace(FFN(), Tensor(shape=(8, 64))), SGD())
        >>> units = spread_units(graph, {"dense1.matmul": 0, "dense1.bias_add": 0, "relu": 0, "dense2.matmul": 1, "dense2.bias_add": 1}, 1)
        >>> units["bprop/dense2.matmul/mat_mul"], units["optimizer/dense1.weight"], units["optimizer/dense2.bias"]
        (1, 0, 1)
    """

    def unit(name: str) -> int:
        core = name
        for wrapper in _WRAPPERS:
            core = core.removeprefix(wrapper)
        core = core.split("/")[0].split(":")[0]
        if core in forward_units:
            return forward_units[core]
        for reader, _ in graph.consumers(core) if core in graph.tensors else ():
            return unit(reader)  # a parameter (its update): where it is read
        return rest

    return {name: unit(name) for name in graph.ops}


def unit_costs(plan, hardware: Hardware, units: dict[str, int] | None = None, stage_units: bool = False) -> UnitCosts:
    """`UnitCosts` of a training plan (one micro-batch on one stage's devices), on `hardware`:
    per unit (`units`, default `op_units`) the compute of its forward and backward ops and the redistributions
    into them, the activations its forward ops produce that a backward op reads, and its
    parameters with their optimiser state and their parameters' gradients (each in the plan's
    layouts); a send moves the largest activation passed from one repeated layer to the next,
    each device its slice, across servers (`send_bytes`, which a stage also holds per micro-batch);
    with `stage_units` (each unit a stage of its own, as the cells' ``pipeline_stage`` gives
    them), the largest passed from any unit to a later one.
    Gradient synchronisation and the update run once per step, outside the micro-batch slots.

    Example (a 2-block stack, Megatron's TP 4 on 4 devices: no embedding, the blocks, the loss
    and its Adam step counters):
        >>> from autostrat.autodiff import Adam, build_training
        >>> from autostrat.frontend import trace
        >>> from autostrat.frontend.config import apply_seeds
        >>> from autostrat.models import TransformerStack, megatron_seeds
        >>> from autostrat.search import search
        >>> net = TransformerStack(layers=2, hidden=64, heads=8, seq=16, batch=2)
        >>> graph = apply_seeds(trace(net, *net.example_inputs(), device_num=4), megatron_seeds(2, 4), 4)
        >>> costs = unit_costs(search(build_training(graph, Adam()), 4), Hardware())
        >>> costs.weight_bytes, costs.activation_bytes, costs.gradient_bytes
        ((0, 153408, 153408, 8), (0, 49152, 47104, 2048), (0, 51136, 51136, 0))
    """
    graph = plan.graph
    units = op_units(graph) if units is None else units
    count = max(units.values()) + 1
    time, activations, weights, gradients, transients = ([0] * count for _ in range(5))
    for name, time_ns in op_times(plan, hardware, ("forward", "backward")).items():
        time[units[name]] += time_ns
    parameter_gradients, sizes = set(), TensorSizes.of(graph, plan.precision)
    for name, info in graph.tensors.items():
        readers = [reader for reader, _ in graph.consumers(name)]
        if info.kind == "parameter" and readers:
            weights[units[readers[0]]] += _slice_bytes(plan, name, sizes) + _main_bytes(plan, name, sizes)
            gradients[units[readers[0]]] += _slice_bytes(plan, f"grad/{name}", sizes)
            parameter_gradients.add(f"grad/{name}")
        elif info.producer in graph.ops and op_phase(info.producer) == "forward" and any(op_phase(r) == "backward" for r in readers):
            activations[units[info.producer]] += _slice_bytes(plan, name, sizes)
    for name, info in graph.tensors.items():
        if info.producer in graph.ops and op_phase(info.producer) == "backward" and name not in parameter_gradients:
            transients[units[info.producer]] = max(transients[units[info.producer]], _slice_bytes(plan, name, sizes))
    sent = _sent_bytes(plan, units, (lambda a, b: a < b) if stage_units else (lambda a, b: (a, b) == (1, 2)))
    latency, bandwidth = hardware.link(across_servers=True)
    send_ns = round(latency * 1e9 + sent / bandwidth * 1e9)
    return UnitCosts(tuple(time), tuple(activations), tuple(weights), send_ns, tuple(gradients), sent, tuple(transients))


def _slice_bytes(plan, tensor: str, sizes: TensorSizes) -> int:
    """One device's bytes of `tensor` in the plan's layout and precision (0 for a tensor the
    graph lacks)."""
    if tensor not in plan.layouts:
        return 0
    return math.prod(plan.layouts[tensor].slice_shape) * sizes(tensor)


def _main_bytes(plan, parameter: str, sizes: TensorSizes) -> int:
    """One device's bytes of a trained parameter's fp32 main copies (16-bit precisions), in the
    layout its update runs in."""
    update = plan.ops.get(UPDATE_PREFIX + parameter)
    if not sizes.main_bytes or parameter not in sizes.parameters or update is None:
        return 0
    return math.prod(update.strategy.input_layouts[0].slice_shape) * sizes.main_bytes


def _sent_bytes(plan, units: dict[str, int], crossing) -> int:
    """One device's slice of the largest forward activation from a unit ``a`` to a unit ``b``
    where ``crossing(a, b)`` (layer 1 to layer 2, or any stage to a later one): what a stage
    sends on per micro-batch (and its gradient back), sent once across servers."""
    graph, largest, sizes = plan.graph, 0, plan.sizes  # in the precision's size (`search.precision`)
    for name, info in graph.tensors.items():
        if info.producer in graph.ops and op_phase(info.producer) == "forward":
            if any(crossing(units[info.producer], units[reader]) and op_phase(reader) == "forward"
                   for reader, _ in graph.consumers(name)):
                largest = max(largest, _slice_bytes(plan, name, sizes))
    return largest
