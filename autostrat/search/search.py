"""From a traced graph to a plan, in one of MindSpore's parallel modes, optionally refined."""

from __future__ import annotations

import gc
from dataclasses import dataclass, replace

from autostrat.cost import Hardware
from autostrat.errors import ConfigError, InfeasibleError, SolverError
from autostrat.ir import Graph
from autostrat.layout import FollowedStrategy, Layout, TensorMap, DeviceMatrix
from autostrat.redistribution import collector_paused
from autostrat.redistribution.parallel import pricing
from autostrat.search.plan import Plan, Refinement, build_plan
from autostrat.search.problem import build_problem, searched_graph
from autostrat.search.propagate import data_parallel, propagate
from autostrat.search.coarsen import LEVELS
from autostrat.search.deadline import CollectorReserve, Deadline, TimeRanOut
from autostrat.search.memory import peak_floor, resident_floor
from autostrat.search.optimizer_shard import OptimizerShard, update_layout
from autostrat.cost.overlap import check_bucket_bytes
from autostrat.search.precision import check_precision
from autostrat.strategies import check_mesh

MODES = ("auto_parallel", "data_parallel", "semi_auto_parallel", "stand_alone")
SEARCH_MODES = ("integer_programming", "sharding_propagation")
REFINERS = (None, "cpsat", "solve")
COST_MODELS = ("bytes", "time")
# Under a budget, how many times the solver may be asked again when the plan's buffers
# (`buffers.plan_peak`) exceed what its per-op model allowed.
BUDGET_ROUNDS = 4
PLAN_RESERVE = 3.0  # the refinement stops this many times the start plan's build time before the limit


