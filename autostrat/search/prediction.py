"""What a plan is predicted to cost per step: time and bytes per phase, and peak memory per device.

- Compute: every op of the plan (update ops too), `Hardware.compute_nanoseconds` of its strategy,
  in its op's phase (`autodiff.op_phase`: forward, backward or update).
- Communication: a ring strategy's sends that its compute does not hide (`cost.ring`), in its
  op's phase, and every redistribution of the plan, its steps timed by the α–β model of the plan's
  hardware (`AlphaBeta.step_nanoseconds`), in the phase its bytes are counted in
  (`Plan.edge_phase`; writebacks in "update").
- Peak memory: what a rank's buffers hold at most as it runs the step (`buffers.plan_peak`:
  parameters, optimiser state, activations, gradients and every redistribution's copies),
  equal to what a run measures; `model_peak_bytes` is the per-op model the solver's budget
  bounds (`memory.peak_bytes`), which leaves the copies out.

One device's step is the sum of its phases: compute and communication are not overlapped.
"""

from __future__ import annotations

from dataclasses import dataclass

from autostrat.autodiff import op_phase
from autostrat.cost import Hardware, op_cost
from autostrat.cost.ring import ring_nanoseconds
from autostrat.search.buffers import plan_peak
from autostrat.search.memory import peak_bytes
from autostrat.search.problem import SearchProblem, optimizer_state, searched_graph


@dataclass(frozen=True)
class PhaseCost:
    """One phase of a step on one device: nanoseconds computing and communicating, bytes sent."""

    compute_ns: int = 0
    communication_ns: int = 0
    bytes: int = 0

    @property
    def time_ns(self) -> int:
        return self.compute_ns + self.communication_ns


@dataclass(frozen=True)
class Prediction:
    """A plan's predicted step on one device: `phases` in `plan.byte_phases` order, the peak of
    its buffers, and that peak as the solver's per-op model counts it."""

    phases: dict[str, PhaseCost]
    peak_bytes: int
    model_peak_bytes: int = 0

    @property
    def step_time_ns(self) -> int:
        return sum(phase.time_ns for phase in self.phases.values())

    @property
    def compute_ns(self) -> int:
        return sum(phase.compute_ns for phase in self.phases.values())

    @property
    def communication_ns(self) -> int:
        return sum(phase.communication_ns for phase in self.phases.values())

    def lines(self) -> list[str]:
        """The human-readable summary (deterministic: whole nanoseconds, formatted); phases
        with nothing in them are left out (`to_dict` keeps them)."""
        lines = [f"predicted step time: {format_nanoseconds(self.step_time_ns)} = compute "
                 f"{format_nanoseconds(self.compute_ns)} + communication {format_nanoseconds(self.communication_ns)}"]
        for name, phase in self.phases.items():
            if phase == PhaseCost():
                continue  # a forward pass has no backward, sync or update phase to show
            lines.append(f"  {name}: compute {format_nanoseconds(phase.compute_ns)}, communication "
                         f"{format_nanoseconds(phase.communication_ns)}, {phase.bytes} bytes")
        lines.append(f"peak memory per device: {self.peak_bytes} bytes (parameters, optimizer state, live activations "
                     f"and redistributed copies; the search's per-op model: {self.model_peak_bytes})")
        return lines

    def to_dict(self) -> dict:
        return {
            "step_time_ns": self.step_time_ns,
            "phases": {name: {"compute_ns": phase.compute_ns, "communication_ns": phase.communication_ns,
                              "bytes": phase.bytes} for name, phase in self.phases.items()},
            "peak_bytes_per_device": self.peak_bytes,
        }


def format_nanoseconds(value: int) -> str:
    """Whole nanoseconds in the largest unit that keeps them at least 1.

    Example:
        >>> format_nanoseconds(850), format_nanoseconds(12_345), format_nanoseconds(3_000_000_000)
        ('850 ns', '12.345 us', '3.000 s')
    """
    for unit, size in (("s", 10**9), ("ms", 10**6), ("us", 10**3)):
        if value >= size:
            return f"{value / size:.3f} {unit}"
    return f"{value} ns"


