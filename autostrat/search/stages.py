"""Pipeline stages: a layer sequence's *units* and what each costs one micro-batch, the input of
the split into contiguous stages (`schedule_split`, Alpa's inter-op pass, priced by simulating
the pipeline schedule's orders).

A model is a sequence of units (the layers before the repeated ones, each repeated layer, the
layers after: `op_units`), each priced per micro-batch on one stage's devices (`unit_costs`):
its forward, its backward's input-gradient part B and weight-gradient part W (`weight_ops`,
the runtime's rule), the activations its backward reads, its parameters, optimiser state and
gradients, the largest activation gradient its backward writes, and the send between stages.
Gradient synchronisation and the update run once per step, outside the micro-batches
(`pipeline.Pipeline.once_ns`).

`min_max_split` is the dynamic programme over (units, stages) for the split with the least
largest per-stage value: the best last stage ``[j, n)`` of a split of the first ``n`` units
into ``k`` stages leaves the best split of the first ``j`` units into ``k - 1``.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from autostrat.autodiff import BACKWARD_PREFIXES, op_phase
from autostrat.autodiff.recompute import RECOMPUTE_PREFIX
from autostrat.autodiff.weight_gradients import input_gradient_part
from autostrat.autodiff.optimizers import UPDATE_PREFIX
from autostrat.cost import Hardware
from autostrat.errors import ConfigError
from autostrat.search.crossings import resolved_readers
from autostrat.search.prediction import op_times
from autostrat.search.precision import TensorSizes
from autostrat.search.problem import layers_of

@dataclass(frozen=True)
class UnitCosts:
    """Per unit (in model order), on one stage's devices, per micro-batch: forward plus backward
    nanoseconds, saved activation bytes, and parameter plus optimiser-state bytes; `send_ns` is
    one activation's (or its gradient's) send between two stages; `forward_ns` and
    `weight_gradient_ns` the parts of `time_ns` that are the forward and W (the weight gradient:
    `schedule_split.weight_ops`), the rest B (none given: zeros, the whole time B)."""

    time_ns: tuple[int, ...]
    activation_bytes: tuple[int, ...]
    weight_bytes: tuple[int, ...]
    send_ns: int = 0
    gradient_bytes: tuple[int, ...] = ()  # per unit, its parameters' gradients (none given: zeros)
    send_bytes: int = 0  # the activation a stage receives per micro-batch (`send_ns`'s)
    transient_bytes: tuple[int, ...] = ()  # per unit, the largest activation gradient its backward writes
    forward_ns: tuple[int, ...] = ()
    weight_gradient_ns: tuple[int, ...] = ()
    largest_gradient_bytes: tuple[int, ...] = ()  # per unit, its largest parameter's gradient (`gradient_bytes`' part)
    # Per unit, what a micro-batch keeps from its B to its W where a schedule splits them: the
    # activations its W ops read and the tensors its B ops write for them (none given: its activations).
    weight_held_bytes: tuple[int, ...] = ()
    # Per unit, the most its W ops hold at once walking in their order, what they still read
    # freed op by op as the runtime frees it: beside the gradients written so far (the first
    # micro-batch's become the sums), and beside only the one being written (a later one's is
    # added into its sum). None given: `weight_held_bytes` with all the gradients, or with the
    # largest and `transient_bytes`.
    weight_walk_bytes: tuple[int, ...] = ()
    weight_walk_summed_bytes: tuple[int, ...] = ()
    # Per unit, what its recompute copies make that its backward reads: live while that backward
    # runs (none given: zeros; `transient_bytes` then leaves them out).
    recomputed_bytes: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if not self.time_ns or not len(self.time_ns) == len(self.activation_bytes) == len(self.weight_bytes):
            raise ConfigError(f"unit costs need one time, activation and weight figure per unit, got "
                              f"{len(self.time_ns)}, {len(self.activation_bytes)} and {len(self.weight_bytes)}")
        for name in ("gradient_bytes", "transient_bytes", "forward_ns", "weight_gradient_ns", "largest_gradient_bytes",
                     "recomputed_bytes"):
            figures = getattr(self, name)
            if figures and len(figures) != len(self.time_ns):
                raise ConfigError(f"unit costs need one {name} figure per unit, got {len(figures)} for {len(self.time_ns)} units")
            if not figures:
                object.__setattr__(self, name, (0,) * len(self.time_ns))  # frozen: filled once, here
        if not self.weight_held_bytes:
            object.__setattr__(self, "weight_held_bytes", self.activation_bytes)
        held = self.weight_held_bytes
        defaults = {"weight_held_bytes": held, "weight_walk_bytes": tuple(map(sum, zip(held, self.gradient_bytes))),
                    "weight_walk_summed_bytes": tuple(map(sum, zip(held, self.largest_gradient_bytes, self.transient_bytes)))}
        for name, default in defaults.items():
            if not getattr(self, name):
                object.__setattr__(self, name, default)
            elif len(getattr(self, name)) != len(self.time_ns):
                raise ConfigError(f"unit costs need one {name} figure per unit, got {len(getattr(self, name))} "
                                  f"for {len(self.time_ns)} units")
        if any(f + w > t for f, w, t in zip(self.forward_ns, self.weight_gradient_ns, self.time_ns)):
            raise ConfigError("unit costs' forward and weight-gradient parts must fit in each unit's time")


@dataclass(frozen=True)
class StageSplit:
    """Model stages as ``[first unit, end)`` ranges, and what the pipeline is predicted to cost
    (`schedule_split.priced_split`): per stage one micro-batch's slot (F, B, W and sends), per
    device group the split's memory model, the simulated step and its bubble (the idle share
    of the devices' time)."""

    bounds: tuple[tuple[int, int], ...]
    slot_ns: tuple[int, ...]  # per model stage, one micro-batch's forward, backward and sends
    peak_bytes: tuple[int, ...]  # per device group, per device
    micro_batches: int
    weight_bytes: tuple[int, ...] = ()  # per model stage, per device: parameters and optimiser state
    step_time_ns: int = 0  # the micro-batches' part of the step, simulated
    bubble: float = 0.0

    @property
    def stages(self) -> int:
        return len(self.bounds)