@dataclass(frozen=True)
class SearchOptions:
    """How to search.

    - `mode`: auto_parallel searches as `search_mode` says; semi_auto_parallel keeps the seeds
      and splits every other op's batch dim; data_parallel ignores seeds and splits every batch
      dim; stand_alone plans for one device.
    - `search_mode`: sharding_propagation propagates the seeds by BFS; integer_programming is
      fully automatic: it needs no seeds, every op uses every device (no all-ones or repeated
      candidates where a full split exists), and CP-SAT finds the optimum (it implies `refine`).
    - `refine`: "cpsat" refines the BFS plan to the proven optimum of the same cost model (at
      coarsening "exact", when CP-SAT proves nothing within two thirds of the time, the IOPDDL
      solver improves its plan in the rest: `solve.untied`);
      "solve" runs the IOPDDL solver (`solve.refinement`) instead, for graphs too large to prove:
      a plan never worse than the BFS one, FEASIBLE, not proven. A budget alone means "cpsat".
    - `refine_time_limit`: seconds a refining search may take, from its start: the problem and
      the propagation (which do not look at the clock: their plan is the floor) and then the
      extra starts, cost tables, coarsening, model building, solves and retries (`deadline`),
      which end three times the start plan's build time early, so that the plan of what they found is
      built within the limit; when they run out before the solve, the plan is the best start
      and its summary says so.
    - `max_device_memory`: per-device bytes the refined plan's peak must fit in.
    - `workers`: CP-SAT's workers (0: one, and the plan byte-identical run to run; more race,
      and of equal plans any may win).
    - `pricing_processes`: above 1, the processes that price the refinement's cost tables
      (`redistribution.parallel`): the same prices, so the same plans, sooner.
    - `coarsen`: how the solver's model is reduced (`coarsen.LEVELS`): "exact" keeps the
      optimum, "layers" also shares the variables of identical repeated layers (the optimum
      among plans whose repeated layers agree, as Megatron's and Alpa's layer clustering
      have). None (`coarsening`): "layers" in integer_programming, whose model covers every
      op of a deep network, "exact" for a refinement of sharding_propagation's plan.
    - `allow_repeated`: whether candidates may use fewer devices (repeated calculation); None
      allows it in sharding_propagation (a propagated layout may be replicated) only.
    - `follow_layers`: sharding_propagation copies a seeded layer's strategies to the unseeded
      layers repeating it (`propagate.seeded_layers`) when that plan is cheaper than
      propagating them (`propagate.propagate`).
    - `mesh`: the logical mesh candidates are split over (`strategies.mesh_axes`): "auto"
      (every divisor up to 16 devices, servers x 8 devices beyond), "full" (every divisor), or
      its axis sizes, outer first, e.g. ``(128, 8)``.
    - `cost_model`: what the search minimises: "bytes" sent per device, or "time", the step
      time predicted on `hardware` (compute per op, α–β time per redistribution). Plans report
      both either way.
    - `optimizer_shard`: MindSpore's parallel optimizer (`optimizer_shard.OptimizerShard`):
      parameters' optimiser state and updates split over their replicas; None: off.
    - `precision`: what memory counts per trained parameter (`precision.PRECISIONS`; fp32 by
      default, 16-bit as Megatron's distributed optimizer keeps it: `search.precision`).
    - `seeds_from_one_plan`: the seeds were read from one saved plan (a strategy checkpoint), so
      a redistribution between two of them is not a disagreement to warn about.
    - `micro_batches`: how many micro-batches a step runs the graph for (a pipeline's
      micro-batch graph, `pipeline.plan_pipeline`): what runs once per step (gradient
      synchronisation, updates) weighs ``1 / micro_batches`` against what every micro-batch
      pays (`problem.build_problem`).
    - `bucket_bytes`: gradient synchronisation in buckets of this many gradient bytes per
      device, overlapped with the backward (MindSpore's ``comm_fusion`` by size): every plan's
      predicted step is the two-stream schedule (`prediction.sync_schedule`), so plans are
      compared on the overlapped time, and runs overlap it (`runtime.stream`); 0: after the backward.
    """

    mode: str = "auto_parallel"
    search_mode: str = "sharding_propagation"
    allow_repeated: bool | None = None
    follow_layers: bool = True
    refine: str | None = None
    refine_time_limit: float = 60.0
    max_device_memory: int | None = None
    workers: int = 0
    pricing_processes: int = 0
    coarsen: str | None = None
    mesh: str | tuple[int, ...] = "auto"
    cost_model: str = "bytes"
    hardware: Hardware = Hardware()
    optimizer_shard: OptimizerShard | None = None
    seeds_from_one_plan: bool = False
    precision: str = "fp32"
    micro_batches: int = 1
    bucket_bytes: int = 0

    def __post_init__(self) -> None:
        for key, value, valid in (("parallel_mode", self.mode, MODES), ("search_mode", self.search_mode, SEARCH_MODES),
                                  ("refine", self.refine, REFINERS), ("coarsen", "exact" if self.coarsen is None else self.coarsen, LEVELS),
                                  ("cost_model", self.cost_model, COST_MODELS)):
            if value not in valid:
                raise ConfigError(f"{key} must be one of {', '.join(map(str, valid))}; got {value!r}")
        object.__setattr__(self, "mesh", check_mesh(self.mesh))
        if isinstance(self.micro_batches, bool) or not isinstance(self.micro_batches, int) or self.micro_batches < 1:
            raise ConfigError(f"micro_batches must be a positive integer, got {self.micro_batches!r}")
        if isinstance(self.pricing_processes, bool) or not isinstance(self.pricing_processes, int) or self.pricing_processes < 0:
            raise ConfigError(f"pricing_processes must be a whole number of processes (0: price in this one), "
                              f"got {self.pricing_processes!r}")
        check_precision(self.precision)
        check_bucket_bytes(self.bucket_bytes)

    @property
    def automatic(self) -> bool:
        return self.mode == "auto_parallel" and self.search_mode == "integer_programming"

    @property
    def coarsening(self) -> str:
        """The coarsening level the refinement uses (`coarsen`, resolved)."""
        if self.coarsen is not None:
            return self.coarsen
        return "layers" if self.automatic else "exact"

    @property
    def repeated(self) -> bool:
        """Whether candidates may repeat work (`allow_repeated`, resolved)."""
        if self.allow_repeated is not None:
            return self.allow_repeated
        return self.mode == "auto_parallel" and self.search_mode == "sharding_propagation"


