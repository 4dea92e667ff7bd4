"""The search's time limit counts from the search's start and bounds every phase of the
refinement together (the problem and the propagation come first and take their share): the extra
starts, pricing the cost tables, coarsening, building the model, the solves, the explanation of
an infeasible budget and the retries under a tighter budget. A fake clock stands in for the
machine's: faked solves advance it by all the time they are given, and a phase "takes" the time
when the clock jumps at its first look at the deadline. No timed test."""

from __future__ import annotations

import importlib

import pytest
from ortools.sat.python import cp_model

import autostrat.search.deadline as deadline_module
import autostrat.search.refine as refine_module
from autostrat.errors import InfeasibleError, SolverError
from autostrat.search import SearchOptions, search
from autostrat.search.cpsat import SolverModel
from autostrat.search.memory import PeakFloor, peak_bytes
from autostrat.search.refine import RefineResult, refine
from autostrat.search.problem import build_problem
from autostrat.search.propagate import data_parallel, propagate
from tests.test_refine import small_problem
from tests.test_refine_budget import gpt_training, starts

search_module = importlib.import_module("autostrat.search.search")  # the package names its function `search`


class FakeClock:
    """`time` as the deadline sees it: `perf_counter` reads `now`, which solves advance; with
    `jump_at` set, the first look at the deadline in that phase moves `now` past any limit."""

    def __init__(self):
        self.now, self.given = 1000.0, []
        self.phases: list[str] = []  # every phase that looked at the deadline, a new entry when it changes
        self.jump_at: str | int | None = None  # a phase's name (its first look), or an index into `phases`

    def perf_counter(self) -> float:
        return self.now

    def spend(self, seconds: float) -> None:
        """A solve given `seconds` that uses them all."""
        self.given.append(seconds)
        self.now += seconds

    def looked(self, phase: str) -> None:
        if self.phases and self.phases[-1] == phase:
            return
        first = phase not in self.phases
        self.phases.append(phase)
        if (first and phase == self.jump_at) or len(self.phases) - 1 == self.jump_at:
            self.now += 10_000.0


@pytest.fixture
def clock(monkeypatch):
    """A `FakeClock` every deadline reads, told of each phase that checks one."""
    fake = FakeClock()
    monkeypatch.setattr(deadline_module, "time", fake)
    check = deadline_module.Deadline.check

    def checked(self, phase: str) -> None:
        fake.looked(phase)
        check(self, phase)

    monkeypatch.setattr(deadline_module.Deadline, "check", checked)
    return fake


def test_an_infeasible_budget_is_explained_within_the_time_limit(monkeypatch, clock):
    def smallest_peak_plan(problem, deadline, workers, level):
        clock.spend(deadline.left())
        return None, False, None

    def solve(problem, built, objective, time_limit, workers, progress):
        clock.spend(time_limit)
        return cp_model.INFEASIBLE, None, 0

    monkeypatch.setattr(refine_module, "_smallest_peak_plan", smallest_peak_plan)
    monkeypatch.setattr(refine_module, "_solve", solve)
    problem = small_problem(8, 0)
    with pytest.raises(InfeasibleError, match="smallest achievable peak was not found within the time limit"):
        refine(problem, {op: 0 for op in problem.candidates}, time_limit=60, max_device_memory=1)
    # the start the memory-only model looks for, the solve, the explanation: 60 s in all
    assert clock.given == [15.0, 45.0, 0.0]


def test_the_retries_under_a_tighter_budget_share_the_time_limit(monkeypatch, clock):
    def refine_fake(problem, hint, time_limit, workers, budget, progress, level, starts, deadline):
        clock.spend(deadline.left())  # its plan's copies never fit the 1-byte budget: a retry is wanted
        cost = problem.cost(hint)
        return RefineResult(dict(hint), cost, 0, "FEASIBLE", time_limit, cost)

    monkeypatch.setattr(search_module, "refine", refine_fake)
    monkeypatch.setattr(search_module, "peak_floor", lambda problem: PeakFloor(0, ""))  # else the 1-byte budget is refused before any solve
    problem = small_problem(8, 0)
    options = SearchOptions(refine="cpsat", refine_time_limit=60, max_device_memory=1)
    with pytest.raises(InfeasibleError, match=r"after 1 solve\(s\) the last plan peaks at"):
        search(problem.graph, 8, options)
    assert clock.given == [60.0]


