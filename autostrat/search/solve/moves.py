"""The moves the solver improves a solution with, each keeping the memory limit exactly:

- `greedy_start`: nodes in graph order, each taking its cheapest strategy given the neighbours
  already placed, while every node not yet placed counts at its smallest usage;
- `sweep`: every node in turn takes its cheapest strategy given all its neighbours (coordinate
  descent);
- `forest_move`: a block whose induced subgraph is a forest is re-optimised exactly, memory
  priced by the multipliers; the result is kept only when it fits the limit and costs no more.
"""

from __future__ import annotations

import numpy as np

from autostrat.search.solve.arrays import Arrays
from autostrat.search.solve.forest import forest_minimum, induced_forest, spanning_block


class State:
    """A solution, its usage per node and the memory profile over the time points.

    Example:
        >>> from autostrat.search.solve.instance import read_instance
        >>> state = State(Arrays(read_instance("/work/shared/iopddl/example.json")), [0, 0, 0, 1, 0])
        >>> state.profile.tolist()
        [10, 35, 50, 40]
    """

    def __init__(self, arrays: Arrays, solution):
        self.arrays = arrays
        self.solution = np.array(solution, dtype=np.int64)
        self.usage = arrays.usage_of(self.solution)
        self.profile = arrays.timeline.profile(self.usage)
        self.limit = np.inf if arrays.limit is None else arrays.limit

    def headroom(self, node: int):
        """How much more memory `node` may use than it does now."""
        timeline = self.arrays.timeline
        first, last = timeline.first[node], timeline.last[node]
        return np.inf if first == last else self.limit - self.profile[first:last].max()

    def place(self, node: int, strategy: int) -> None:
        """Give `node` the strategy, updating its usage and the profile."""
        usage = self.arrays.usages[node][strategy]
        timeline = self.arrays.timeline
        self.profile[timeline.first[node]:timeline.last[node]] += usage - self.usage[node]
        self.usage[node] = usage
        self.solution[node] = strategy

    def best_local(self, node: int, skip=None) -> int:
        """The cheapest strategy of `node` given its neighbours that fits the memory left (its
        own strategy when no other does)."""
        local = self.arrays.local_costs(node, self.solution, skip)
        fits = self.arrays.usages[node] - self.usage[node] <= self.headroom(node)
        fits[self.solution[node]] = True
        return int(np.where(fits, local, np.inf).argmin())


def smallest_usage(arrays: Arrays) -> np.ndarray:
    """Each node's strategy of least usage, the cheaper one among equals."""
    return np.array([np.lexsort((cost, usage))[0] for cost, usage in zip(arrays.costs, arrays.usages)],
                    dtype=np.int64)


def greedy_start(arrays: Arrays) -> State:
    """The greedy solution in graph order, within the limit if the smallest usages are."""
    state = State(arrays, smallest_usage(arrays))
    placed = np.zeros(arrays.node_count, dtype=bool)
    for node in range(arrays.node_count):
        state.place(node, state.best_local(node, skip=~placed))
        placed[node] = True
    return state


def sweep(state: State, order) -> int:
    """Coordinate descent over `order`; how many nodes changed strategy."""
    changed = 0
    for node in order:
        strategy = state.best_local(node)
        if strategy != state.solution[node]:
            local = state.arrays.local_costs(node, state.solution)
            if local[strategy] < local[state.solution[node]]:
                state.place(node, strategy)
                changed += 1
    return changed


