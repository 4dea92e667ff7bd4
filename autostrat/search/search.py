"""From a traced graph to a plan, in one of MindSpore's parallel modes, optionally refined."""

from __future__ import annotations

import gc
from dataclasses import dataclass, replace

from autostrat.errors import ConfigError, InfeasibleError, SolverError
from autostrat.ir import Graph
from autostrat.layout import FollowedStrategy, Layout, TensorMap, DeviceMatrix
from autostrat.redistribution import collector_paused
from autostrat.redistribution.parallel import pricing
from autostrat.search.plan import Plan, Refinement, build_plan
from autostrat.search.problem import build_problem, searched_graph
from autostrat.search.propagate import data_parallel, propagate
from autostrat.search.deadline import CollectorReserve, Deadline, TimeRanOut
from autostrat.search.memory import peak_floor, resident_floor
from autostrat.search.options import SearchOptions
from autostrat.search.optimizer_shard import OptimizerShard, update_layout

# Under a budget, how many times the solver may be asked again when the plan's buffers
# (`buffers.plan_peak`) exceed what its per-op model allowed.
BUDGET_ROUNDS = 4
PLAN_RESERVE = 3.0  # the refinement stops this many times the start plan's build time before the limit


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
                                 precision=options.precision, micro_batches=options.micro_batches,
                                 backward_regathers=options.backward_regathers)
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
                            micro_batches=options.micro_batches, backward_regathers=options.backward_regathers)
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
    if not options.refines:
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
                      bucket_bytes=options.bucket_bytes, backward_regathers=options.backward_regathers)
