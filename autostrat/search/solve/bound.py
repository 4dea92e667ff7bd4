"""A lower bound on the optimum: the memory limit relaxed with multipliers (Lagrange), then every
edge outside a spanning forest replaced by its cheapest entry per strategy of one end, which is
never above it; what remains is a forest, minimised exactly by `forest_minimum`.

The forest keeps the edges whose costs vary most (a maximum spanning forest), so that the
relaxed ones lose little. The bound is one of the groups' problem (`groups`), whose solutions
are exactly those of the instance without forbidden choices; any other solution costs at least
`FORBIDDEN`, so the bound is never above it.
"""

from __future__ import annotations

import numpy as np

from autostrat.search.solve.arrays import Arrays
from autostrat.search.solve.forest import forest_minimum
from autostrat.search.solve.instance import FORBIDDEN

MESSAGE_CAP = 2.0 ** 40


def lower_bound(arrays: Arrays, multipliers: np.ndarray | None = None, kept: np.ndarray | None = None,
                messages: dict | None = None) -> float:
    """A value no solution within the memory limit goes below; `multipliers` (>= 0, one per
    time point) price memory use, each point's limit subtracted again; `kept`: the edges of
    the forest (`spanning_forest`, computed when not given); `messages` (any, e.g. message
    passing's: a vector per (edge, end group)) move cost from each edge to its ends first.

    Example:
        >>> from autostrat.search.solve.instance import read_instance
        >>> lower_bound(Arrays(read_instance("configs/iopddl_example.json")))
        330.0
    """
    kept = spanning_forest(arrays) if kept is None else kept
    costs = arrays if messages is None else Reparametrized(arrays, messages)
    unary = {node: cost.copy() for node, cost in enumerate(costs.costs)}
    offset = 0.0
    if multipliers is not None and arrays.limit is not None and len(multipliers):
        price = pricing(arrays, multipliers)
        for node in range(arrays.node_count):
            unary[node] += price(node)
        offset = float(multipliers.sum()) * arrays.limit
    for edge, (u, v) in enumerate(arrays.edges):
        if not kept[edge]:
            unary[u] += costs.matrices[edge].min(axis=1)
    order, parents = _rooted(arrays, kept)
    value = min(float(forest_minimum(costs, order, parents, unary)[0]) - offset, FORBIDDEN)
    # integer sums are exact in floats below 2**53; above, rounding could lift the bound over
    # the optimum (forbidden costs), so it is lowered by far more than the rounding; moved
    # costs are fractions: each term of the sums may be off by a rounding of the largest sum,
    # which the capped messages bound
    if messages is not None:
        terms = len(arrays.edges) + arrays.node_count
        value -= 4 * terms * float(np.spacing(abs(value) + terms * costs.largest))
    return value * (1 - 2.0 ** -40) if abs(value) >= 2.0 ** 53 else value


class Reparametrized:
    """The groups' costs with `messages` moved from each edge to its ends: edge (u, v) loses
    m_u(a) + m_v(b) at (a, b) and u, v gain them, which leaves every solution's cost as it was,
    so any bound of these costs bounds the instance. Messages are capped at `MESSAGE_CAP` (any
    messages are allowed), so that the moved amounts stay far below the forbidden costs."""

    def __init__(self, arrays: Arrays, messages: dict):
        self.costs = [cost.copy() for cost in arrays.costs]
        self.matrices, self.heads, self.largest = [], arrays.heads, 0.0
        for edge, (u, v) in enumerate(arrays.edges):
            into_u, into_v = (np.minimum(messages[(edge, end)], MESSAGE_CAP) for end in (u, v))
            self.costs[u] += into_u
            self.costs[v] += into_v
            self.matrices.append(arrays.matrices[edge] - into_u[:, None] - into_v[None, :])
            self.largest = max(self.largest, float(into_u.max(initial=0.0)), float(into_v.max(initial=0.0)))
        self.transposed = [np.ascontiguousarray(matrix.T) for matrix in self.matrices]

    def edge_matrix(self, edge: int, node: int) -> np.ndarray:
        """As `Arrays.edge_matrix`, of the moved costs."""
        return self.matrices[edge] if self.heads[edge] == node else self.transposed[edge]


def pricing(arrays: Arrays, multipliers: np.ndarray):
    """The memory price of each strategy of a group: its usage in each segment times the
    multipliers summed over the segment's points (a function of the group)."""
    prefix = np.concatenate([[0.0], np.cumsum(multipliers)])
    if not prefix.any():
        return lambda group: 0.0
    return lambda group: arrays.tables[group] @ arrays.segment_sums(group, prefix)


def spanning_forest(arrays: Arrays) -> np.ndarray:
    """Which edges a maximum spanning forest by cost spread keeps (Kruskal)."""
    spread = np.array([float(np.median(matrix) - matrix.min()) for matrix in arrays.matrices])
    root = list(range(arrays.node_count))

    def find(node: int) -> int:
        while root[node] != node:
            root[node] = root[root[node]]
            node = root[node]
        return node

    kept = np.zeros(len(spread), dtype=bool)
    edges = arrays.edges
    for edge in np.argsort(-spread, kind="stable").tolist():
        a, b = find(edges[edge][0]), find(edges[edge][1])
        if a != b:
            root[a] = b
            kept[edge] = True
    return kept


def _rooted(arrays: Arrays, kept: np.ndarray) -> tuple:
    """The forest of the kept edges as `forest_minimum` reads it: nodes parents first."""
    seen = np.zeros(arrays.node_count, dtype=bool)
    order, parents = [], []
    for root in range(arrays.node_count):
        if seen[root]:
            continue
        seen[root] = True
        order.append(root)
        parents.append(None)
        head = len(order) - 1
        while head < len(order):
            node = order[head]
            head += 1
            for neighbour, edge in arrays.neighbours[node]:
                if kept[edge] and not seen[neighbour]:
                    seen[neighbour] = True
                    order.append(neighbour)
                    parents.append((node, edge))
    return order, parents
