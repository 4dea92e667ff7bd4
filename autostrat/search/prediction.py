"""What a plan is predicted to cost per step: time and bytes per phase, and peak memory per device.

- Compute: every op of the plan (update ops too), `Hardware.compute_nanoseconds` of its strategy,
  in its op's phase (`autodiff.op_phase`: forward, backward or update), and in the forward the
  host's loads of the step's inputs, parameters and state (`load_ns`: 0 but on a calibrated CPU).
- Communication: a ring strategy's sends that its compute does not hide (`cost.ring`), in its
  op's phase, and every redistribution of the plan, its steps timed by the α–β model of the plan's
  hardware (`AlphaBeta.step_nanoseconds`), in the phase its bytes are counted in
  (`Plan.edge_phase`; writebacks in "update").
- Peak memory: what a rank's buffers hold at most as it runs the step (`buffers.plan_peak`:
  parameters, optimiser state, activations, gradients and every redistribution's copies),
  equal to what a run measures; `model_peak_bytes` is the per-op model the solver's budget
  bounds (`memory.peak_bytes`), which leaves the copies out.

One device's step is the sum of its phases: compute and communication are not overlapped,
except, in a plan with `bucket_bytes`, the gradient synchronisation: it runs in buckets on a
second stream while the backward does (`sync_schedule`, `cost.overlap`, as the runtime runs it:
`runtime.stream`), a bucket's AllReduces over one group fused into one collective
(`search.fusion`): its "sync" phase holds the fused collectives' time and bytes, and
`Prediction.overlapped_ns`, what the two-stream schedule hides of them, is taken off the step.
Where the devices of a server share its cores (MPI ranks on one machine: the profile's
`cores_per_server`), every time is priced on `Hardware.shared`, the profile each rank sees.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from autostrat.autodiff import op_phase
from autostrat.cost import Hardware, op_cost
from autostrat.cost.overlap import SyncTimeline, packed_buckets, sync_timeline
from autostrat.cost.ring import ring_nanoseconds
from autostrat.cost.time_model import LOCAL_KINDS
from autostrat.search.buffers import plan_peak
from autostrat.search.fusion import sync_collectives
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
    overlapped_ns: int = 0  # the synchronisation hidden behind the backward (buckets: `sync_schedule`)

    @property
    def step_time_ns(self) -> int:
        return sum(phase.time_ns for phase in self.phases.values()) - self.overlapped_ns

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
                 f"{format_nanoseconds(self.compute_ns)} + communication {format_nanoseconds(self.communication_ns)}"
                 + (f" - overlapped {format_nanoseconds(self.overlapped_ns)} (sync in buckets behind the backward)"
                    if self.overlapped_ns else "")]
        for name, phase in self.phases.items():
            if phase == PhaseCost():
                continue  # a forward pass has no backward, sync or update phase to show
            lines.append(f"  {name}: compute {format_nanoseconds(phase.compute_ns)}, communication "
                         f"{format_nanoseconds(phase.communication_ns)}, {phase.bytes} bytes")
        lines.append(f"peak memory per device: {self.peak_bytes} bytes (parameters, optimizer state, live activations "
                     f"and redistributed copies; the search's per-op model: {self.model_peak_bytes})")
        return lines

    def to_dict(self) -> dict:
        overlapped = {"overlapped_ns": self.overlapped_ns} if self.overlapped_ns else {}  # older plans' JSON unchanged
        return {
            "step_time_ns": self.step_time_ns,
            "phases": {name: {"compute_ns": phase.compute_ns, "communication_ns": phase.communication_ns,
                              "bytes": phase.bytes} for name, phase in self.phases.items()},
            "peak_bytes_per_device": self.peak_bytes,
        } | overlapped


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
    return hardware.compute_nanoseconds(op_cost(plan.ops[name].strategy, dtypes), sizes.rate_dtypes(operands),
                                        plan.graph.ops[name].op_type)


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
    hardware = hardware.shared(plan.device_num)
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
    hardware = hardware.shared(plan.device_num)  # ranks sharing a machine's cores (`Hardware.shared`)
    model = hardware.alpha_beta(plan.device_num)
    compute, communication, sent = dict.fromkeys(phases, 0), dict.fromkeys(phases, 0), dict.fromkeys(phases, 0)
    times = {name: compute_ns(plan, name, hardware) for name in plan.graph.ops}
    for name, time in times.items():
        phase = op_phase(name)
        waited, ring = ring_cost(plan, name, hardware, time)
        compute[phase], communication[phase], sent[phase] = compute[phase] + time, communication[phase] + waited, sent[phase] + ring
    for phase, waited in crowded_waits(plan, hardware, times).items():
        if phase in communication:
            communication[phase] += waited
    if "forward" in phases:
        compute["forward"] += load_ns(plan, hardware)
    moves = [(plan.edge_phase(edge), edge.plan) for edge in plan.redistributions if not edge.shares]  # shared: sent once
    moves += [("update", writeback.plan) for writeback in plan.writebacks]
    for phase, redistribution in moves:
        communication[phase] += redistribution.nanoseconds(model)
        sent[phase] += redistribution.cost
    costs = {phase: PhaseCost(compute[phase], communication[phase], sent[phase]) for phase in phases}
    overlapped = 0
    if plan.bucket_bytes and plan.pipeline is None and "sync" in phases:  # as the runtime lowers it (`runtime.bucketing`)
        timeline = sync_schedule(plan, hardware, plan.bucket_bytes)
        synchronised = sum(b.end_ns - b.start_ns for b in timeline.buckets)  # the fused collectives' time
        fused = sum(c.bytes for bucket in sync_buckets(plan) for c in sync_collectives(plan, bucket))
        costs["sync"] = PhaseCost(compute["sync"], synchronised, fused)
        overlapped = timeline.backward_ns + synchronised - timeline.end_ns
    return Prediction(costs, plan_peak(plan), plan_peak_bytes(plan), overlapped)


def crowded_waits(plan, hardware: Hardware, times: dict[str, int]) -> dict[str, int]:
    """Per phase, what the plan's collectives wait beyond their messages where ranks share
    cores (`Hardware.collective_wait` of the shared profile; none otherwise): an op's first
    collective redistribution waits that fraction of the compute (`times`, per op) run since
    the collective before it, in graph order, as each rank reaches it at its turn on a core
    (at most `Hardware.collective_wait_most`: ranks computing long share the cores);
    so does the step's end, after the last collective (the step ends with its last rank: ranks
    that never wait for one another run their steps in turn).

    Example (the tutorial FFN: its one collective, a ReduceScatter into dense2's BiasAdd, waits
    half the four ops' compute before it; the step's end half of the BiasAdd's):
        >>> from autostrat.models import tutorial_plan
        >>> plan = tutorial_plan()
        >>> crowded_waits(plan, Hardware(collective_wait=0.5), {name: 1000 for name in plan.graph.ops})
        {'forward': 2500}
    """
    if not hardware.collective_wait:
        return {}

    def wait(since: int) -> int:
        return round(min(hardware.collective_wait * since, hardware.collective_wait_most * 1e9))

    collective = {}
    for edge in plan.redistributions:
        if not edge.shares and any(step.kind not in LOCAL_KINDS for step in edge.plan.steps):
            collective.setdefault(edge.consumer, plan.edge_phase(edge))
    waits, since = {}, 0
    for name in plan.graph.ops:
        if name in collective:
            waits[collective[name]] = waits.get(collective[name], 0) + wait(since)
            since = 0
        since += times[name]
    if since:  # the step ends when its last rank does: as at a collective, each reaches the end at its turn
        last = op_phase(next(reversed(plan.graph.ops)))
        waits[last] = waits.get(last, 0) + wait(since)
    return waits


def load_ns(plan, hardware: Hardware) -> int:
    """The host's time to load what a step reads and no op makes (graph inputs, parameters,
    constants, optimiser state): an instruction each (`Hardware.kernel_latency`), as the
    runtime takes each rank's slice (`runtime.instructions.Load`); 0 for a device's profile.

    Example (the tutorial FFN reads x and two weights and biases: 5 loads of 8 us):
        >>> from autostrat.models import tutorial_plan
        >>> load_ns(tutorial_plan(), Hardware(kernel_latency=8e-6))
        40000
    """
    loaded = sum(1 for tensor in plan.graph.tensors.values() if tensor.producer is None)
    return loaded * round(hardware.kernel_latency * 1e9)


def plan_peak_bytes(plan) -> int:
    """`memory.peak_bytes` of `plan`: priced on a problem whose only candidate per searched op
    is the plan's strategy (edges and costs play no part in memory)."""
    graph, followers = searched_graph(plan.graph)
    candidates = {name: (plan.ops[name].strategy,) for name in graph.ops}
    fixed = SearchProblem(graph, plan.device_num, False, candidates, (), {}, {}, optimizer_state(plan.graph, followers),
                          optimizer_shard=plan.optimizer_shard,
                          sizes=plan.sizes)
    return peak_bytes(fixed, dict.fromkeys(graph.ops, 0))


