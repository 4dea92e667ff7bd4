"""The instance as the solvers read it: groups of nodes (`groups.group_nodes`) as the nodes of
a smaller problem, with float costs (forbidden choices kept at a large value), each group's
neighbours with the merged edge between them, and each group's memory: its members' intervals
cut into segments between consecutive end points, with the usage per strategy per segment.
"""

from __future__ import annotations

import numpy as np

from autostrat.search.solve.evaluate import Timeline
from autostrat.search.solve.groups import group_nodes
from autostrat.search.solve.instance import FORBIDDEN, Instance

CAP = FORBIDDEN * 10  # forbidden costs are capped so that float sums of them stay meaningful


class Arrays:
    """Group g: `costs[g]` per strategy, `bounds[g]` the time-point indices cutting its segments
    and `tables[g][s, j]` its usage under strategy s in segment j; `neighbours[g]` a list of
    (group h, edge e) and `edge_matrix(e, g)` the edge's costs with g's strategy as rows;
    `expand` gives the instance's solution of a solution of the groups.

    Example:
        >>> from autostrat.search.solve.instance import read_instance
        >>> arrays = Arrays(read_instance("configs/iopddl_example.json"))
        >>> arrays.node_count, arrays.costs[0].tolist(), arrays.bounds[0].tolist()
        (3, [40.0, 50.0], [1, 3])
    """

    def __init__(self, instance: Instance):
        self.instance, self.limit = instance, instance.limit
        roots, self.maps = group_nodes(instance)
        self.roots = np.unique(roots)
        self.group_of = np.searchsorted(self.roots, roots)
        self.node_count = len(self.roots)
        self.members = [np.flatnonzero(self.group_of == g) for g in range(self.node_count)]
        self.timeline = Timeline(instance)
        self.point_count = len(self.timeline.points)
        self.costs = [self._group_costs(g) for g in range(self.node_count)]
        self._merge_edges()
        self.bounds, self.tables = zip(*(self._segments(g) for g in range(self.node_count)))
        # the points each group uses memory at: from span_first up to (not including) span_last
        self.span_first = np.array([bounds[0] if len(bounds) > 1 else 0 for bounds in self.bounds], dtype=np.int64)
        self.span_last = np.array([bounds[-1] if len(bounds) > 1 else 0 for bounds in self.bounds], dtype=np.int64)
        self.varies = np.array([table.size > 0 and bool((table.max(axis=0) != table.min(axis=0)).any())
                                for table in self.tables], dtype=bool)  # whether the strategy changes its memory
        self.transposed = [np.ascontiguousarray(matrix.T) for matrix in self.matrices]
        self.neighbours = [[] for _ in range(self.node_count)]
        for edge, (u, v) in enumerate(self.edges):
            self.neighbours[u].append((v, edge))
            self.neighbours[v].append((u, edge))

    def _group_costs(self, group: int) -> np.ndarray:
        total = np.zeros(len(self.instance.costs[self.roots[group]]))
        for node in self.members[group]:
            total += self.instance.costs[node][self.maps[node]]
        return total

    def _merge_edges(self) -> None:
        """Edges inside a group add to its costs; the others sum per pair of groups."""
        merged: dict = {}
        for edge, (x, y) in enumerate(self.instance.edges.tolist()):
            g, h = self.group_of[x], self.group_of[y]
            matrix = self.instance.edge_costs[edge]
            if g == h:
                self.costs[g] += matrix[self.maps[x], self.maps[y]]
                continue
            block = matrix[np.ix_(self.maps[x], self.maps[y])].astype(np.float64)
            if g > h:
                g, h, block = h, g, block.T
            merged[(g, h)] = merged[(g, h)] + block if (g, h) in merged else block
        self.costs = [np.minimum(cost, CAP) for cost in self.costs]
        self.edges = [(int(g), int(h)) for g, h in sorted(merged)]
        self.matrices = [np.minimum(merged[key], CAP) for key in sorted(merged)]
        self.heads = [g for g, _ in self.edges]

    def _segments(self, group: int) -> tuple:
        first, last = self.timeline.first, self.timeline.last
        members = [node for node in self.members[group] if first[node] < last[node]]
        bounds = np.unique(np.concatenate([first[members], last[members]])) if members else np.zeros(0, np.int64)
        count = len(self.costs[group])
        change = np.zeros((count, max(len(bounds), 1)), dtype=np.int64)
        for node in members:
            usage = np.asarray(self.instance.usages[node][self.maps[node]], dtype=np.int64)
            change[:, np.searchsorted(bounds, first[node])] += usage
            change[:, np.searchsorted(bounds, last[node])] -= usage
        return bounds, np.cumsum(change, axis=1)[:, : max(len(bounds) - 1, 0)]

    def edge_matrix(self, edge: int, node: int) -> np.ndarray:
        """The costs of `edge`, rows indexed by `node`'s strategy (node is one of its ends)."""
        return self.matrices[edge] if self.heads[edge] == node else self.transposed[edge]

    def local_costs(self, node: int, solution: np.ndarray, skip=None) -> np.ndarray:
        """Group `node`'s cost per strategy plus its edges' costs to its neighbours' chosen
        strategies (leaving out the neighbours for which `skip` is true)."""
        total = self.costs[node].copy()
        for neighbour, edge in self.neighbours[node]:
            if skip is None or not skip[neighbour]:
                total += self.edge_matrix(edge, node)[:, solution[neighbour]]
        return total

    def profile(self, solution: np.ndarray) -> np.ndarray:
        """The summed usage at every time point."""
        change = np.zeros(self.point_count + 1, dtype=np.int64)
        for group, strategy in enumerate(solution.tolist()):
            self.add_usage(change, group, self.tables[group][strategy])
        return np.cumsum(change[:-1])

    def add_usage(self, change: np.ndarray, group: int, usage: np.ndarray) -> None:
        """Add `usage` (one value per segment of the group) to a difference array of points."""
        bounds = self.bounds[group]
        if len(bounds) > 1:
            np.add.at(change, bounds[:-1], usage)
            np.add.at(change, bounds[1:], -usage)

    def segment_sums(self, group: int, values: np.ndarray) -> np.ndarray:
        """The sums of `values` (prefix sums over the points, length points + 1) per segment."""
        bounds = self.bounds[group]
        return values[bounds[1:]] - values[bounds[:-1]] if len(bounds) > 1 else np.zeros(0)

    def float_cost(self, solution: np.ndarray) -> float:
        """The solution's cost in floats (the search's measure; `solution_cost` is exact)."""
        total = sum(cost[solution[node]] for node, cost in enumerate(self.costs))
        for edge, (u, v) in enumerate(self.edges):
            total += self.matrices[edge][solution[u], solution[v]]
        return float(total)

    def expand(self, solution: np.ndarray) -> list:
        """The instance's solution: every node's strategy from its group's."""
        return [int(self.maps[node][solution[self.group_of[node]]]) for node in range(self.instance.node_count)]