def _unseeded(graph: Graph) -> Graph:
    ops = {name: replace(op, in_strategy=None, out_strategy=None) for name, op in graph.ops.items()}
    return replace(graph, ops=ops)


def _check_shared_parameters(graph: Graph, problem) -> None:
    """A parameter read by two seeded ops must be wanted in one layout by both."""
    for tensor in graph.parameters():
        wanted = {}
        for op, index in graph.consumers(tensor.name):
            if graph.ops[op].is_seeded:
                wanted[op] = problem.candidates[op][0].input_layouts[index]
        names = list(wanted)
        for other in names[1:]:
            if not wanted[other].equivalent(wanted[names[0]]):
                raise ConfigError(
                    f"parameter {tensor.name} is shared by {names[0]} and {other}, whose strategies want it in "
                    f"different layouts ({wanted[names[0]].normalized()} vs {wanted[other].normalized()}); "
                    f"seed them alike or leave one unseeded"
                )


def _extra_starts(problem, graph: Graph, device_num: int, options: SearchOptions, deadline: Deadline) -> list[dict[str, int]]:
    """Plans CP-SAT may start from besides the propagated one: the data-parallel plan around the
    seeds, which chooses alike in alike layers (a propagated plan may differ from layer to layer,
    which a solver whose repeated layers share variables cannot take up); under the time model,
    also the plan propagated by bytes (candidates do not depend on the cost model, so its
    choice is one of this problem's): it is the one a byte-minded budget was taken from. A start
    the `deadline` cuts short is left out (the refinement then stops at its first check)."""
    starts = [data_parallel(problem, keep_seeds=True).choice]
    if problem.model is not None and options.mode == "auto_parallel":
        by_bytes = build_problem(graph, device_num, options.repeated, mesh=options.mesh, optimizer_shard=options.optimizer_shard,
                                 precision=options.precision, micro_batches=options.micro_batches)
        try:
            starts.append(propagate(by_bytes, _CheckingDeadline(deadline), options.follow_layers).choice)
        except TimeRanOut:
            pass
    return starts


class _CheckingDeadline:
    """A propagation's progress (`progress.SearchProgress`) that checks the refinement's
    deadline at every op it reaches."""

    def __init__(self, deadline: Deadline):
        self.deadline = deadline

    def step(self, what: str, done: int, total: int) -> None:
        self.deadline.check("propagating the start that minimises bytes")

    def solution(self, objective: int, bound: int, seconds: float) -> None:
        """Propagation reports no solutions."""


def follow_parameters(graph: Graph, strategies: dict, device_num: int,
                      sharding: OptimizerShard | None = None) -> dict[str, tuple[FollowedStrategy, str]]:
    """The strategy of every update op: its parameter's layout, which the parameter's first
    reader chose (a parameter only its update reads is stored whole on every device), or with
    `sharding` that layout split over the parameter's replicas (its origin then says so)."""
    _, followers = searched_graph(graph)
    result = {}
    for name, parameter in followers.items():
        reader, index = graph.consumers(parameter)[0]
        if reader in strategies:
            layout = strategies[reader].input_layouts[index]
        else:
            shape = graph.tensors[parameter].shape
            layout = Layout(DeviceMatrix((device_num,)), TensorMap((-1,) * len(shape)), shape)
        updated = update_layout(sharding, layout, graph.tensors[parameter].dtype)
        origin = f"follows {parameter}"
        if updated is not layout:
            origin += f", optimizer shard of {layout.slice_shape[0] // updated.slice_shape[0]}"
            if reader in strategies and index in strategies[reader].at_rest:
                origin += ", at rest (ZeRO-3)"
        result[name] = (FollowedStrategy(graph.ops[name].rule, updated), origin)
    return result