def sync_edges(plan) -> list:
    """The gradient synchronisations of `plan` (its "sync" edges; a shared one is sent once, by
    the edge it shares) in the order their gradients become final: by the graph position of the
    op producing the gradient, ties in the plan's edge order."""
    position = {name: index for index, name in enumerate(plan.graph.ops)}
    edges = [edge for edge in plan.redistributions if plan.edge_phase(edge) == "sync" and not edge.shares]
    return sorted(edges, key=lambda edge: position.get(plan.graph.tensors[edge.tensor].producer, len(position)))


def gradient_bytes(plan, edge) -> int:
    """The bytes of the gradient an edge synchronises, as each device holds it before: what a
    bucket's size counts (MindSpore's ``comm_fusion`` and DDP's buckets count gradients)."""
    return math.prod(edge.plan.src.slice_shape) * plan.sizes(edge.tensor)


def sync_buckets(plan, bucket_bytes: int | None = None) -> tuple[tuple, ...]:
    """The "sync" edges of `plan` in buckets of `bucket_bytes` (default the plan's) gradient
    bytes per device (`cost.overlap.packed_buckets`), in the order they run.

    Example (the tutorial FFN trained on 8 devices: gradients of 256, 4 096, 128 and 8 192
    bytes per device, ready in that order, in buckets of 8 192 bytes):
        >>> from autostrat.autodiff import SGD
        >>> from autostrat.models import tutorial_plan
        >>> plan = tutorial_plan(seed=None, optimizer=SGD())
        >>> [[edge.tensor for edge in bucket] for bucket in sync_buckets(plan, 8192)]
        [['grad/dense2.bias', 'grad/dense2.weight', 'grad/dense1.bias'], ['grad/dense1.weight']]
    """
    edges = sync_edges(plan)
    sizes = [gradient_bytes(plan, edge) for edge in edges]
    size = plan.bucket_bytes if bucket_bytes is None else bucket_bytes
    return tuple(tuple(edges[i] for i in members) for members in packed_buckets(sizes, size))