def forest_move(state: State, seed: int, size: int, prices: np.ndarray, within_limit: bool = True) -> tuple:
    """Re-optimise the induced forest of at most `size` nodes grown from `seed`, memory priced
    at `prices` per unit of usage per node. With `within_limit`, keep the answer if it fits and
    costs no more; without, keep it if its priced cost is lower.

    Returns (cost change, overflow or None): when the answer was refused for memory, the points
    where it went over the limit, its added usage there and the gain it promised.
    """
    arrays = state.arrays
    inside = np.zeros(arrays.node_count, dtype=bool)
    order, parents = induced_forest(arrays, [seed], size, inside)
    inside[order] = True
    true = {node: arrays.local_costs(node, state.solution, skip=inside) for node in order}
    unary = {node: true[node] + prices[node] * arrays.usages[node] for node in order}
    _, chosen = forest_minimum(arrays, order, parents, unary)
    moved = [node for node in order if chosen[node] != state.solution[node]]
    change = _block_change(arrays, state.solution, order, parents, true, chosen)
    if not within_limit:
        priced = change + sum(prices[node] * (arrays.usages[node][chosen[node]] - state.usage[node]) for node in moved)
        if moved and priced < 0:
            for node in moved:
                state.place(node, chosen[node])
            return change, None
        return 0.0, None
    if change > 0 or not moved:
        return 0.0, None
    added = _profile_change(state, moved, chosen)
    over = np.flatnonzero(state.profile + added > state.limit)
    if len(over):
        return 0.0, (over, added[over], -change)
    for node in moved:
        state.place(node, chosen[node])
    return change, None


def _block_change(arrays: Arrays, solution, order, parents, true, chosen) -> float:
    change = 0.0
    for node, link in zip(order, parents):
        change += true[node][chosen[node]] - true[node][solution[node]]
        if link is not None:
            matrix = arrays.edge_matrix(link[1], link[0])
            change += matrix[chosen[link[0]], chosen[node]] - matrix[solution[link[0]], solution[node]]
    return float(change)


def _profile_change(state: State, moved: list, chosen: dict) -> np.ndarray:
    timeline = state.arrays.timeline
    change = np.zeros(len(timeline.points) + 1, dtype=state.profile.dtype)
    for node in moved:
        delta = state.arrays.usages[node][chosen[node]] - state.usage[node]
        change[timeline.first[node]] += delta
        change[timeline.last[node]] -= delta
    return np.cumsum(change[:-1])


def chord_move(state: State, seed: int, size: int, prices: np.ndarray, optimistic: bool) -> float:
    """Re-optimise a connected block through its breadth-first tree, each chord (a block edge off
    the tree) counted at its cheapest entry per strategy of one end (`optimistic`: lets a
    cycle bound by forbidden pairs change all at once) or at the other end's present strategy;
    keep the answer if its exact cost is lower and it fits the limit. Returns the cost change."""
    arrays = state.arrays
    order, parents, chords = spanning_block(arrays, seed, size)
    inside = np.zeros(arrays.node_count, dtype=bool)
    inside[order] = True
    unary = {node: arrays.local_costs(node, state.solution, skip=inside) + prices[node] * arrays.usages[node]
             for node in order}
    for u, v, edge in chords:
        matrix = arrays.edge_matrix(edge, u)
        unary[u] += matrix.min(axis=1) if optimistic else matrix[:, state.solution[v]]
    _, chosen = forest_minimum(arrays, order, parents, unary)
    moved = [node for node in order if chosen[node] != state.solution[node]]
    if not moved:
        return 0.0
    change = exact_change(arrays, state.solution, moved, chosen)
    if change >= 0:
        return 0.0
    added = _profile_change(state, moved, chosen)
    if (state.profile + added > state.limit).any():
        return 0.0
    for node in moved:
        state.place(node, chosen[node])
    return change


def exact_change(arrays: Arrays, solution: np.ndarray, moved: list, chosen: dict) -> float:
    """The cost change when the `moved` nodes take their `chosen` strategies."""
    after = solution.copy()
    for node in moved:
        after[node] = chosen[node]
    change, counted = 0.0, set()
    for node in moved:
        change += arrays.costs[node][after[node]] - arrays.costs[node][solution[node]]
        for neighbour, edge in arrays.neighbours[node]:
            if edge not in counted:
                counted.add(edge)
                u, v = arrays.instance.edges[edge]
                matrix = arrays.matrices[edge]
                change += matrix[after[u], after[v]] - matrix[solution[u], solution[v]]
    return float(change)