def search(graph: Graph, device_num: int, options: SearchOptions = SearchOptions(), progress=None) -> Plan:
    """A strategy for every op of `graph` on `device_num` devices (see `SearchOptions`); a long
    search tells `progress` what it is doing (`progress.SearchProgress`).

    Example:
        >>> from autostrat.frontend import trace
        >>> from autostrat.models import FFN
        >>> from autostrat.nn import Tensor
        >>> net = FFN()
        >>> _ = net.dense1.matmul.shard(((2, 1), (1, 4)))
        >>> plan = search(trace(net, Tensor(shape=(64, 64)), device_num=8), 8)
        >>> str(plan.ops["dense2.matmul"].strategy), plan.total_bytes
        ('((2, 4), (4, 1))', 6144)
    """
    collects = gc.isenabled()  # the pause ends in a collection, which the time limit must leave time for
    with collector_paused():
        return _search(graph, device_num, options, progress, collects)


def _search(graph: Graph, device_num: int, options: SearchOptions, progress, collects: bool) -> Plan:
    # The time limit is the whole search's, from here: what the problem and the propagation take
    # is time the refinement no longer has (they do not look at the clock: their plan is the floor).
    deadline = Deadline(options.refine_time_limit)
    if options.mode == "stand_alone":
        graph, device_num = _unseeded(graph), 1
    elif options.mode == "data_parallel":
        graph = _unseeded(graph)
    hardware = options.hardware if options.cost_model == "time" else None
    problem = build_problem(graph, device_num, options.repeated, full_only=options.automatic, mesh=options.mesh,
                            hardware=hardware, optimizer_shard=options.optimizer_shard, precision=options.precision,
                            micro_batches=options.micro_batches)
    _check_shared_parameters(problem.graph, problem)
    if options.max_device_memory is not None:  # a budget no choice fits: refused before any cost table is priced
        floor = peak_floor(problem)
        if floor.bytes > options.max_device_memory:
            raise InfeasibleError(floor.refusal(options.max_device_memory))
    if options.automatic:
        assignment = data_parallel(problem, keep_seeds=True, seeds_from_one_plan=options.seeds_from_one_plan)
    elif options.mode == "auto_parallel":
        assignment = propagate(problem, progress, options.follow_layers, options.seeds_from_one_plan)
    else:
        assignment = data_parallel(problem, keep_seeds=options.mode == "semi_auto_parallel",
                                   seeds_from_one_plan=options.seeds_from_one_plan)
    if not (options.refine is not None or options.automatic or options.max_device_memory is not None):
        return _plan_of(problem, graph, device_num, options, assignment, assignment.choice, progress)
    return _refined_plan(problem, graph, device_num, options, assignment, progress, deadline, collects)


def _refined_plan(problem, graph: Graph, device_num: int, options: SearchOptions, assignment, progress,
                  deadline: Deadline, collects: bool = False) -> Plan:
    """The plan of the CP-SAT refinement; under a budget, one whose buffers fit it, the solver
    asked again under a tighter budget for its per-op model while the plan's copies push it over,
    and the cheapest start whose plan fits when they keep doing so (`_StartPlan`).
    `deadline` (`refine_time_limit` from the search's start) bounds the rest of the search: the
    extra starts, and each solve's pricing, coarsening and model building, which get the time
    the earlier left, less what the end needs: the final plan's build, and when the search
    `collects` (the collector was on before its pause), the collection its end sets off."""
    # The plan of what the refinement finds is built after it, within the limit too: build the
    # start's plan first (the fallback needs it anyway) and keep three times its time for that
    # build; and the collection the pause's end sets off, which grows with what the refinement
    # allocates (`CollectorReserve`: 9.3 s after a 40 s limit on the 7B step at 64 devices, when
    # three times the memoised build kept 0.24 s).
    began = deadline.elapsed()
    first = _plan_of(problem, graph, device_num, options, assignment, assignment.choice, None)  # progress: the final plan's
    deadline = deadline.reserving(PLAN_RESERVE * (deadline.elapsed() - began), CollectorReserve() if collects else None)
    # integer_programming starts from the data-parallel plan around the seeds already.
    starts = _extra_starts(problem, graph, device_num, options, deadline) if not options.automatic else []
    start = _StartPlan(problem, graph, device_num, options, assignment, progress, deadline, tuple(starts), first)
    with pricing(options.pricing_processes):
        return _budget_rounds(problem, graph, device_num, options, assignment, progress, deadline, starts, start)


