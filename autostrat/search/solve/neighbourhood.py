"""Large-neighbourhood moves with CP-SAT: a block of groups is re-optimised exactly, every other
group fixed, the memory limit kept exactly at every time point the block uses.

The model (one per block): a Boolean per allowed strategy of each block group (exactly one
true); the group's cost given its fixed neighbours on those Booleans; per block edge an integer
cost at least the edge's row of the chosen strategy of one end (a linear row enforced by that
strategy's Boolean), forbidden pairs excluded by clauses; per elementary segment of the block's
time points (between consecutive segment bounds of its groups) the block's usage within what
the fixed groups leave at the segment's highest point. The answer is applied when its exact
cost is lower and it fits the limit (checked again here, on the profile).

Blocks follow the memory: a time point at or near the limit is drawn, and the block is grown
breadth-first from the groups whose strategy changes their usage there, so that the block can
trade memory between groups that share those points.
"""

from __future__ import annotations

import time

import numpy as np
from ortools.sat.python import cp_model

from autostrat.search.deadline import Deadline
from autostrat.search.solve.instance import FORBIDDEN
from autostrat.search.solve.moves import State, keep_if_better

TIGHT = 0.999  # points at or above this share of the limit are where blocks start
MOVE_SECONDS = 1.0  # CP-SAT's time per block
SHORTEST_MOVE = 0.3  # no move is started with less time left
BLOCK_GROUPS = 60  # on K, blocks of 60 gained more per second than blocks of 100 or 200
# CP-SAT's sums must stay in 64-bit integers: the model's costs are capped (it only proposes;
# the exact change decides)
COEFFICIENT_CAP = 2 ** 48
MEMORY_ROWS = 400  # segments written per block (C's blocks have thousands; building them took 10 s)


