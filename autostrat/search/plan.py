"""The search result: a strategy per op, a layout per tensor, a redistribution per edge."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace
from functools import cached_property
from pathlib import Path

from autostrat.autodiff import op_phase
from autostrat.cost import Hardware
from autostrat.cost.ring import ring_bytes
from autostrat.ir import Graph
from autostrat.layout import Layout, Strategy
from autostrat.redistribution import RedistributionPlan
from autostrat.layout.named import layout_entry
from autostrat.search.bounds import plan_bounds
from autostrat.search.checkpoint import checkpoint_bytes
from autostrat.search.dump import write_dumps
from autostrat.search.optimizer_shard import OptimizerShard, rest_layout
from autostrat.search.precision import PRECISION_MEMORY, TensorSizes
from autostrat.search.problem_edges import backward_apart
from autostrat.search.prediction import Prediction, predict
from autostrat.search.shared_plans import LoweredPlans, PlanMemo
from autostrat.tables import format_table
from autostrat.io import as_output, write_atomically


@dataclass(frozen=True)
class OpPlan:
    name: str
    op_type: str
    strategy: Strategy
    origin: str


@dataclass(frozen=True)
class EdgeRedistribution:
    """The collectives that bring `tensor` to input `input_index` of `consumer`.

    When an earlier op (in graph order) already wants the tensor in an equivalent layout,
    `shares` names that op's input ``(op, index)``: this edge reads its result, sends nothing
    and costs nothing (one redistribution per tensor and target layout). With
    `Plan.backward_regathers` a backward op shares only a backward op's: the forward's copy is
    dropped after its forward readers, and the backward redistributes the tensor again when it
    needs it, as Megatron's sequence parallelism gathers the norms' outputs again for the weight
    gradients (Korthikanti et al. 2022, section 4.2.2): fewer bytes held, more sent.
    """

    tensor: str
    consumer: str
    input_index: int
    plan: RedistributionPlan
    shares: tuple[str, int] | None = None

    @property
    def cost(self) -> int:
        """Bytes per device this edge sends (0 when it shares an earlier redistribution)."""
        return 0 if self.shares else self.plan.cost


@dataclass(frozen=True)
class Writeback:
    """The collectives that bring `parameter`'s next value (`value`, in its update op's output
    layout) back to the layout the parameter is stored in, once per training step."""

    parameter: str
    value: str
    plan: RedistributionPlan


# Byte phases of a training step; "sync" is gradient synchronisation: the redistributions into
# the optimiser's update ops; "update" the writebacks of the new parameters and state.
BYTE_PHASES = ("forward", "backward", "sync", "update")


@dataclass(frozen=True)
class Refinement:
    """What the refinement (CP-SAT, or the IOPDDL solver: `RefineResult.solver`) did: the objective before it (in `unit`, bytes or ns per
    device), its result, and the ops it changed."""

    before: int
    result: object  # a `refine.RefineResult`
    changed: tuple[str, ...]
    unit: str = "bytes"
    # The budget the solver's per-op memory model was held to, when below max_device_memory so
    # that the plan's redistributed copies fit too (see `search.search`); its status and bound
    # are then those of plans within that budget.
    model_budget: int | None = None

    def summary(self) -> str:
        result = self.result
        tightened = "" if self.model_budget is None else (
            f" (under {self.model_budget:,} bytes for the per-op memory model, so that the plan's copies fit the budget)")
        space = f" among {result.space}" if result.space else ""
        return (
            f"refined by {result.solver}: {self.before} -> {result.objective} {self.unit} per device, {result.status}{space}{tightened}, "
            f"bound {result.bound}{'' if result.exact else ' (over plans whose repeated layers agree)'}, "
            f"gap {result.gap:.2%}, {result.seconds:.2f} s, {len(self.changed)} op(s) changed; {result.stopped or result.coarsening}"
        )


@dataclass(frozen=True)
class Plan:
    """A strategy per op and everything it implies.

    `layouts` gives each tensor the layout it is produced in: an op output its producer's
    output layout (possibly partial), a parameter or graph input the layout its first consumer
    wants (it is loaded already sliced). `redistributions` lists every op input whose layout
    differs from the one its op needs, with the cheapest plan between them.
    """

    graph: Graph
    device_num: int
    mode: str
    ops: dict[str, OpPlan]
    layouts: dict[str, Layout]
    redistributions: tuple[EdgeRedistribution, ...]
    warnings: tuple[str, ...] = ()
    refinement: Refinement | None = None
    writebacks: tuple[Writeback, ...] = ()
    cost_model: str = "bytes"  # what the search minimised: "bytes" or "time" (see `search.SearchOptions`)
    hardware: Hardware = Hardware()  # what the predictions (and a "time" search) assume
    optimizer_shard: OptimizerShard | None = None  # enable_parallel_optimizer: updates split over replicas
    recompute: object = None  # with auto_recompute: the `recompute_choice.RecomputeChoice` that chose this graph
    pipeline: object = None  # with pipeline_stages: the `pipeline.Pipeline` (this plan is one stage's devices')
    precision: str = "fp32"  # what its memory counts per trained parameter (`search.precision`)
    bucket_bytes: int = 0  # gradient synchronisation in buckets of this many bytes, overlapped (0: after the backward)
    backward_regathers: bool = False  # the backward redistributes its inputs itself (`build_plan`)

    @cached_property
    def sizes(self) -> TensorSizes:
        """Bytes per element, and the dtype priced, of each tensor in `precision` (`search.precision`)."""
        return TensorSizes.of(self.graph, self.precision)

    @cached_property
    def prediction(self) -> Prediction:
        """Predicted time and bytes per phase of one step and peak memory per device
        (`search.prediction`), on `hardware`."""
        return predict(self, self.hardware, self.byte_phases)

    @property
    def total_bytes(self) -> int:
        """Bytes each device sends for one step (forward pass, or training step): its
        redistributions and its ring strategies' rings."""
        edges = sum(edge.cost for edge in self.redistributions) + sum(w.plan.cost for w in self.writebacks)
        return edges + sum(self.ring_bytes.values())

    @cached_property
    def ring_bytes(self) -> dict[str, int]:
        """Per op with a ring strategy, the bytes each device sends around its ring (`cost.ring`)."""
        return {name: ring_bytes(op.strategy, self.sizes.priced(self.graph.ops[name].inputs[1]))
                for name, op in self.ops.items() if op.strategy.ring}

    @cached_property
    def resting(self) -> frozenset[str]:
        """The parameters kept sharded at rest (ZeRO-3), gathered for each op reading them."""
        return resting_parameters(self.graph, {name: op.strategy for name, op in self.ops.items()})

    def replicas(self, parameter: str) -> int:
        """How many devices compute with the same slice of `parameter`: the replicas of the
        layout the op reading it first uses (ZeRO-3 may keep it sharded further at rest; it is
        gathered back to that slice to compute). With ``gradients_mean=False`` its update sums
        that many gradients, as MindSpore sums over a parameter's mirror group.

        Example (the tutorial seed splits dense1.weight 4 ways on 8 devices):
            >>> from autostrat.models import tutorial_plan
            >>> tutorial_plan().replicas("dense1.weight")
            2
        """
        op, index = self.graph.consumers(parameter)[0]
        return len(self.ops[op].strategy.input_layouts[index].replica_groups()[0])

    @property
    def byte_phases(self) -> tuple[str, ...]:
        """`BYTE_PHASES`, and "gather" when parameters rest sharded (ZeRO-3)."""
        return BYTE_PHASES + (("gather",) if self.resting else ())

    def edge_phase(self, edge: EdgeRedistribution) -> str:
        """The `byte_phases` entry of an edge: "gather" for a parameter sharded at rest, else
        its consumer's phase, "sync" for update ops."""
        if edge.tensor in self.resting:
            return "gather"
        phase = op_phase(edge.consumer)
        return "sync" if phase == "update" else phase

    def phase_bytes(self) -> dict[str, int]:
        """Bytes per device per step, by `byte_phases` entry.

        Example:
            >>> from autostrat.models import tutorial_plan
            >>> tutorial_plan(seed=None).phase_bytes()
            {'forward': 0, 'backward': 0, 'sync': 0, 'update': 0}
        """
        totals = dict.fromkeys(self.byte_phases, 0)
        for edge in self.redistributions:
            totals[self.edge_phase(edge)] += edge.cost
        totals["update"] += sum(w.plan.cost for w in self.writebacks)
        for name, sent in self.ring_bytes.items():
            totals[op_phase(name)] += sent
        return totals

    def regathered(self) -> tuple[EdgeRedistribution, ...]:
        """The backward's redistributions that would share a forward one's copy but for
        `backward_regathers` (the same tensor into the same layout): what it sends again.

        Example (a forward-only plan regathers nothing):
            >>> from autostrat.models import tutorial_plan
            >>> tutorial_plan().regathered()
            ()
        """
        def wanted(edge: EdgeRedistribution):
            return edge.tensor, self.ops[edge.consumer].strategy.input_layouts[edge.input_index].normalized()

        forward = {wanted(edge) for edge in self.redistributions if op_phase(edge.consumer) == "forward"}
        return tuple(edge for edge in self.redistributions
                     if not edge.shares and op_phase(edge.consumer) == "backward" and wanted(edge) in forward)

    def bytes_into(self, op: str) -> int:
        """Bytes per device the redistributions into `op`'s inputs send."""
        return self._bytes_by_consumer.get(op, 0)

    @cached_property
    def _bytes_by_consumer(self) -> dict[str, int]:
        # Summed once: `table` asks for every op, and a scan of the edges per op was quadratic
        # (9 of 66 s of a 16 384-device search of 10 356 ops).
        totals: dict[str, int] = {}
        for edge in self.redistributions:
            totals[edge.consumer] = totals.get(edge.consumer, 0) + edge.cost
        return totals

    def table(self) -> str:
        """One line per op: strategy, origin, output layout and the bytes of its input edges."""
        changed = set(self.refinement.changed) if self.refinement else set()
        rows = []
        for name, op in self.ops.items():
            out = self.layouts[self.graph.ops[name].outputs[0]]
            origin = op.origin + (" (changed by CP-SAT)" if name in changed else "")
            stage = [self.pipeline.stage_label(name)] if self.pipeline else []
            rows.append([name, *stage, op.op_type, str(op.strategy), origin, str(out.normalized()), str(self.bytes_into(name))])
        stage = ["stage"] if self.pipeline else []
        text = format_table(["op", *stage, "type", "strategy", "origin", "output layout", "bytes in"], rows)
        steps = [f"  {edge.tensor} -> {edge.consumer}[{edge.input_index}]: {_described(edge)}" for edge in self.redistributions]
        steps += [f"  {w.value} -> {w.parameter} (writeback): {w.plan}" for w in self.writebacks]
        lines = [text, "redistributions:", *(steps or ["  none"]), f"total bytes per device: {self.total_bytes}",
                 plan_bounds(self).line]
        if self.refinement:
            lines.append(self.refinement.summary())
        if self.recompute is not None:
            lines.append(self.recompute.summary())
        if self.pipeline is not None:  # its stages' figures first: the lines after it are not a stage's
            lines += [self.pipeline.summary(), "the lines below price one micro-batch's step of every stage's ops "
                      "on one stage's devices (not a pipeline stage's step or peak: those are above)"]
        if self.graph.updates:
            lines.append("per training step: " + ", ".join(f"{k} {v}" for k, v in self.phase_bytes().items()))
        if self.precision != "fp32":
            lines.append(f"precision: {self.precision} ({PRECISION_MEMORY})")
        lines += [f"cost model: {self.cost_model}; hardware: {self.hardware.describe()}", *self.prediction.lines()]
        return "\n".join(lines)

    def to_dict(self) -> dict:
        # Each plan lowered once: edges of repeated layers share their plans (`shared_plans.PlanMemo`), and
        # the primitives list every rank group (7 833 edges of 16 384 ranks: 514 MB of text).
        lowered = LoweredPlans()
        return {
            "graph": self.graph.name,
            "device_num": self.device_num,
            "mode": self.mode,
            "total_bytes_per_device": self.total_bytes,
            "ops": [
                {"name": n, "type": o.op_type, "strategy": [list(t) for t in o.strategy.to_tuples()], "origin": o.origin}
                | ({"out_strategy": [list(t) for t in o.strategy.out_tuples()]} if o.strategy.out_tuples() is not None else {})
                | ({"partial_sums": True} if o.strategy.sums_partials else {})  # partial inputs summed on
                | ({"at_rest": list(o.strategy.at_rest)} if o.strategy.at_rest else {})  # ZeRO-3's inputs kept sharded
                | ({"ring_bytes": self.ring_bytes[n]} if o.strategy.ring else {})  # sent around the op's ring
                | ({"in_layout": [layout_entry(layout) for layout in o.strategy.input_layouts]}  # an axis order tuples cannot say
                   if o.strategy.placement is not None else {})
                | ({"stage": self.pipeline.stage_label(n)} if self.pipeline else {})
                for n, o in self.ops.items()
            ],
            "layouts": {name: str(layout) for name, layout in self.layouts.items()},
            "redistributions": [
                {
                    "tensor": e.tensor,
                    "consumer": e.consumer,
                    "input": e.input_index,
                    "bytes": e.cost,
                    "shares": None if e.shares is None else f"{e.shares[0]}[{e.shares[1]}]",
                    "steps": [str(step) for step in e.plan.steps],
                    "primitives": list(lowered(e.plan)),
                }
                for e in self.redistributions
            ],
            "writebacks": [{"parameter": w.parameter, "value": w.value, "bytes": w.plan.cost,
                            "steps": [str(step) for step in w.plan.steps]} for w in self.writebacks],
            "warnings": list(self.warnings),
            "refinement": None if self.refinement is None else {
                "before": self.refinement.before,
                "after": self.refinement.result.objective,
                "bound": self.refinement.result.bound,
                "status": self.refinement.result.status,
                "changed": list(self.refinement.changed),
                "coarsening": self.refinement.result.coarsening,
                "merged": list(self.refinement.result.merged),
                "exact": self.refinement.result.exact,
                "space": self.refinement.result.space,
            },
            # Appended after the plan's own keys, which stay as they were before predictions
            # (and optimizer sharding, only when on, so plans without it keep their digests).
            "cost_model": self.cost_model,
            "hardware": asdict(self.hardware),
            "predicted": self.prediction.to_dict(),
        } | ({} if self.optimizer_shard is None else {"optimizer_shard": asdict(self.optimizer_shard)}) | (
            {} if self.recompute is None else {"recompute": self.recompute.to_dict()}) | (
            {} if self.pipeline is None else {"pipeline": self.pipeline.to_dict()}) | (
            {} if self.precision == "fp32" else {"precision": self.precision}) | (  # fp32 plans keep their digests
            {"bucket_bytes": self.bucket_bytes} if self.bucket_bytes else {})

    def to_json(self, **extra) -> str:
        """`to_dict` as JSON text, with `extra` keys after the plan's own (the CLI's "source")."""
        return "".join(self.json_chunks(**extra))

    def json_chunks(self, **extra):
        """`to_json`'s text in the pieces the JSON encoder makes, for writing it as it is made:
        at 16 384 devices every collective lists its rank groups and the text is 514 MB.

        Example:
            >>> from autostrat.models import tutorial_plan
            >>> plan = tutorial_plan()
            >>> "".join(plan.json_chunks()) == json.dumps(plan.to_dict(), indent=1) + "\\n"
            True
        """
        yield from json.JSONEncoder(indent=1).iterencode(self.to_dict() | extra)
        yield "\n"

    def save(self, path) -> None:
        """Write the plan as JSON to `path` (a path or an `io.OutputPath`), as `io` writes every file."""
        write_atomically(path, self.json_chunks())

    def save_strategy(self, path) -> None:
        """Write the strategy checkpoint in MindSpore's format to `path` (a path or an
        `io.OutputPath`): protobuf for ``.ckpt``, JSON otherwise (see `search.checkpoint`)."""
        output = as_output(path)
        write_atomically(output, checkpoint_bytes(self, output.path))

    def dump_ir(self, directory, rank: int = 0) -> list[Path]:
        """Write the annotated graph and `rank`'s sliced graph (`search.dump`); returns their paths."""
        return write_dumps(self, Path(directory), rank)