def _budget_rounds(problem, graph: Graph, device_num: int, options: SearchOptions, assignment, progress,
                   deadline: Deadline, starts, start) -> Plan:
    """`_refined_plan`'s solves: under a budget, again under a tighter one while the plan's
    copies push it over, at most `BUDGET_ROUNDS` times, then the cheapest start that fits."""
    budget, plan = options.max_device_memory, None
    for attempt in range(BUDGET_ROUNDS):
        if plan is not None and deadline.passed():
            return start.if_it_fits(plan, attempt, None)
        try:
            result = _refine(options, problem, assignment.choice, budget, progress.solution if progress is not None else None,
                             starts, deadline)
        except (InfeasibleError, SolverError) as error:
            if plan is None:
                raise
            return start.if_it_fits(plan, attempt, error)
        changed = tuple(op for op in assignment.choice if result.choice[op] != assignment.choice[op])
        plan = _plan_of(problem, graph, device_num, options, assignment, result.choice, progress)
        refinement = Refinement(problem.cost(assignment.choice, shared=True), result, changed, problem.unit,
                                None if budget == options.max_device_memory else budget)
        plan = replace(plan, refinement=refinement)
        if budget is None:
            return plan
        over = plan.prediction.peak_bytes - options.max_device_memory
        if over <= 0:
            return plan
        # The solver's per-op model missed copies the plan's redistributions write: ask for a
        # plan its model puts that much below this one (at least 1 %, 2 %, 4 % of the budget
        # below: the next plan may write others).
        # Never below what the parameters and optimiser state alone need: no plan fits that.
        tighter = max(resident_floor(problem),
                      min(budget, plan.prediction.model_peak_bytes) - max(over, options.max_device_memory * 2**attempt // 100))
        if tighter >= budget:  # at the floor already: asking again would return the same plan
            return start.if_it_fits(plan, attempt + 1, None)
        budget = tighter
    return start.if_it_fits(plan, BUDGET_ROUNDS, None)


@dataclass(frozen=True)
class _StartPlan:
    """The best start whose plan fits, returned when the refined plans keep peaking over the
    budget with their redistributions' copies: a refinement never returns a worse plan than its
    starts, nor an error while one fits (measured: the 8-block stack under its Megatron plan's
    peak, whose first solve took the whole 60 s and peaked 216 MB over with its copies)."""

    problem: object
    graph: Graph
    device_num: int
    options: SearchOptions
    assignment: object
    progress: object
    deadline: Deadline
    starts: tuple[dict[str, int], ...]
    first: Plan  # the plan of the propagated assignment

    def if_it_fits(self, last: Plan, solves: int, error) -> Plan:
        """The plan of the cheapest start (the propagated one, then `starts`) whose peak fits
        max_device_memory, else why no plan fits: after `solves` solves the `last` plan peaked
        over (`error`: the last solve's, if it failed)."""
        from autostrat.search.refine import RefineResult, candidate_space

        budget, before = self.options.max_device_memory, self.problem.cost(self.assignment.choice, shared=True)
        for choice in sorted([self.assignment.choice, *self.starts], key=lambda c: self.problem.cost(c, shared=True)):
            plan = self.first if choice is self.assignment.choice else _plan_of(
                self.problem, self.graph, self.device_num, self.options, self.assignment, choice, self.progress)
            if plan.prediction.peak_bytes <= budget:
                break
        else:
            raise _copies_over_budget(last, budget, solves, error) from None
        note = (f"after {solves} solve(s) the refined plan still peaked over max_device_memory with its "
                f"redistributions' copies ({last.prediction.peak_bytes:,} bytes): the plan is the best start that fits")
        cost = self.problem.cost(choice, shared=True)
        result = RefineResult(dict(choice), cost, 0, "FEASIBLE", self.deadline.elapsed(), before,
                              space=candidate_space(self.problem), stopped=note,
                              solver="the IOPDDL solver" if self.options.refine == "solve" else "CP-SAT")
        changed = tuple(op for op in choice if choice[op] != self.assignment.choice[op])
        return replace(plan, refinement=Refinement(before, result, changed, self.problem.unit))


def _refine(options: SearchOptions, problem, choice: dict[str, int], budget: int | None, progress, starts, deadline):
    """The refinement `options.refine` names (CP-SAT unless "solve") of `choice` under `budget`;
    at coarsening "exact", CP-SAT and then, unless it proves its plan optimal, the IOPDDL solver
    from CP-SAT's plan (`solve.untied`)."""
    if options.refine == "solve":
        from autostrat.search.solve.refinement import refine_by_solver

        return refine_by_solver(problem, choice, options.refine_time_limit, options.workers, budget, progress,
                                starts=starts, deadline=deadline)
    return refine(problem, choice, options.refine_time_limit, options.workers, budget, progress, options.coarsening,
                  starts=starts, deadline=deadline)


def refine(problem, hint, time_limit, workers, budget, progress, level, **kwargs):
    """`search.refine.refine` at coarsening `level`, but `solve.untied.refine_untied` at
    "exact"; imported on first use: OR-Tools loads pandas too, 0.4 s that a search which does
    not refine (and `autostrat`'s start) need not spend."""
    if level == "exact":
        from autostrat.search.solve.untied import refine_untied

        return refine_untied(problem, hint, time_limit, workers, budget, progress, **kwargs)
    from autostrat.search.refine import refine as solve

    return solve(problem, hint, time_limit, workers, budget, progress, level, **kwargs)


def _copies_over_budget(plan: Plan, budget: int, solves: int, error) -> InfeasibleError:
    """Why no plan is returned when the ones the solver's model fits keep peaking over `budget`
    with their redistributions' copies (after `solves` solves; `error`: the last solve's)."""
    last = "" if error is None else f"; under a tighter model budget: {error}"
    return InfeasibleError(
        f"no plan found whose run fits max_device_memory = {budget:,} bytes per device: after {solves} solve(s) the "
        f"last plan peaks at {plan.prediction.peak_bytes:,} bytes with the copies its redistributions write "
        f"(the search's per-op memory model, which leaves them out, puts it at {plan.prediction.model_peak_bytes:,})"
        f"{last}. A larger budget, recompute or optimizer_level level3 may fit")


def _plan_of(problem, graph: Graph, device_num: int, options: SearchOptions, assignment, choice: dict, progress) -> Plan:
    """The plan of a choice of `problem`'s candidates, its update ops following their parameters."""
    strategies = {name: problem.candidates[name][index] for name, index in choice.items()}
    origins = dict(assignment.origin)
    for name, (strategy, origin) in follow_parameters(graph, strategies, device_num, options.optimizer_shard).items():
        strategies[name], origins[name] = strategy, origin
    return build_plan(graph, device_num, options.mode, strategies, origins, assignment.warnings, progress,
                      options.cost_model, options.hardware, options.optimizer_shard, options.precision,
                      bucket_bytes=options.bucket_bytes)