def min_max_split(units: int, stages: int, value) -> tuple[int, tuple[int, ...]] | None:
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


def weight_ops(graph) -> frozenset[str]:
    """The backward ops of a training graph that are W (the weight gradient): by the runtime's
    rule (`autodiff.weight_gradients`; the runtime applies it per instruction of a stage, here per
    op): a backward op that is not B is W.

    Example (an FFN's weight and bias gradients are W; the matmul's input gradient is B):
        >>> from autostrat.autodiff import SGD, build_training
        >>> from autostrat.frontend import trace
        >>> from autostrat.models import FFN
        >>> from autostrat.nn import Tensor
        >>> weights = weight_ops(build_training(trace(FFN(), Tensor(shape=(8, 64))), SGD()))
        >>> "bprop/dense2.matmul/mat_mul_1" in weights, "bprop/dense2.matmul/mat_mul" in weights
        (True, False)
    """
    backward = [name for name in graph.ops if op_phase(name) == "backward"]
    part = input_gradient_part(graph, backward, lambda name: name, lambda name: graph.ops[name].outputs,
                               lambda name: graph.ops[name].inputs)
    return frozenset(name for name, b in zip(backward, part) if not b)


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
    into them (its forward's and its W ops' apart: `weight_ops`), the activations its forward ops produce that a backward op reads, and its
    parameters with their optimiser state and their parameters' gradients (each in the plan's
    layouts); a send moves the largest activation passed from one repeated layer to the next,
    each device its slice, across servers (`send_bytes`, which a stage also holds per micro-batch;
    a partial one resolved first where it is written, as a pipeline sends it: `crossings`);
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
    time, forward, weight, activations, weights, gradients, transients, largest, held = ([0] * count for _ in range(9))
    weight_parts = weight_ops(graph)
    for name, time_ns in op_times(plan, hardware, ("forward", "backward")).items():
        time[units[name]] += time_ns
        forward[units[name]] += time_ns * (op_phase(name) == "forward")
        weight[units[name]] += time_ns * (name in weight_parts)
    for unit, part, time_ns in _crossing_times(plan, hardware, units, weight_parts):
        time[unit] += time_ns
        forward[unit] += time_ns * (part == "F")
        weight[unit] += time_ns * (part == "W")
    parameter_gradients, sizes = set(), TensorSizes.of(graph, plan.precision)
    for name, info in graph.tensors.items():
        readers = [reader for reader, _ in graph.consumers(name)]
        if info.kind == "parameter" and readers:
            weights[units[readers[0]]] += _slice_bytes(plan, name, sizes) + _main_bytes(plan, name, sizes)
            gradient = _slice_bytes(plan, f"grad/{name}", sizes)
            gradients[units[readers[0]]] += gradient
            largest[units[readers[0]]] = max(largest[units[readers[0]]], gradient)
            parameter_gradients.add(f"grad/{name}")
        elif info.producer in graph.ops and op_phase(info.producer) == "forward" and any(op_phase(r) == "backward" for r in readers):
            activations[units[info.producer]] += _slice_bytes(plan, name, sizes)
        if info.producer in graph.ops and info.producer not in weight_parts and any(r in weight_parts for r in readers):
            held[units[info.producer]] += _slice_bytes(plan, name, sizes)  # a forward's or a B op's, read by W
    recomputed = [0] * count
    for name, info in graph.tensors.items():
        if info.producer in graph.ops and info.producer.startswith(RECOMPUTE_PREFIX):
            if any(not reader.startswith(RECOMPUTE_PREFIX) for reader, _ in graph.consumers(name)):  # not a chain's inner step
                recomputed[units[info.producer]] += _slice_bytes(plan, name, sizes)
        elif info.producer in graph.ops and op_phase(info.producer) == "backward" and name not in parameter_gradients:
            transients[units[info.producer]] = max(transients[units[info.producer]], _slice_bytes(plan, name, sizes))
    sent = _sent_bytes(plan, units, (lambda a, b: a < b) if stage_units else (lambda a, b: (a, b) == (1, 2)))
    latency, bandwidth = hardware.link(across_servers=True)
    send_ns = round(latency * 1e9 + sent / bandwidth * 1e9)
    walk, walk_summed = _weight_walks(plan, units, weight_parts, parameter_gradients, sizes, count)
    return UnitCosts(tuple(time), tuple(activations), tuple(weights), send_ns, tuple(gradients), sent, tuple(transients),
                     tuple(forward), tuple(weight), tuple(largest), tuple(held), walk, walk_summed, tuple(recomputed))