def test_the_refinement_keeps_three_times_the_start_plans_build_time_for_its_own_plan(monkeypatch, clock):
    # Building a plan takes 1 s here: the start's is built first, and the solve, which would
    # have had the whole 60 s, stops 3 s earlier, so that its plan is built within the limit.
    plan_of = search_module._plan_of

    def slow_plan_of(*args):
        clock.now += 1.0
        return plan_of(*args)

    def refine_fake(problem, hint, time_limit, workers, budget, progress, level, starts, deadline):
        clock.spend(deadline.left())
        cost = problem.cost(hint)
        return RefineResult(dict(hint), cost, 0, "FEASIBLE", time_limit, cost)

    monkeypatch.setattr(search_module, "_plan_of", slow_plan_of)
    monkeypatch.setattr(search_module, "refine", refine_fake)
    problem = small_problem(8, 0)
    search(problem.graph, 8, SearchOptions(refine="cpsat", refine_time_limit=60))
    assert clock.given == [56.0] and clock.now == 1000.0 + 58.0  # start plan 1 s, solve 56 s, its plan 1 s: within 60


def test_a_slow_model_build_returns_the_start_saying_where_the_time_ran_out(monkeypatch, clock):
    # Each edge's pair variables take 1 s of the 3 s limit: the model is never finished, nothing
    # is solved, and the plan is the start, not a solver's plan called OPTIMAL.
    add_edge = SolverModel._edge

    def slow_edge(self, edge, priced):
        clock.now += 1.0
        add_edge(self, edge, priced)

    monkeypatch.setattr(SolverModel, "_edge", slow_edge)
    graph = gpt_training(2).graph
    searched = build_problem(graph, 8, allow_repeated=True)  # the problem search builds
    known = [propagate(searched).choice, data_parallel(searched, keep_seeds=True).choice]
    plan = search(graph, 8, SearchOptions(refine="cpsat", refine_time_limit=3, coarsen="layers"))
    result = plan.refinement.result
    assert result.stopped == ("the time limit (3 s) ran out while building the CP-SAT model (pair variables and "
                              "shared redistributions): the plan is the best start, not refined")
    assert result.status == "FEASIBLE" and result.bound == 0
    best = min(known, key=lambda choice: searched.cost(choice, shared=True))
    assert result.choice == best and result.objective == searched.cost(best, shared=True) == plan.total_bytes
    assert plan.refinement.summary().endswith(result.stopped)


def test_every_phase_of_a_refinement_looks_at_the_deadline(monkeypatch, clock):
    # Under a budget no start fits, with a repeated layer: every phase of refine runs (the
    # layered start's, the smallest peak's, the exact model's), the solves faked away (they find
    # nothing: the smallest peak's plan is the one that fits). For each phase in turn, the clock
    # jumps past the deadline at its first look: the result, or the error when no start fits
    # yet, names that phase, and no later phase looks at the clock.
    monkeypatch.setattr(refine_module, "_solve", lambda *args: (cp_model.UNKNOWN, None, 0))
    problem = gpt_training(2)
    bfs, around_seeds = starts(problem)
    budget = min(peak_bytes(problem, bfs), peak_bytes(problem, around_seeds)) - 1
    assert refine(problem, bfs, time_limit=60, max_device_memory=budget, starts=[around_seeds]).stopped == ""
    phases = list(clock.phases)
    assert len(phases) >= 10 and len(set(phases)) >= 6
    for index, phase in enumerate(phases):
        clock.now, clock.phases, clock.jump_at = 1000.0, [], index
        try:
            result = refine(problem, bfs, time_limit=60, max_device_memory=budget, starts=[around_seeds])
        except SolverError as error:  # no start fits, and the time ran out before one was found
            assert f"the time limit (60 s) ran out while {phase}" in str(error) and "no plan was found" in str(error)
        else:
            assert f"the time limit (60 s) ran out while {phase}" in result.stopped and "the best start" in result.stopped
            assert peak_bytes(problem, result.choice) <= budget and result.bound == 0
        assert clock.phases[:index + 1] == phases[:index + 1]
        assert all(later.startswith(phase) for later in clock.phases[index:])  # or "... for the layered start"