def sync_schedule(plan, hardware: Hardware, bucket_bytes: int) -> SyncTimeline:
    """The backward of `plan` (its ops' `op_times`, in graph order) with its gradient
    synchronisation (`sync_edges`, ready when the op producing its gradient ends) scheduled in
    buckets of `bucket_bytes` gradient bytes (`cost.overlap`, `sync_buckets`), a bucket timed as
    its fused collectives (`search.fusion.sync_collectives`); `bucket_bytes` 0: each edge after
    the backward as `predict` times it. The step's backward and sync as the runtime runs them.

    Example (the tutorial FFN trained on 8 devices: its sync is small next to its backward):
        >>> from autostrat.autodiff import SGD
        >>> from autostrat.models import tutorial_plan
        >>> plan = tutorial_plan(optimizer=SGD())
        >>> serial, overlapped = sync_schedule(plan, Hardware(), 0), sync_schedule(plan, Hardware(), 4096)
        >>> serial.backward_ns == overlapped.backward_ns, overlapped.end_ns <= serial.end_ns
        (True, True)
    """
    hardware = hardware.shared(plan.device_num)
    model, graph = hardware.alpha_beta(plan.device_num), plan.graph
    backward = op_times(plan, hardware, ("backward",))
    order = {name: index for index, name in enumerate(backward)}
    edges = sync_edges(plan)
    gradients = [(order.get(graph.tensors[edge.tensor].producer, len(order) - 1), gradient_bytes(plan, edge),
                  edge.plan.nanoseconds(model)) for edge in edges]

    def bucket_ns(members) -> int:
        return sum(c.nanoseconds(model) for c in sync_collectives(plan, [edges[i] for i in members]))

    return sync_timeline(list(backward.values()), gradients, bucket_bytes, bucket_ns)