def _described(edge: EdgeRedistribution) -> str:
    if edge.shares is None:
        return str(edge.plan)
    return f"shares the redistribution into {edge.shares[0]}[{edge.shares[1]}], 0B"


def build_plan(graph: Graph, device_num: int, mode: str, strategies: dict[str, Strategy], origins: dict[str, str], warnings,
               progress=None, cost_model: str = "bytes", hardware: Hardware = Hardware(),
               optimizer_shard: OptimizerShard | None = None, precision: str = "fp32", bucket_bytes: int = 0,
               backward_regathers: bool = False) -> Plan:
    """Layouts and redistributions implied by one strategy per op (`progress.step` hears of
    every op planned, see `progress.SearchProgress`), predicted on `hardware`; with
    `backward_regathers`, the backward shares no forward op's redistribution
    (`EdgeRedistribution`)."""
    model = hardware.alpha_beta(device_num) if cost_model == "time" else None  # the search's redistributions
    timing = hardware.alpha_beta(device_num)  # what each collective's algorithm is chosen on (`plan_with_algorithms`)
    planned = PlanMemo(model, timing, cost_model)
    layouts: dict[str, Layout] = {}
    for name, op in graph.ops.items():
        strategy = strategies[name]
        for index, tensor in enumerate(op.inputs):
            # A parameter or input lives where it is first used, or with ZeRO-3 maybe sharded at rest.
            layouts.setdefault(tensor, rest_layout(optimizer_shard, strategy, index, graph.tensors[tensor].dtype))
        layouts.update(zip(op.outputs, strategy.output_layouts))
    resting, sizes = resting_parameters(graph, strategies), TensorSizes.of(graph, precision)
    edges, paid = [], {}  # paid: (tensor, normal form wanted) -> the edge that redistributes it
    for number, (name, op) in enumerate(graph.ops.items()):
        if progress is not None:
            progress.step("planning redistributions", number, len(graph.ops))
        for index, (tensor, wanted) in enumerate(zip(op.inputs, strategies[name].input_layouts)):
            held = layouts[tensor]
            if held.equivalent(wanted):
                continue
            key = (tensor, wanted.normalized(), backward_apart(name, backward_regathers))
            earlier = paid.get(key)
            if earlier is not None and tensor not in resting:  # a resting parameter is gathered per use
                edges.append(replace(earlier, consumer=name, input_index=index, shares=(earlier.consumer, earlier.input_index)))
                continue
            plan = planned(held, wanted, sizes.priced(tensor))
            edges.append(EdgeRedistribution(tensor, name, index, plan))
            paid[key] = edges[-1]
    ops = {name: OpPlan(name, graph.ops[name].op_type, strategies[name], origins[name]) for name in graph.ops}
    ordered = {name: layouts[name] for name in graph.tensors if name in layouts}
    # A writeback brings `value` (in its update op's output layout) back to the layout the
    # parameter is stored in: the next step loads it from there.
    writebacks = tuple(Writeback(parameter, value, planned(layouts[value], layouts[parameter], sizes.priced(value)))
                       for parameter, value in graph.updates)
    return Plan(graph, device_num, mode, ops, ordered, tuple(edges), tuple(warnings),
                writebacks=tuple(w for w in writebacks if w.plan.steps), cost_model=cost_model, hardware=hardware,
                optimizer_shard=optimizer_shard, precision=precision, bucket_bytes=bucket_bytes,
                backward_regathers=backward_regathers)


def resting_parameters(graph: Graph, strategies) -> frozenset[str]:
    """The parameters kept sharded at rest (ZeRO-3) by the ops reading them first.

    Example (the tutorial FFN's first matmul keeping its weight at rest):
        >>> from dataclasses import replace
        >>> from autostrat.models import tutorial_plan
        >>> plan = tutorial_plan()
        >>> strategies = {name: op.strategy for name, op in plan.ops.items()}
        >>> strategies["dense1.matmul"] = replace(strategies["dense1.matmul"], at_rest=(1,))
        >>> sorted(resting_parameters(plan.graph, strategies))
        ['dense1.weight']
    """
    return frozenset(graph.ops[name].inputs[index] for name, strategy in strategies.items() for index in strategy.at_rest)
