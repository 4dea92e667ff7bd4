"""Choosing a strategy for every op: BFS sharding propagation, and the simpler modes.

Propagation (MindSpore's sharding_propagation), case by case:

- seeds keep their strategy and are never overwritten;
- a queue starts with the seeds in graph (topological) order; popping an op visits the ops it
  shares an edge with, in graph order; each one not yet decided takes the candidate with the
  smallest key ``(redistribution bytes to every decided neighbour + own communication, flops,
  memory, candidate index)`` and joins the queue, its origin "propagated from" the popped op;
- the edges between two readers of one parameter or graph input are priced when choosing, but
  do not carry the propagation: a weight read by a forward and a backward op would otherwise
  hand its layout across the graph, far from the data flow the seeds describe; nor do the
  gradient-synchronisation edges of a training graph, until a second round from every decided
  op reaches what the data edges did not;
- ops no seed reaches get the all-ones strategy and a warning (none for an op with no other
  candidate, such as a scalar's);
- two adjacent seeds keep their strategies and get a redistribution on their edge; when it costs
  more than feeding the best candidate of the consumer would (their layouts disagree, beyond
  resolving a partial sum), a warning says so.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

import numpy as np

from autostrat.autodiff import op_phase
from autostrat.layout import Strategy
from autostrat.search.problem import SearchProblem

SEED, DEFAULT, DATA_PARALLEL = "seed", "default", "data parallel"


@dataclass(frozen=True)
class Assignment:
    """A candidate index per op, where each choice came from, and what the user should know."""

    choice: dict[str, int]
    origin: dict[str, str]
    warnings: tuple[str, ...]


def _neighbour_cost(problem: SearchProblem, op: str, choice: dict[str, int], sync: bool) -> np.ndarray:
    total = problem.costs[op].comm.copy()
    for edge in problem.incident[op]:
        if edge.sync and not sync:
            continue
        if edge.consumer == op and edge.producer in choice:
            total += edge.table[choice[edge.producer], :]
        elif edge.producer == op and edge.consumer in choice:
            total += edge.table[:, choice[edge.consumer]]
    return total


def best_candidate(problem: SearchProblem, op: str, choice: dict[str, int], sync: bool = True) -> int:
    """The documented tie-break: bytes (to decided neighbours; over gradient-synchronisation
    edges too unless `sync` is False), then flops, then memory, then enumeration order."""
    costs = problem.costs[op]
    index = np.arange(len(problem.candidates[op]))
    return int(np.lexsort((index, costs.memory, costs.flops, _neighbour_cost(problem, op, choice, sync)))[0])


def _seeds(problem: SearchProblem) -> list[str]:
    return [name for name, op in problem.graph.ops.items() if op.is_seeded]


def propagate(problem: SearchProblem, progress=None) -> Assignment:
    """BFS from the seeds over the edges (see the module docstring); `progress.step` hears of
    every op reached (`progress.SearchProgress`)."""
    seeds = _seeds(problem)
    choice = {name: 0 for name in seeds}
    origin = {name: SEED for name in seeds}
    _visit(problem, choice, origin, deque(seeds), False, progress)
    if any(edge.sync for edge in problem.edges):
        _visit(problem, choice, origin, deque(name for name in problem.graph.ops if name in choice), True, progress)
    return _finish(problem, choice, origin)


def _visit(problem: SearchProblem, choice: dict[str, int], origin: dict[str, str], queue: deque, across_sync: bool,
           progress=None) -> None:
    """One BFS round; the second round of a training graph also crosses gradient-sync edges,
    reaching the backward ops no data edge leads to (a bias gradient of the sensitivity)."""
    while queue:
        current = queue.popleft()
        for edge in problem.incident[current]:
            neighbour = edge.consumer if edge.producer == current else edge.producer
            if neighbour in choice or edge.from_input or (edge.sync and not across_sync):
                continue
            choice[neighbour] = best_candidate(problem, neighbour, choice)
            origin[neighbour] = f"propagated from {current}"
            queue.append(neighbour)
            if progress is not None:
                progress.step("propagating", len(choice), len(problem.graph.ops))


def _finish(problem: SearchProblem, choice: dict[str, int], origin: dict[str, str]) -> Assignment:
    warnings = []
    unreached = [name for name in problem.graph.ops if name not in choice]
    for name in unreached:
        choice[name], origin[name] = 0, DEFAULT  # candidate 0 is the all-ones strategy
    unreached = [name for name in unreached if len(problem.candidates[name]) > 1]  # scalars: nothing to choose
    if unreached:
        warnings.append(f"{len(unreached)} op(s) reached by no seed keep the all-ones strategy: {', '.join(unreached)}")
    for edge in problem.edges:
        if origin[edge.producer] == SEED and origin[edge.consumer] == SEED:
            cost = edge.table[choice[edge.producer], choice[edge.consumer]]
            if cost > problem.least_edge_cost(edge, choice[edge.producer]):
                warnings.append(
                    f"seeds of {edge.producer} and {edge.consumer} disagree on {edge.tensor}: "
                    f"a redistribution of {cost:.0f} {problem.unit} per device is inserted"
                )
    ordered = {name: choice[name] for name in problem.graph.ops}
    return Assignment(ordered, {name: origin[name] for name in ordered}, tuple(warnings))


def _batch_split(strategy: Strategy, device_num: int) -> bool:
    """Whether `strategy` splits only the first dim of the op's first output, over all devices."""
    outputs = strategy.rule.outputs
    if not outputs or not outputs[0] or math.prod(strategy.splits) != device_num:
        return False
    return math.prod(strategy.split(f) for f in outputs[0][0]) == device_num


def data_parallel(problem: SearchProblem, keep_seeds: bool) -> Assignment:
    """Every forward op splits its batch dim (its first output's first dim) over all devices; with
    `keep_seeds` (semi_auto_parallel) configured ops keep their strategies; the other ops are
    propagated to from these."""
    choice, origin = {}, {}
    for name, candidates in problem.candidates.items():
        if keep_seeds and problem.graph.ops[name].is_seeded:
            choice[name], origin[name] = 0, SEED
            continue
        found = [i for i, s in enumerate(candidates) if _batch_split(s, problem.device_num)]
        if found and op_phase(name) == "forward":
            choice[name], origin[name] = found[0], DATA_PARALLEL
    # Ops without a batch dim in their output (a loss) and backward ops (whose first output dim
    # is a weight's row as often as the batch) take, in data-flow order, the cheapest candidate
    # given their producers, the synchronisation aside: each computes on the batch slice its
    # inputs hold, and a weight's gradient is a partial sum AllReduced over every replica —
    # data parallel as MindSpore runs it, not a cheaper hybrid the user did not ask for.
    for name in problem.graph.ops:
        if name not in choice:
            choice[name], origin[name] = best_candidate(problem, name, choice, sync=False), DATA_PARALLEL
    return _finish(problem, choice, origin)
