"""The IOPDDL solver. Nodes whose strategy another node's decides are merged into groups
(`groups`); then each round

1. prices memory with one multiplier per time point (the limit relaxed, Lagrange) and runs a
   pass of message passing (`trws`) on the priced costs, which decodes a solution;
2. moves the multipliers along the decoded solution's overflow (a subgradient step, its size
   halved whenever rounds stop improving, restarted when it has become negligible);
3. repairs the decoded solution into the limit (`moves.repair`) and polishes it with moves that
   keep the limit exactly: coordinate descent, induced-forest and chord block moves.

After half the time, block moves (`neighbourhood`): CP-SAT re-optimises blocks of groups that
share memory-tight time points, the limit kept exactly.

The best solution is the result; the lower bound is the highest of the spanning-forest
relaxation alone, with the final multipliers, and with the messages moved onto the groups.
Deterministic for a given `seed` and number of rounds (an eighth as many block moves follow,
each CP-SAT solve limited by deterministic time unless its wall time runs out first); under a
time budget the number of rounds done, and so the result, depends on the machine's speed and
load.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from autostrat.search.deadline import Deadline
from autostrat.search.solve.arrays import Arrays
from autostrat.search.solve.bound import lower_bound, pricing, spanning_forest
from autostrat.search.solve.evaluate import is_feasible, peak_usage, solution_cost
from autostrat.search.solve.exhaustive import EXHAUSTIVE_LIMIT, exhaustive_best
from autostrat.search.solve.instance import Instance
from autostrat.search.solve.moves import State, chord_move, forest_move, repair, start, sweep
from autostrat.search.solve.neighbourhood import BlockSearch
from autostrat.search.solve.trws import MessagePassing
from autostrat.search.solve.workers import search_all

POLISH_MOVES = 16  # block moves on each repaired solution, one in four a chord move
BLOCK_SIZES = (8, 32, 128)
STALL_ROUNDS = 20  # rounds without a better solution before the step size halves
SMALLEST_STEP = 2.0 ** -10  # then it restarts at 1
PRICED_SHARE = 0.5  # of the search's time, for the priced rounds; block moves (CP-SAT) have the rest
MESSAGE_BOUND_COST = 1.5  # a bound with messages against the first bound (1.1x measured on K)
EVALUATION_SECONDS = 1.0  # for checking and pricing the best solution exactly at the end
ROUNDS_PER_MOVE = 50  # with a number of rounds: one block move per 50 (a CP-SAT solve costs ~20 ms even on a toy)


@dataclass(frozen=True)
class Result:
    """A solution (empty when none fits the limit), its exact cost, the lower bound, the peak of
    the best solution found (the smallest peak when none fits), the seconds taken and the rounds
    (priced rounds and block moves) done."""

    solution: list
    cost: int | float | None
    bound: float
    peak: int | float
    seconds: float
    rounds: int


def solve(instance: Instance, seconds: float, seed: int = 0, progress=None, rounds: int | None = None,
          workers: int = 1, initial=None, exhaustive_limit: int = EXHAUSTIVE_LIMIT) -> Result:
    """The best solution found within `seconds` (or after `rounds` rounds, whichever first) by
    `workers` searches (seeds `seed`, `seed + 1`, ...), one per process (`workers.search_all`),
    started from the greedy solution or `initial` (a solution of the instance), whichever is
    cheaper among those within the limit.

    `progress(cost, bound, seconds)` is called when the first search finds a better solution (at
    most once a second).

    An instance with at most `exhaustive_limit` solutions of the groups is answered at once by
    trying them all (`exhaustive.exhaustive_best`): its bound is then its cost.

    Example:
        >>> from autostrat.search.solve.instance import read_instance
        >>> example = read_instance("configs/iopddl_example.json")
        >>> result = solve(example, 5.0, rounds=20, exhaustive_limit=0)
        >>> result.solution, result.cost, result.bound
        ([0, 0, 2, 1, 0], 360, 330.0)
        >>> result = solve(example, 5.0)
        >>> result.solution, result.cost, result.bound, result.rounds
        ([0, 0, 2, 1, 0], 360, 360.0, 0)
    """
    deadline = Deadline(seconds)
    arrays = Arrays(instance)
    exact = exhaustive_best(arrays, exhaustive_limit)
    if exact is not None:
        cost = solution_cost(instance, exact)
        return Result(exact, cost, float(cost), peak_usage(instance, exact, arrays.timeline), deadline.elapsed(), 0)
    state = _better_start(arrays, start(arrays), initial)
    if (state.profile > state.limit).any():
        return _least_memory(instance, arrays, deadline)
    sweep(state, range(arrays.node_count))
    started = time.perf_counter()
    kept = spanning_forest(arrays)
    bound = lower_bound(arrays, kept=kept)
    # the search stops early enough for two more bounds (`_final_bound`, each costing up to
    # MESSAGE_BOUND_COST times this one) and the exact evaluation
    estimate = MESSAGE_BOUND_COST * (time.perf_counter() - started)
    reserve = 2.0 * estimate + EVALUATION_SECONDS
    searching = Deadline(seconds, deadline.end - reserve)
    first = []

    def make_search(search_seed: int, worker: int) -> _Search:
        search = _Search(state, np.random.default_rng(search_seed), progress if worker == 0 else None, bound,
                         searching, step=0.5 ** worker)
        first.extend([search] if worker == 0 else [])
        return search

    results = search_all(make_search, [seed + worker for worker in range(workers)], rounds, searching)
    cost, solution, _ = min(results, key=lambda result: result[0])
    done = sum(result[2] for result in results)
    bound = max(bound, _final_bound(arrays, first[0], kept, deadline, estimate))
    best = arrays.expand(solution)
    assert is_feasible(instance, best, arrays.timeline)
    return Result(best, solution_cost(instance, best), bound, peak_usage(instance, best, arrays.timeline),
                  deadline.elapsed(), done)


def _final_bound(arrays: Arrays, search: _Search, kept: np.ndarray, deadline: Deadline, estimate: float) -> float:
    """The spanning-forest bound with the first search's messages moved onto the groups
    (`bound.Reparametrized`), with its multipliers and without them (they may be far from good
    ones), each while more than its `estimate`d seconds are left."""
    found = -np.inf
    multipliers = search.multipliers if arrays.limit is not None and search.multipliers.any() else None
    for prices in (multipliers, None) if multipliers is not None else (None,):
        if deadline.left() <= estimate + EVALUATION_SECONDS:
            break
        started = time.perf_counter()
        found = max(found, lower_bound(arrays, prices, kept, search.passing.messages or None))
        estimate = max(estimate, time.perf_counter() - started)
    return found


def _better_start(arrays: Arrays, greedy: State, initial) -> State:
    """`initial` as a solution of the groups when it is one (every member follows its root), fits
    the limit and costs less than the greedy start, or when the greedy start does not fit."""
    if initial is None:
        return greedy
    solution = np.asarray(initial, dtype=np.int64)[arrays.roots]
    if arrays.expand(solution) != [int(index) for index in initial]:
        return greedy
    given = State(arrays, solution)
    if (given.profile > given.limit).any():
        return greedy
    if (greedy.profile > greedy.limit).any() or arrays.float_cost(solution) < arrays.float_cost(greedy.solution):
        return given
    return greedy


def _least_memory(instance: Instance, arrays: Arrays, deadline: Deadline) -> Result:
    """When no solution of the groups was found within the limit: every node at its least usage,
    the smallest peak there is. It is the result if it fits (its cost ignores the groups, so it
    may take forbidden choices); otherwise the instance is infeasible."""
    lowest = [int(np.lexsort((cost, usage))[0]) for cost, usage in zip(instance.costs, instance.usages)]
    peak = peak_usage(instance, lowest, arrays.timeline)
    if not is_feasible(instance, lowest, arrays.timeline):
        return Result([], None, float("nan"), peak, deadline.elapsed(), 0)
    return Result(lowest, solution_cost(instance, lowest), float("-inf"), peak, deadline.elapsed(), 0)


class _Search:
    """The rounds: priced message passing, multiplier steps, repair and polish."""

    def __init__(self, state: State, rng, progress, bound: float, deadline: Deadline, step: float = 1.0):
        self.arrays, self.rng, self.progress, self.bound, self.deadline = state.arrays, rng, progress, bound, deadline
        self.passing = MessagePassing(state.arrays)
        self.multipliers = np.zeros(state.arrays.point_count)
        self.best, self.best_cost = state, state.arrays.float_cost(state.solution)
        self.step, self.stalled, self.reported = step, 0, 0.0
        self._report(force=True)

    @property
    def best_solution(self) -> np.ndarray:
        return self.best.solution

    def run(self, rounds: int | None) -> int:
        """Priced rounds for the first `PRICED_SHARE` of the time (or `rounds` of them), then block
        moves (or one per `ROUNDS_PER_MOVE` rounds); the rounds and moves done."""
        end = self.deadline.start + PRICED_SHARE * (self.deadline.end - self.deadline.start)
        priced = self.deadline if rounds is not None else Deadline(self.deadline.limit, end)
        done = self._priced_rounds(rounds, priced)
        blocks = BlockSearch(self.best, self.rng)
        moves, most = 0, None if rounds is None else rounds // ROUNDS_PER_MOVE
        while self.best_cost > self.bound and (most is None or moves < most) and blocks.run(self.deadline, 1):
            self.best_cost = self.arrays.float_cost(self.best.solution)
            self._report()
            moves += 1
        self._report(force=True)
        return done + moves

    def _priced_rounds(self, rounds: int | None, deadline: Deadline) -> int:
        done = 0
        # a best cost at the bound is proven optimal: nothing is left to find
        while not deadline.passed() and (rounds is None or done < rounds) and self.best_cost > self.bound:
            prices = pricing(self.arrays, self.multipliers)
            unary = [cost + prices(group) for group, cost in enumerate(self.arrays.costs)]
            candidate = State(self.arrays, self.passing.run_pass(unary, forward=done % 2 == 0))
            self._step_multipliers(candidate.profile)
            if repair(candidate, self.deadline):
                sweep(candidate, range(self.arrays.node_count))
                self._polish(candidate, prices)
                self._offer(candidate)
            self._polish(self.best, prices)  # swept when it became the best
            self._offer(self.best)
            done += 1
        return done

    def _step_multipliers(self, profile: np.ndarray) -> None:
        """Up where the decoded solution overflows, down (not below 0) where it has room."""
        slack = (profile - self.arrays.limit).astype(np.float64) if self.arrays.limit is not None else profile * 0.0
        gradient = np.where((self.multipliers > 0) | (slack > 0), slack, 0.0)
        norm = float(gradient @ gradient)
        if norm > 0:
            size = self.step * 0.1 * max(abs(self.best_cost), 1.0) / norm
            self.multipliers = np.maximum(self.multipliers + size * gradient, 0.0)

    def _polish(self, state: State, prices) -> None:
        for move in range(POLISH_MOVES):
            if self.deadline.passed():
                return
            seed = int(self.rng.integers(self.arrays.node_count))
            size = BLOCK_SIZES[int(self.rng.integers(len(BLOCK_SIZES)))]
            if move % 4 == 3:
                chord_move(state, seed, size, prices, optimistic=move % 8 == 3)
            else:
                forest_move(state, seed, size, prices)

    def _offer(self, state: State) -> None:
        """Keep `state` if it is the best yet; count the rounds since the last better one."""
        cost = self.arrays.float_cost(state.solution)
        self.stalled += 1
        if cost < self.best_cost:
            self.best, self.best_cost, self.stalled = State(self.arrays, state.solution), cost, 0
            self._report()
        if self.stalled >= 2 * STALL_ROUNDS:  # two offers per round
            self.step, self.stalled = self.step / 2, 0
            if self.step < SMALLEST_STEP:
                self.step = 1.0

    def _report(self, force: bool = False) -> None:
        now = self.deadline.elapsed()
        if self.progress is not None and (force or now - self.reported >= 1.0):
            self.progress(self.best_cost, self.bound, now)
            self.reported = now