def compute_ns(plan, name: str, hardware: Hardware) -> int:
    """The predicted compute time of op `name` of `plan` (its strategy's local work) on `hardware`."""
    operands, sizes = plan.graph.ops[name].inputs + plan.graph.ops[name].outputs, plan.sizes
    dtypes = tuple(map(sizes.priced, operands))  # the precision's (`search.precision`)
    return hardware.compute_nanoseconds(op_cost(plan.ops[name].strategy, dtypes), sizes.rate_dtypes(operands))


def ring_cost(plan, name: str, hardware: Hardware, compute: int) -> tuple[int, int]:
    """(nanoseconds its sends add to its `compute`, bytes sent) of op `name`'s ring (`cost.ring`;
    (0, 0) unless its strategy is a ring strategy)."""
    strategy = plan.ops[name].strategy
    if not strategy.ring:
        return 0, 0
    key = plan.sizes.priced(plan.graph.ops[name].inputs[1])
    return ring_nanoseconds(strategy, compute, key, hardware.alpha_beta(plan.device_num)) - compute, plan.ring_bytes[name]


def op_times(plan, hardware: Hardware, phases: tuple[str, ...]) -> dict[str, int]:
    """Per op of `phases` (`autodiff.op_phase`), its compute plus the redistributions into it
    (a shared one counted once, at its first reader) and, for an update, its writeback."""
    model, graph = hardware.alpha_beta(plan.device_num), plan.graph
    times = {name: compute_ns(plan, name, hardware) for name in graph.ops if op_phase(name) in phases}
    times = {name: time + ring_cost(plan, name, hardware, time)[0] for name, time in times.items()}
    for edge in plan.redistributions:
        if edge.consumer in times and not edge.shares:
            times[edge.consumer] += edge.plan.nanoseconds(model)
    for writeback in plan.writebacks:
        producer = graph.tensors[writeback.value].producer
        if producer in times:
            times[producer] += writeback.plan.nanoseconds(model)
    return times


def predict(plan, hardware: Hardware, phases: tuple[str, ...]) -> Prediction:
    """The `Prediction` of `plan` (a `plan.Plan`) on `hardware`, over `phases`.

    Example (the tutorial FFN on one 8-device server; its ReduceScatter of 6 144 bytes over 4
    devices sends 3 ring messages of 2 µs):
        >>> from autostrat.models import tutorial_plan
        >>> predicted = predict(tutorial_plan(), Hardware(), ("forward",))
        >>> predicted.phases["forward"], predicted.peak_bytes
        (PhaseCost(compute_ns=21, communication_ns=6014, bytes=6144), 18560)
    """
    model = hardware.alpha_beta(plan.device_num)
    compute, communication, sent = dict.fromkeys(phases, 0), dict.fromkeys(phases, 0), dict.fromkeys(phases, 0)
    for name in plan.graph.ops:
        phase, time = op_phase(name), compute_ns(plan, name, hardware)
        waited, ring = ring_cost(plan, name, hardware, time)
        compute[phase], communication[phase], sent[phase] = compute[phase] + time, communication[phase] + waited, sent[phase] + ring
    moves = [(plan.edge_phase(edge), edge.plan) for edge in plan.redistributions if not edge.shares]  # shared: sent once
    moves += [("update", writeback.plan) for writeback in plan.writebacks]
    for phase, redistribution in moves:
        communication[phase] += redistribution.nanoseconds(model)
        sent[phase] += redistribution.cost
    costs = {phase: PhaseCost(compute[phase], communication[phase], sent[phase]) for phase in phases}
    return Prediction(costs, plan_peak(plan), plan_peak_bytes(plan))


def plan_peak_bytes(plan) -> int:
    """`memory.peak_bytes` of `plan`: priced on a problem whose only candidate per searched op
    is the plan's strategy (edges and costs play no part in memory)."""
    graph, followers = searched_graph(plan.graph)
    candidates = {name: (plan.ops[name].strategy,) for name in graph.ops}
    fixed = SearchProblem(graph, plan.device_num, False, candidates, (), {}, {}, optimizer_state(plan.graph, followers),
                          optimizer_shard=plan.optimizer_shard,
                          sizes=plan.sizes)
    return peak_bytes(fixed, dict.fromkeys(graph.ops, 0))
