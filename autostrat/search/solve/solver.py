"""The IOPDDL solver: a greedy start within the memory limit, then large moves — blocks whose
induced subgraph is a forest, re-optimised exactly by dynamic programming with every other node
fixed, and connected blocks solved through a spanning tree with their chords relaxed
(`chord_move`) — with memory priced by multipliers that rise where a block's answer overflowed (a
Lagrangian relaxation of the limit, adjusted as the search meets it), and a lower bound.

Deterministic for a given `seed` and number of moves; under a time budget the number of moves
done, and so the result, depends on the machine's speed.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from autostrat.search.deadline import Deadline
from autostrat.search.solve.arrays import Arrays
from autostrat.search.solve.bound import range_sums, lower_bound
from autostrat.search.solve.evaluate import is_feasible, peak_usage, solution_cost
from autostrat.search.solve.instance import Instance
from autostrat.search.solve.moves import State, chord_move, forest_move, greedy_start, smallest_usage, sweep

BLOCK_SIZES = (8, 32, 128, 512)  # nodes per block; small blocks pass the memory check more often
RETRIES = 3  # solves of one block as its prices rise
CYCLE = 8  # moves per round: forest moves, then two chord moves


@dataclass(frozen=True)
class Result:
    """A solution (empty when none fits the limit), its exact cost, the lower bound, the peak of
    the best solution found (the smallest peak when none fits), and the seconds taken."""

    solution: list
    cost: int | float | None
    bound: float
    peak: int | float
    seconds: float
    moves: int


def solve(instance: Instance, seconds: float, seed: int = 0, progress=None, moves: int | None = None) -> Result:
    """The best solution found within `seconds` (or after `moves` block moves, whichever first).

    `progress(cost, bound, seconds)` is called when a better solution is found.

    Example:
        >>> from autostrat.search.solve.instance import read_instance
        >>> result = solve(read_instance("/work/shared/iopddl/example.json"), 5.0, moves=50)
        >>> result.solution, result.cost, result.bound
        ([0, 0, 2, 1, 0], 445, 445.0)
    """
    deadline = Deadline(seconds)
    arrays = Arrays(instance)
    lowest = smallest_usage(arrays)
    if not is_feasible(instance, lowest, arrays.timeline):
        return Result([], None, float("nan"), peak_usage(instance, lowest, arrays.timeline), deadline.elapsed(), 0)
    state = greedy_start(arrays)
    sweep(state, range(arrays.node_count))
    started = time.perf_counter()
    bound = lower_bound(arrays)
    # the search stops early enough for a second bound (priced memory) and the exact evaluation
    reserve = 2.0 * (time.perf_counter() - started) + 0.2
    search = _Search(state, np.random.default_rng(seed), progress, bound, Deadline(seconds, deadline.end - reserve))
    done = search.run(moves)
    if arrays.limit is not None and search.multipliers.any() and deadline.left() > reserve / 2:
        bound = max(bound, lower_bound(arrays, search.multipliers))
    best = search.best.tolist()
    assert is_feasible(instance, best, arrays.timeline)
    return Result(best, solution_cost(instance, best), bound, peak_usage(instance, best, arrays.timeline),
                  deadline.elapsed(), done)


class _Search:
    """Forest moves from random seeds, keeping the best solution and the memory multipliers."""

    def __init__(self, state: State, rng, progress, bound: float, deadline: Deadline):
        self.state, self.rng, self.progress, self.bound, self.deadline = state, rng, progress, bound, deadline
        self.multipliers = np.zeros(len(state.arrays.timeline.points))
        self.prices = np.zeros(state.arrays.node_count)
        self.cost = state.arrays.float_cost(state.solution)
        self.best, self.best_cost = state.solution.copy(), self.cost
        self.reported = 0.0
        self._report(force=True)

    def run(self, moves: int | None) -> int:
        done = 0
        # a best cost at the bound is proven optimal: nothing is left to find
        while not self.deadline.passed() and (moves is None or done < moves) and self.best_cost > self.bound:
            seed = int(self.rng.integers(self.state.arrays.node_count))
            size = BLOCK_SIZES[int(self.rng.integers(len(BLOCK_SIZES)))]
            kind = done % CYCLE
            if kind >= CYCLE - 2:  # one move in four crosses cycles: optimistic or conditioned chords
                self.cost += chord_move(self.state, seed, size, self.prices, optimistic=kind % 2 == 0)
            for _ in range(RETRIES if kind < CYCLE - 2 else 0):
                change, overflow = forest_move(self.state, seed, size, self.prices)
                self.cost += change
                if overflow is None:
                    break
                self._price(*overflow)
            done += 1
            if self.cost < self.best_cost:
                self.best, self.best_cost = self.state.solution.copy(), self.cost
                self._report()
        self._report(force=True)
        return done

    def _price(self, points: np.ndarray, excess: np.ndarray, gain: float) -> None:
        """Raise the multipliers at the overflowing points so that the gain the block's answer
        promised no longer pays for its extra memory there."""
        self.multipliers[points] += 2.0 * max(gain, 1.0) / max(float(excess.sum()), 1.0)
        self.prices = range_sums(self.state.arrays, self.multipliers)

    def _report(self, force: bool = False) -> None:
        now = self.deadline.elapsed()
        if self.progress is not None and (force or now - self.reported >= 1.0):
            self.progress(self.best_cost, self.bound, now)
            self.reported = now