def test_the_propagated_start_by_bytes_looks_at_the_deadline(clock):
    # Under the time cost model the refinement also propagates a start by bytes: when its
    # propagation runs out of time, the refinement stops saying so.
    problem = gpt_training(2)
    clock.jump_at = "propagating the start that minimises bytes"
    plan = search(problem.graph, 8, SearchOptions(refine="cpsat", refine_time_limit=60, cost_model="time"))
    assert plan.refinement.result.stopped.startswith(
        "the time limit (60 s) ran out while propagating the start that minimises bytes: the plan is the best start")


def test_the_time_the_propagation_takes_is_the_refinements_no_longer(monkeypatch, clock):
    # The limit counts from the search's start: a propagation taking 5 s of a 3 s limit leaves
    # the refinement nothing (the plan is the best start), one taking 2 s of 30 leaves each solve
    # at most the 28 s that are left.
    graph, propagated = gpt_training(2).graph, search_module.propagate
    taken = {"seconds": 5.0}

    def slow_propagation(*args, **kwargs):
        clock.now += taken["seconds"]
        return propagated(*args, **kwargs)

    monkeypatch.setattr(search_module, "propagate", slow_propagation)
    result = search(graph, 8, SearchOptions(refine="cpsat", refine_time_limit=3)).refinement.result
    assert result.stopped == "the time limit (3 s) ran out while pricing the starts: the plan is the best start, not refined"
    assert clock.given == []
    given = []

    def faked_solve(problem, built, objective, time_limit, *args):  # finds nothing in the time it is given
        given.append(time_limit)
        clock.spend(time_limit)
        return cp_model.UNKNOWN, None, 0

    monkeypatch.setattr(refine_module, "_solve", faked_solve)
    taken["seconds"] = 2.0
    search(graph, 8, SearchOptions(refine="cpsat", refine_time_limit=30, coarsen="layers"))
    assert given == [28.0]


def test_at_coarsening_exact_the_tied_and_untied_solves_and_the_solver_share_the_limit(monkeypatch, clock):
    # A propagation of 2 s in a 30 s limit: the tied model's solve until half the limit from
    # the refinement's start (15 s), the untied model's until two thirds of the limit from the
    # search's (3 s), the solver the last third (10 s); each finds nothing and takes its time.
    from tests.test_solve_untied import gpt_training as two_devices

    untied_module = importlib.import_module("autostrat.search.solve.untied")
    graph, propagated = two_devices().graph, search_module.propagate

    def slow_propagation(*args, **kwargs):
        clock.now += 2.0
        return propagated(*args, **kwargs)

    def faked_solve(problem, built, objective, time_limit, *args):
        clock.spend(time_limit)
        return cp_model.UNKNOWN, None, 0

    def faked_solver(problem, hint, deadline, **kwargs):
        clock.spend(deadline.left())
        return RefineResult(dict(hint), problem.cost(hint), 0, "FEASIBLE", 0.0, problem.cost(hint))

    monkeypatch.setattr(search_module, "propagate", slow_propagation)
    monkeypatch.setattr(refine_module, "_solve", faked_solve)
    monkeypatch.setattr(untied_module, "refine_by_solver", faked_solver)
    plan = search(graph, 2, SearchOptions(refine="cpsat", refine_time_limit=30))
    assert clock.given == [15.0, 3.0, 10.0] and clock.now == 1000.0 + 30.0
    assert "then the IOPDDL solver" in plan.refinement.result.coarsening


class FakeCollector:
    """`gc` as `CollectorReserve` sees it: `young` objects wait; a collection of them takes
    `seconds_per_object` each on `clock` and leaves none."""

    def __init__(self, clock: FakeClock, young: int, seconds_per_object: float):
        self.clock, self.young, self.seconds_per_object, self.collections = clock, young, seconds_per_object, 0

    def get_count(self) -> tuple[int, int, int]:
        return self.young, 0, 0

    def collect(self) -> int:
        self.clock.now += self.young * self.seconds_per_object
        self.young, self.collections = 0, self.collections + 1
        return 0


