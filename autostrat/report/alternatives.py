"""An op's alternatives in a plan (`report.explain`'s second question): every other candidate
the search could have given it, ranked by the local change in bytes (the redistributions into
and out of the op, its neighbours kept), the best few evaluated exactly by rebuilding the whole
plan with only this op changed (`swapped_plan`), and why each lost.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cache

from autostrat.errors import AutostratError
from autostrat.redistribution import plan_redistribution
from autostrat.search.optimizer_shard import rest_layout
from autostrat.search.plan import Plan, build_plan
from autostrat.search.prediction import format_nanoseconds
from autostrat.search.op_candidates import candidate_mesh, candidate_values, op_candidates
from autostrat.search.problem import searched_graph
from autostrat.search.propagate import SEED
from autostrat.search.search import follow_parameters


@dataclass(frozen=True)
class EdgeChange:
    """A redistribution (``tensor -> consumer[index]``, or a writeback) whose bytes differ."""

    edge: str
    before: int
    after: int


@dataclass(frozen=True)
class Alternative:
    """A candidate strategy of the op and what it changes against the plan.

    `local_bytes`: the change of the bytes into and out of this op, its neighbours kept (None:
    some redistribution is unreachable). When `evaluated`, the plan was rebuilt with only this
    op changed: `phase_bytes` (per phase), `step_time_ns` and `peak_bytes` are the rebuilt
    plan's minus the plan's, `changes` the redistributions that differ, `reason` why it lost.
    """

    strategy: str
    local_bytes: int | None
    evaluated: bool = False
    phase_bytes: dict[str, int] | None = None
    step_time_ns: int | None = None
    peak_bytes: int | None = None
    changes: tuple[EdgeChange, ...] = ()
    better: bool = False
    reason: str = ""

    @property
    def bytes(self) -> int | None:
        """The change of the bytes each device sends per step (every phase)."""
        return None if self.phase_bytes is None else sum(self.phase_bytes.values())


@cache
def _redistribution_bytes(src, dst, dtype: str, model) -> int | None:
    """Bytes of the plan from `src` to `dst` (None: unreachable), memoised: the ranking asks
    for the same few layout pairs over and over."""
    if src.equivalent(dst):
        return 0
    try:
        return plan_redistribution(src, dst, dtype, model).cost
    except AutostratError:
        return None


def other_candidates(plan: Plan, op: str, space: CandidateSpace | None = None) -> tuple:
    """The search's candidates of `op` (see the module docstring), its own strategy left out.

    Example (the tutorial FFN's ReLU on 8 devices: every 2-d split, and the repeated ones):
        >>> from autostrat.models import tutorial_plan
        >>> plan = tutorial_plan()
        >>> len(other_candidates(plan, "relu")), plan.ops["relu"].strategy in other_candidates(plan, "relu")
        (9, False)
    """
    graph, node, current = plan.graph, plan.graph.ops[op], plan.ops[op].strategy
    space = space or CandidateSpace.of(plan)
    repeated = plan.mode == "auto_parallel" or current.repeat > 1
    loaded = any(graph.tensors[tensor].producer is None for tensor in node.inputs)
    return tuple(s for s in op_candidates(node, plan.device_num, repeated, values=space.values, mesh=space.axes)
                 if s != current and not (loaded and s.sums_partials))


@dataclass(frozen=True)
class CandidateSpace:
    """What every op's candidates share, found once per plan: the splits and mesh the seeds
    imply, and the ops that follow others (update ops) rather than being searched."""

    values: object
    axes: object
    followers: dict

    @classmethod
    def of(cls, plan: Plan) -> CandidateSpace:
        seeds = [plan.ops[name].strategy for name, seeded in plan.graph.ops.items() if seeded.is_seeded]
        return cls(candidate_values(seeds, plan.device_num), candidate_mesh(seeds, plan.device_num),
                   searched_graph(plan.graph)[1])


def _local_bytes(plan: Plan, op: str, strategy) -> int | None:
    """Bytes into and out of `op` running `strategy`, every other op as the plan has it: from
    each input's layout (a parameter or input `op` reads first is loaded in the layout it
    wants), and from each output, or each such loaded input, to its other readers. As in the
    plan, readers wanting one tensor in one layout share one redistribution."""
    graph, model = plan.graph, plan.hardware.alpha_beta(plan.device_num) if plan.cost_model == "time" else None
    node, moves = graph.ops[op], {}  # (tensor, wanted, normalised) -> the layout it comes from
    for index, tensor in enumerate(node.inputs):
        readers, wanted = graph.consumers(tensor), strategy.input_layouts[index]
        if graph.tensors[tensor].producer is None and readers[0][0] == op:
            held = rest_layout(plan.optimizer_shard, strategy, readers[0][1], graph.tensors[tensor].dtype)
            others = [plan.ops[c].strategy.input_layouts[j] for c, j in readers if c != op]
        else:
            held, others = plan.layouts[tensor], []
            if any(_wants(plan, c, j) == wanted.normalized() for c, j in readers if c != op):
                continue  # another reader pays for this redistribution anyway
        for layout in [wanted, *others]:
            moves.setdefault((tensor, layout.normalized()), (held, layout))
    for index, tensor in enumerate(node.outputs):
        for consumer, position in graph.consumers(tensor):
            wanted = plan.ops[consumer].strategy.input_layouts[position]
            moves.setdefault((tensor, wanted.normalized()), (strategy.output_layouts[index], wanted))
    total = 0
    for (tensor, _), (src, dst) in moves.items():
        cost = _redistribution_bytes(src, dst, graph.tensors[tensor].dtype, model)
        if cost is None:
            return None
        total += cost
    return total


def _wants(plan: Plan, op: str, index: int):
    return plan.ops[op].strategy.input_layouts[index].normalized()


def local_alternatives(plan: Plan, ops, count: int = 3) -> dict[str, list[tuple[str, int | None]]]:
    """Per op of `ops`, the `count` other candidates that change the plan's bytes least, each
    with that local change (None: unreachable); the report lists them for the ops it can afford.

    Example (the tutorial FFN's second matmul could send 3,072 bytes less):
        >>> from autostrat.models import tutorial_plan
        >>> local_alternatives(tutorial_plan(), ["dense2.matmul"], 1)
        {'dense2.matmul': [('((8, 1), (1, 1))', -3072)]}
    """
    space = CandidateSpace.of(plan)
    return {op: [(str(strategy), change) for strategy, change in ranked_alternatives(plan, op, space)[:count]] for op in ops}


def ranked_alternatives(plan: Plan, op: str, space: CandidateSpace | None = None) -> list[tuple]:
    """Every other candidate with its local change in bytes, smallest first (unreachable last;
    ties in candidate order)."""
    space = space or CandidateSpace.of(plan)
    if op in space.followers:
        return []
    base = _local_bytes(plan, op, plan.ops[op].strategy)
    scored = []
    for strategy in other_candidates(plan, op, space):
        local = _local_bytes(plan, op, strategy)
        scored.append((strategy, None if local is None or base is None else local - base))
    return sorted(scored, key=lambda pair: (pair[1] is None, pair[1] or 0))


def swapped_plan(plan: Plan, op: str, strategy) -> Plan:
    """`plan` rebuilt with `op` running `strategy`, every other op as it was except the update
    ops, which follow their parameters' (possibly new) layouts as the search has them.

    Example:
        >>> from autostrat.models import tutorial_plan
        >>> plan = tutorial_plan()
        >>> from autostrat.layout import Strategy
        >>> columns = Strategy.from_tuples(plan.graph.ops["dense2.bias_add"].rule, ((1, 8), (8,)), 8)
        >>> plan.total_bytes, swapped_plan(plan, "dense2.bias_add", columns).total_bytes
        (6144, 7936)
    """
    strategies = {name: o.strategy for name, o in plan.ops.items()}
    origins = {name: o.origin for name, o in plan.ops.items()}
    strategies[op], origins[op] = strategy, "explain: only this op changed"
    _, followers = searched_graph(plan.graph)
    searched = {name: s for name, s in strategies.items() if name not in followers}
    for name, (followed, origin) in follow_parameters(plan.graph, searched, plan.device_num, plan.optimizer_shard).items():
        strategies[name], origins[name] = followed, origin
    return build_plan(plan.graph, plan.device_num, plan.mode, strategies, origins, plan.warnings,
                      cost_model=plan.cost_model, hardware=plan.hardware, optimizer_shard=plan.optimizer_shard,
                      precision=plan.precision, bucket_bytes=plan.bucket_bytes, backward_regathers=plan.backward_regathers)


def _edge_bytes(plan: Plan) -> dict[str, int]:
    edges = {f"{e.tensor} -> {e.consumer}[{e.input_index}]": e.cost for e in plan.redistributions}
    return edges | {f"{w.value} -> {w.parameter} (writeback)": w.plan.cost for w in plan.writebacks}


def evaluated_alternative(plan: Plan, op: str, strategy, local: int | None) -> Alternative:
    other = swapped_plan(plan, op, strategy)
    before, after = plan.phase_bytes(), other.phase_bytes()
    phases = {phase: after.get(phase, 0) - before.get(phase, 0) for phase in dict.fromkeys([*before, *after])}
    old, new = _edge_bytes(plan), _edge_bytes(other)
    changes = sorted((EdgeChange(edge, old.get(edge, 0), new.get(edge, 0)) for edge in dict.fromkeys([*old, *new])
                      if old.get(edge, 0) != new.get(edge, 0)), key=lambda c: -abs(c.after - c.before))
    time = other.prediction.step_time_ns - plan.prediction.step_time_ns
    peak = other.prediction.peak_bytes - plan.prediction.peak_bytes
    objective = sum(phases.values()) if plan.cost_model == "bytes" else time
    budget = plan.refinement.model_budget if plan.refinement else None
    over = budget is not None and other.prediction.peak_bytes > budget
    better = objective < 0 and not over
    alternative = Alternative(str(strategy), local, True, phases, time, peak, tuple(changes), better)
    return _with_reason(plan, op, alternative, objective, over and other.prediction.peak_bytes - budget)


def _with_reason(plan: Plan, op: str, alternative: Alternative, objective: int, over: int) -> Alternative:
    """`alternative` with the reason it lost, from its deltas and how the op was chosen."""
    unit = "bytes" if plan.cost_model == "bytes" else "step time"
    amount = f"{abs(objective):,} bytes" if plan.cost_model == "bytes" else format_nanoseconds(abs(objective))
    effects, seeded = _effects(alternative), plan.ops[op].origin == SEED
    if over:
        reason = f"peak memory {over:,} bytes over the refinement's budget; {effects}"
    elif objective > 0:
        reason = effects
    elif objective == 0:
        reason = (f"ties in the plan's cost model ({unit}): {effects}; nothing in that model prefers the plan's "
                  "strategy (the search breaks ties deterministically)")
    elif seeded:
        reason = f"cheaper by {amount}, but the seed fixes this op: {effects}"
    elif plan.refinement:
        reason = (f"better by {amount} in this plan: {effects}. The CP-SAT refinement's model (each edge priced "
                  "alone, redistributions of one tensor not shared) did not see it")
    else:
        reason = (f"better by {amount}: {effects}. The BFS propagation picks per edge (a local choice); "
                  "CP-SAT refinement (`--refine cpsat`) weighs the whole plan")
    if seeded and objective >= 0:
        reason += "; besides, the seed fixes this op"
    return replace(alternative, reason=reason)


def _effects(alternative: Alternative) -> str:
    """What the alternative changes, largest first: bytes (by phase, and the redistributions
    that change most), step time, peak memory."""
    parts = []
    if alternative.bytes:
        parts.append(f"sends {signed(alternative.bytes)} bytes{by_phase(alternative.phase_bytes)}")
    else:
        parts.append("same bytes")
    for change in alternative.changes[:2]:
        verb = "grows" if change.after > change.before else "shrinks"
        parts.append(f"the redistribution {change.edge} {verb} from {change.before:,} to {change.after:,} bytes")
    parts.append(f"step time {signed_time(alternative.step_time_ns)}" if alternative.step_time_ns else "same step time")
    if alternative.peak_bytes:
        parts.append(f"peak memory {signed(alternative.peak_bytes)} bytes")
    return "; ".join(parts)


def signed(value: int | None) -> str:
    """
    Example:
        >>> signed(6144), signed(-12), signed(0), signed(None)
        ('+6,144', '-12', '0', 'unreachable')
    """
    if value is None:
        return "unreachable"
    return f"{value:+,}" if value else "0"


def signed_time(value: int | None) -> str:
    if value is None:
        return ""
    return ("+" if value > 0 else "-" if value < 0 else "") + format_nanoseconds(abs(value))


def by_phase(phases: dict[str, int] | None) -> str:
    moved = [f"{phase} {signed(value)}" for phase, value in (phases or {}).items() if value]
    return f" ({', '.join(moved)})" if moved else ""