def _weight_walks(plan, units: dict[str, int], weight_parts, parameter_gradients: set, sizes: TensorSizes,
                  count: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Per unit, the most its W ops hold of one micro-batch at once, run in the graph's order
    as the runtime runs them: at each, what W ops still read (the unit's B and forward outputs,
    and W's own intermediates), freed after its last reader, beside the parameter gradients
    written so far (`UnitCosts.weight_walk_bytes`) or beside this op's only (`weight_walk_summed_bytes`)."""
    graph, order = plan.graph, [name for name in plan.graph.ops if name in weight_parts]
    last_read = {}  # tensor -> position in `order` of its last W reader
    for position, name in enumerate(order):
        for tensor in graph.ops[name].inputs:
            last_read[tensor] = position
    live, walk, walk_summed, written = [0] * count, [0] * count, [0] * count, [0] * count
    for tensor, position in last_read.items():  # held from B to W: a non-W op's output a W op reads
        producer = graph.tensors[tensor].producer if tensor in graph.tensors else None
        if producer in graph.ops and producer not in weight_parts:
            live[units[producer]] += _slice_bytes(plan, tensor, sizes)
    for position, name in enumerate(order):
        unit, outputs = units[name], graph.ops[name].outputs
        made = {tensor: _slice_bytes(plan, tensor, sizes) for tensor in outputs if tensor not in parameter_gradients}
        gradient = sum(_slice_bytes(plan, tensor, sizes) for tensor in outputs if tensor in parameter_gradients)
        written[unit] += gradient
        walk[unit] = max(walk[unit], live[unit] + sum(made.values()) + written[unit])
        walk_summed[unit] = max(walk_summed[unit], live[unit] + sum(made.values()) + gradient)
        live[unit] += sum(size for tensor, size in made.items() if last_read.get(tensor, -1) > position)  # W's own, read on
        for tensor in set(graph.ops[name].inputs):  # freed after their last reader
            producer = graph.tensors[tensor].producer if tensor in graph.tensors else None
            if last_read[tensor] == position and producer in graph.ops:
                live[units[producer]] -= _slice_bytes(plan, tensor, sizes)
    return tuple(walk), tuple(walk_summed)


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
    sends on per micro-batch (and its gradient back), sent once across servers; a partial one
    in the layout its readers in ``b`` resolve it into on the sender (`crossings.resolved_readers`)."""
    graph, largest, sizes = plan.graph, 0, plan.sizes  # in the precision's size (`search.precision`)
    for name, info in graph.tensors.items():
        if info.producer in graph.ops and op_phase(info.producer) == "forward":
            for unit, readers in _later_readers(plan, units, name).items():
                if crossing(units[info.producer], unit) and any(op_phase(reader) == "forward" for reader, _ in readers):
                    resolved = resolved_readers(plan, name, readers) if plan.layouts[name].partial else None
                    layout = plan.layouts[name] if resolved is None else resolved[0].dst
                    largest = max(largest, math.prod(layout.slice_shape) * sizes(name))
    return largest


def _later_readers(plan, units: dict[str, int], tensor: str) -> dict[int, list[tuple[str, int]]]:
    """Per unit other than its producer's, the (consumer, input index) pairs of the forward and
    backward ops there that read `tensor`."""
    graph, found = plan.graph, {}
    for consumer, index in plan.graph.consumers(tensor):
        if units[consumer] != units[graph.tensors[tensor].producer] and op_phase(consumer) in ("forward", "backward"):
            found.setdefault(units[consumer], []).append((consumer, index))
    return found


def _crossing_times(plan, hardware: Hardware, units: dict[str, int], weight_parts) -> list[tuple[str, int, int]]:
    """The time a pipeline moves when a partial tensor's readers in another unit resolve it on
    the sender (`crossings.resolved_readers`), as (unit, part F, B or W, nanoseconds): the reduce
    to the producer's unit (its F or B), each reader's redistribution replaced by its rest. Exact
    once the units run on different device groups; within one stage, the plan's own edges run."""
    graph, model, moves = plan.graph, hardware.alpha_beta(plan.device_num), []
    edges = {(edge.consumer, edge.input_index): edge for edge in plan.redistributions}
    for name, info in graph.tensors.items():
        if info.producer not in graph.ops or name not in plan.layouts or not plan.layouts[name].partial:
            continue
        for readers in _later_readers(plan, units, name).values():
            resolved = resolved_readers(plan, name, readers)
            if resolved is None:
                continue
            reduce, rests = resolved
            moves.append((units[info.producer], "F" if op_phase(info.producer) == "forward" else "B", reduce.nanoseconds(model)))
            for (consumer, index), rest in rests:
                part = "F" if op_phase(consumer) == "forward" else "W" if consumer in weight_parts else "B"
                moves.append((units[consumer], part, rest.nanoseconds(model) - edges[(consumer, index)].plan.nanoseconds(model)))
    return moves