def test_the_refinement_keeps_the_time_the_collection_at_the_searchs_end_will_take(monkeypatch, clock):
    # The problem and the propagation left 1 000 000 objects, a whole collection takes 2 us per
    # object: the refinement's first look at the clock collects them (2 s); the solve then
    # allocates 1 500 000 more, which the end's collection will take 3 s for, so the solve is
    # given 60 - 2 - 3 s. Without the collector on before the search nothing is kept for it.
    collector = FakeCollector(clock, 1_000_000, 2e-6)
    monkeypatch.setattr(deadline_module, "gc", collector)

    def refine_fake(problem, hint, time_limit, workers, budget, progress, level, starts, deadline):
        collector.young += 1_500_000
        clock.spend(deadline.left())
        cost = problem.cost(hint)
        return RefineResult(dict(hint), cost, 0, "FEASIBLE", time_limit, cost)

    monkeypatch.setattr(search_module, "refine", refine_fake)
    graph = small_problem(8, 0).graph
    search(graph, 8, SearchOptions(refine="cpsat", refine_time_limit=60))
    assert collector.collections == 1 and clock.given == [pytest.approx(55.0)]
    assert clock.now + collector.young * 2e-6 == pytest.approx(1000.0 + 60.0)  # the end's collection ends at the limit
    clock.now, clock.given, collector.young = 1000.0, [], 1_000_000
    monkeypatch.setattr(search_module.gc, "isenabled", lambda: False)
    search(graph, 8, SearchOptions(refine="cpsat", refine_time_limit=60))
    assert collector.collections == 1 and clock.given == [60.0]  # no collection measured, none kept


def test_a_long_redistribution_search_stops_at_the_pricings_deadline(monkeypatch):
    # A search polls its caller every POLL_EVERY settled states: the pricing's check raises
    # out of the first entry it prices (the check between blocks of entries would let a whole
    # block run first), and the interrupted search memoises nothing: the same pair priced
    # afterwards costs what a cold search finds (a partial sum over 4 of 16 devices, columns
    # to rows: its timed search settles more than POLL_EVERY states).
    from autostrat.layout import DeviceMatrix, Layout, TensorMap
    from autostrat.redistribution.memo import clear_memos
    from autostrat.redistribution.polling import polled
    from autostrat.redistribution.table import cost_table
    from autostrat.search.pricing import price_tables
    from autostrat.search.deadline import Deadline, TimeRanOut

    hardware = SearchOptions(cost_model="time").hardware
    src = Layout(DeviceMatrix((4, 1, 4)), TensorMap(((1,), (0,))), (256, 256), partial=(2,))
    dst = Layout(DeviceMatrix((4, 1, 4)), TensorMap(((0,), (1,))), (256, 256))
    model = hardware.alpha_beta(16)
    clear_memos()

    def stop():
        raise TimeRanOut("pricing")

    with polled(stop), pytest.raises(TimeRanOut):
        cost_table([src], [dst], "float32", model)
    interrupted = cost_table([src], [dst], "float32", model)[0, 0]
    clear_memos()
    assert interrupted == cost_table([src], [dst], "float32", model)[0, 0] > 0

    class Looks(Deadline):  # passes at its second look: the first is before any entry is priced
        looks = 0

        def passed(self) -> bool:
            Looks.looks += 1
            return Looks.looks > 1

    searches = importlib.import_module("autostrat.redistribution.search")
    stopped_inside = []

    def watched_poll():
        try:
            polled_check()
        except TimeRanOut:
            stopped_inside.append(True)
            raise

    polled_check = searches.poll
    monkeypatch.setattr(searches, "POLL_EVERY", 1)
    monkeypatch.setattr(searches, "poll", watched_poll)
    problem = build_problem(gpt_training(2).graph, 8, hardware=hardware)
    clear_memos()
    with pytest.raises(TimeRanOut):
        price_tables(problem, Looks(60.0))
    assert stopped_inside == [True]  # inside an entry's search, not at the look after a block
