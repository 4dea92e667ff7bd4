"""The moves the solver improves a solution of the groups with, each keeping the memory limit
exactly:

- `start`: each group's strategy of least memory, repaired into the limit if need be, then in
  graph order each group's cheapest strategy given the groups already placed;
- `sweep`: every group in turn takes its cheapest strategy given all its neighbours;
- `forest_move`: a block whose induced subgraph is a forest is re-optimised exactly, memory
  priced by the multipliers; kept when it fits the limit and costs no more;
- `chord_move`: a connected block through its breadth-first tree, its other edges relaxed.
"""

from __future__ import annotations

import numpy as np

from autostrat.search.solve.arrays import Arrays
from autostrat.search.solve.forest import forest_minimum, induced_forest, spanning_block


class State:
    """A solution of the groups and the memory profile over the time points.

    Example:
        >>> from autostrat.search.solve.instance import read_instance
        >>> state = State(Arrays(read_instance("configs/iopddl_example.json")), [0, 0, 1])
        >>> state.profile.tolist(), state.fits(2).tolist()
        ([5, 25, 35, 25], [True, True])
    """

    def __init__(self, arrays: Arrays, solution):
        self.arrays = arrays
        self.solution = np.array(solution, dtype=np.int64)
        self.profile = arrays.profile(self.solution)
        self.limit = np.inf if arrays.limit is None else arrays.limit

    def fits(self, group: int) -> np.ndarray:
        """Per strategy of `group`, whether taking it keeps every point within the limit."""
        bounds, table = self.arrays.bounds[group], self.arrays.tables[group]
        if len(bounds) < 2:
            return np.ones(len(self.arrays.costs[group]), dtype=bool)
        peaks = np.maximum.reduceat(self.profile[bounds[0]:bounds[-1]], bounds[:-1] - bounds[0])
        return (peaks[None, :] + table - table[self.solution[group]][None, :] <= self.limit).all(axis=1)

    def place(self, group: int, strategy: int) -> None:
        """Give `group` the strategy, updating the profile."""
        bounds, table = self.arrays.bounds[group], self.arrays.tables[group]
        if len(bounds) > 1:
            steps = np.repeat(table[strategy] - table[self.solution[group]], np.diff(bounds))
            self.profile[bounds[0]:bounds[-1]] += steps
        self.solution[group] = strategy

    def best_local(self, group: int, skip=None) -> int:
        """The cheapest strategy of `group` given its neighbours that fits the memory left (its
        own strategy when no other does)."""
        local = self.arrays.local_costs(group, self.solution, skip)
        fits = self.fits(group)
        fits[self.solution[group]] = True
        return int(np.where(fits, local, np.inf).argmin())


def start(arrays: Arrays) -> State:
    """The greedy solution in graph order, within the limit unless `repair` failed."""
    weights = [table @ np.diff(bounds) if len(bounds) > 1 else np.zeros(len(table))
               for bounds, table in zip(arrays.bounds, arrays.tables)]
    state = State(arrays, [np.lexsort((cost, weight))[0] for cost, weight in zip(arrays.costs, weights)])
    if not repair(state):
        return state
    placed = np.zeros(arrays.node_count, dtype=bool)
    for group in range(arrays.node_count):
        state.place(group, state.best_local(group, skip=~placed))
        placed[group] = True
    return state


def repair(state: State, deadline=None) -> bool:
    """Bring `state` within the limit: at the highest point, the groups whose change to less
    usage there costs least per unit freed take it, cheapest first, no two neighbours at once,
    until that point is within the limit; then the next highest point. False when no change
    frees memory at an overflowing point, after as many rounds as there are groups' strategies
    (a change may raise other points, so the greedy could go round), or once `deadline` passed."""
    arrays = state.arrays
    local = {}  # each group's costs given its neighbours, until one of them changes
    for _ in range(sum(len(cost) for cost in arrays.costs) + 1):
        if not len(state.profile) or state.profile.max() <= state.limit:
            return True
        if deadline is not None and deadline.passed():
            return False
        point = int(state.profile.argmax())
        excess = state.profile[point] - state.limit
        reliefs = _reliefs(state, point, excess, local)
        if not reliefs:
            return False
        changed = set()
        for _, group, strategy, freed in sorted(reliefs):
            if excess <= 0:
                break
            if group in changed or any(neighbour in changed for neighbour, _ in arrays.neighbours[group]):
                continue
            state.place(group, strategy)
            changed.add(group)
            excess -= freed
        for group in changed:
            for touched in [group] + [neighbour for neighbour, _ in arrays.neighbours[group]]:
                local.pop(touched, None)
    return False