def memory_block(state: State, rng, size: int) -> list:
    """At most `size` groups: those using memory at a tight point drawn by `rng` (a random
    point when none is tight), the seeds in random order, grown breadth-first over the graph."""
    arrays = state.arrays
    tight = np.flatnonzero(state.profile >= TIGHT * state.limit) if np.isfinite(state.limit) else []
    point = int(rng.choice(tight)) if len(tight) else int(rng.integers(max(arrays.point_count, 1)))
    covering = np.flatnonzero(arrays.varies & (arrays.span_first <= point) & (arrays.span_last > point))
    seeds = rng.permutation(covering).tolist()[: max(size // 4, 1)] or [int(rng.integers(arrays.node_count))]
    inside, order, head = set(seeds), list(seeds), 0
    while head < len(order) and len(order) < size:
        for neighbour, _ in arrays.neighbours[order[head]]:
            if neighbour not in inside and len(order) < size:
                inside.add(neighbour)
                order.append(neighbour)
        head += 1
    return order


def block_move(state: State, block: list, seconds, search=None) -> float:
    """Re-optimise `block` with CP-SAT within `seconds` (a number, or a function giving it once
    the model is built), starting from the present strategies; apply the answer when it is
    cheaper and fits. Returns the cost change (0 when none); tells `search` (a `BlockSearch`)
    whether the solve was proven optimal and how long it took."""
    model, choices = _model(state, block)
    if choices is None:
        if search is not None:
            search.proven, search.solving = True, 0.0
        return 0.0
    limit = max(seconds() if callable(seconds) else seconds, 0.01)
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = limit
    solver.parameters.max_deterministic_time = limit  # (what a loaded machine gives is less)
    solver.parameters.num_workers = 1
    started = time.perf_counter()
    status = solver.Solve(model)
    if search is not None:
        search.proven, search.solving = status == cp_model.OPTIMAL, time.perf_counter() - started
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return 0.0
    chosen = {group: next(s for s, x in options if solver.BooleanValue(x)) for group, options in choices.items()}
    return keep_if_better(state, block, chosen)


def _model(state: State, block: list) -> tuple:
    """The block's CP-SAT model and each group's [(strategy, Boolean)]; (None, None) when the
    block's present strategies leave nothing to choose."""
    arrays = state.arrays
    inside = np.zeros(arrays.node_count, dtype=bool)
    inside[block] = True
    model = cp_model.CpModel()
    choices, objective = {}, []
    for group in block:
        local = arrays.local_costs(group, state.solution, skip=inside)
        allowed = np.flatnonzero(local < FORBIDDEN)
        if state.solution[group] not in allowed:  # a forbidden present choice: keep it
            allowed = np.array([state.solution[group]])
        floor = local[allowed].min()
        options = [(int(s), model.NewBoolVar("")) for s in allowed]
        model.AddExactlyOne(x for _, x in options)
        for s, x in options:
            model.AddHint(x, int(s == state.solution[group]))
            objective.append(int(min(round(local[s] - floor), COEFFICIENT_CAP)) * x)
        choices[group] = options
    if sum(len(options) for options in choices.values()) == len(block):
        return None, None
    for edge, (u, v) in enumerate(arrays.edges):
        if inside[u] and inside[v]:
            objective.append(_edge_cost(model, arrays.matrices[edge], choices[u], choices[v]))
    _memory(model, state, block, choices)
    model.Minimize(sum(objective))
    return model, choices


def _edge_cost(model, matrix: np.ndarray, rows: list, columns: list):
    """An integer at least the edge's cost for the chosen pair (minus its smallest allowed entry)."""
    if len(rows) > len(columns):
        matrix, rows, columns = matrix.T, columns, rows
    block = matrix[np.ix_([s for s, _ in rows], [s for s, _ in columns])]
    forbidden = block >= FORBIDDEN
    floor = block[~forbidden].min() if (~forbidden).any() else 0.0
    shifted = np.minimum(np.where(forbidden, 0.0, block - floor).round(), COEFFICIENT_CAP).astype(np.int64)
    cost = model.NewIntVar(0, int(shifted.max()), "")
    for i, (_, x) in enumerate(rows):
        for j in np.flatnonzero(forbidden[i]).tolist():
            model.AddBoolOr([x.Not(), columns[j][1].Not()])
        row = shifted[i]
        nonzero = np.flatnonzero(row)
        if len(nonzero):
            paid = cp_model.LinearExpr.WeightedSum([columns[j][1] for j in nonzero], row[nonzero].tolist())
            model.Add(cost >= paid).OnlyEnforceIf(x)
    return cost + int(min(round(floor), COEFFICIENT_CAP))


def _memory(model, state: State, block: list, choices: dict) -> None:
    """Per elementary segment of the block's points that some choice could overflow: the block's
    usage within the limit less the fixed groups' highest usage there. Each group's least usage
    in a segment is moved to the right-hand side (exactly one strategy is chosen), which leaves
    most rows sparse; only the `MEMORY_ROWS` segments with the least room left by the present
    strategies are written (an answer over another is refused by `block_move`'s check), and
    rows that are equal are kept once, at their smallest room."""
    arrays = state.arrays
    used = [group for group in block if len(arrays.bounds[group]) > 1]
    if not np.isfinite(state.limit) or not used:
        return
    cuts = np.unique(np.concatenate([arrays.bounds[group] for group in used]))
    room = state.limit - np.maximum.reduceat(state.profile[cuts[0]:cuts[-1]], cuts[:-1] - cuts[0])
    spread = np.zeros(len(cuts) - 1, dtype=np.int64)  # the most the block can add over its least
    slack = room.copy()  # what the present strategies leave
    pieces = []
    for group in used:
        bounds, strategies = arrays.bounds[group], [s for s, _ in choices[group]]
        first, last = np.searchsorted(cuts, bounds[0]), np.searchsorted(cuts, bounds[-1])
        usage = arrays.tables[group][:, np.searchsorted(bounds, cuts[first:last], side="right") - 1]
        least = usage[strategies].min(axis=0)
        room[first:last] += usage[state.solution[group]] - least  # the present usage is in the profile
        spread[first:last] += usage[strategies].max(axis=0) - least
        pieces.append((first, last, usage[strategies] - least))
    live = np.flatnonzero(spread > room)
    live = np.sort(live[np.argsort(slack[live], kind="stable")[:MEMORY_ROWS]])
    if not len(live):
        return
    literals = [x for group in used for _, x in choices[group]]
    rows, column = np.zeros((len(live), len(literals)), dtype=np.int64), 0
    for first, last, usage in pieces:
        inside = (live >= first) & (live < last)
        rows[inside, column:column + len(usage)] = usage[:, live[inside] - first].T
        column += len(usage)
    unique, inverse = np.unique(rows, axis=0, return_inverse=True)
    smallest = np.full(len(unique), np.iinfo(np.int64).max)
    np.minimum.at(smallest, inverse.ravel(), room[live])
    for row, bound in zip(unique, smallest.tolist()):
        nonzero = np.flatnonzero(row)
        model.Add(cp_model.LinearExpr.WeightedSum([literals[i] for i in nonzero], row[nonzero].tolist()) <= bound)


class BlockSearch:
    """Block moves one after another on `state` until a block of every group is proven optimal.

    Example:
        >>> from autostrat.search.solve.arrays import Arrays
        >>> from autostrat.search.solve.instance import read_instance
        >>> state = State(Arrays(read_instance("configs/iopddl_example.json")), [0, 0, 0])
        >>> search = BlockSearch(state, np.random.default_rng(0))
        >>> search.run(Deadline(5.0), moves=3), state.arrays.expand(state.solution)  # all 3: proven at once
        (1, [0, 0, 2, 1, 0])
    """

    def __init__(self, state: State, rng, size: int = BLOCK_GROUPS):
        self.state, self.rng, self.size = state, rng, size
        self.proven = False  # whether the last move's CP-SAT solve was optimal
        self.finished = False  # whether a block of every group was: no move can improve then
        self.building = self.solving = 0.0  # the longest model build, the last solve (seconds)

    def run(self, deadline: Deadline, moves: int | None = None) -> int:
        """Moves until `deadline` (each given at most `MOVE_SECONDS`) or `moves` of them, or until
        finished; how many."""
        done = 0
        # building a model is not interrupted: a move starts only with twice the longest build left
        while deadline.left() > SHORTEST_MOVE + 2 * self.building and (moves is None or done < moves) \
                and not self.finished:
            block = memory_block(self.state, self.rng, self.size)
            started = time.perf_counter()
            block_move(self.state, block, lambda: min(MOVE_SECONDS, deadline.left() - SHORTEST_MOVE / 2), self)
            self.building = max(self.building, time.perf_counter() - started - self.solving)
            self.finished = self.proven and len(block) == self.state.arrays.node_count
            done += 1
        return done