def _reliefs(state: State, point: int, excess, local: dict) -> list:
    """[(cost per unit freed, group, strategy, usage freed)]: for each group using memory at
    `point`, its change that frees some there at the least cost per unit freed (up to `excess`)."""
    arrays = state.arrays
    found = []
    covering = arrays.varies & (arrays.span_first <= point) & (arrays.span_last > point)
    for group in np.flatnonzero(covering).tolist():
        bounds = arrays.bounds[group]
        usage = arrays.tables[group][:, np.searchsorted(bounds, point, side="right") - 1]
        freed = usage[state.solution[group]] - usage
        if freed.max() <= 0:
            continue
        if group not in local:
            local[group] = arrays.local_costs(group, state.solution)
        costs = local[group]
        rate = np.where(freed > 0, (costs - costs[state.solution[group]]) / np.maximum(np.minimum(freed, excess), 1), np.inf)
        strategy = int(rate.argmin())
        found.append((float(rate[strategy]), group, strategy, freed[strategy]))
    return found


def sweep(state: State, order) -> int:
    """Coordinate descent over `order`; how many groups changed strategy."""
    changed = 0
    for group in order:
        strategy = state.best_local(group)
        if strategy != state.solution[group]:
            local = state.arrays.local_costs(group, state.solution)
            if local[strategy] < local[state.solution[group]]:
                state.place(group, strategy)
                changed += 1
    return changed


def forest_move(state: State, seed: int, size: int, prices) -> tuple:
    """Re-optimise the induced forest of at most `size` groups grown from `seed`, memory priced
    by `prices(group)` (a cost per strategy); keep it if it fits and costs no more.

    Returns (cost change, overflow or None): when the answer was refused for memory, the points
    where it went over the limit, its added usage there and the gain it promised.
    """
    arrays = state.arrays
    order, parents = induced_forest(arrays, seed, size)
    inside = np.zeros(arrays.node_count, dtype=bool)
    inside[order] = True
    true = {group: arrays.local_costs(group, state.solution, skip=inside) for group in order}
    unary = {group: true[group] + prices(group) for group in order}
    _, chosen = forest_minimum(arrays, order, parents, unary)
    moved = [group for group in order if chosen[group] != state.solution[group]]
    change = _block_change(arrays, state.solution, order, parents, true, chosen)
    if change > 0 or not moved:
        return 0.0, None
    added = profile_change(state, moved, chosen)
    over = np.flatnonzero(state.profile + added > state.limit)
    if len(over):
        return 0.0, (over, added[over], -change)
    for group in moved:
        state.place(group, chosen[group])
    return change, None


def chord_move(state: State, seed: int, size: int, prices, optimistic: bool) -> float:
    """Re-optimise a connected block through its breadth-first tree, each chord (a block edge off
    the tree) counted at its cheapest entry per strategy of one end (`optimistic`: lets a
    cycle bound by forbidden pairs change all at once) or at the other end's present strategy;
    keep the answer if its exact cost is lower and it fits the limit. Returns the cost change."""
    arrays = state.arrays
    order, parents, chords = spanning_block(arrays, seed, size)
    inside = np.zeros(arrays.node_count, dtype=bool)
    inside[order] = True
    unary = {group: arrays.local_costs(group, state.solution, skip=inside) + prices(group) for group in order}
    for u, v, edge in chords:
        matrix = arrays.edge_matrix(edge, u)
        unary[u] += matrix.min(axis=1) if optimistic else matrix[:, state.solution[v]]
    _, chosen = forest_minimum(arrays, order, parents, unary)
    return keep_if_better(state, order, chosen)


def keep_if_better(state: State, block, chosen: dict) -> float:
    """Give the groups of `block` their `chosen` strategies if that lowers the exact cost and
    keeps the memory profile within the limit; the cost change (0.0 when nothing is kept)."""
    moved = [group for group in block if chosen[group] != state.solution[group]]
    if not moved:
        return 0.0
    change = exact_change(state.arrays, state.solution, moved, chosen)
    if change >= 0 or (state.profile + profile_change(state, moved, chosen) > state.limit).any():
        return 0.0
    for group in moved:
        state.place(group, chosen[group])
    return change


def exact_change(arrays: Arrays, solution: np.ndarray, moved: list, chosen: dict) -> float:
    """The cost change when the `moved` groups take their `chosen` strategies."""
    after = solution.copy()
    for group in moved:
        after[group] = chosen[group]
    change, counted = 0.0, set()
    for group in moved:
        change += arrays.costs[group][after[group]] - arrays.costs[group][solution[group]]
        for _, edge in arrays.neighbours[group]:
            if edge not in counted:
                counted.add(edge)
                u, v = arrays.edges[edge]
                matrix = arrays.matrices[edge]
                change += matrix[after[u], after[v]] - matrix[solution[u], solution[v]]
    return float(change)


def _block_change(arrays: Arrays, solution, order, parents, true, chosen) -> float:
    change = 0.0
    for group, link in zip(order, parents):
        change += true[group][chosen[group]] - true[group][solution[group]]
        if link is not None:
            matrix = arrays.edge_matrix(link[1], link[0])
            change += matrix[chosen[link[0]], chosen[group]] - matrix[solution[link[0]], solution[group]]
    return float(change)


def profile_change(state: State, moved: list, chosen: dict) -> np.ndarray:
    arrays = state.arrays
    change = np.zeros(arrays.point_count + 1, dtype=np.int64)
    for group in moved:
        table = arrays.tables[group]
        arrays.add_usage(change, group, table[chosen[group]] - table[state.solution[group]])
    return np.cumsum(change[:-1])
