"""The instance as the solvers read it: float costs (forbidden choices kept at their large
value), each node's neighbours with the edge between them, and the memory timeline.
"""

from __future__ import annotations

import numpy as np

from autostrat.search.solve.evaluate import Timeline
from autostrat.search.solve.instance import FORBIDDEN, Instance


class Arrays:
    """`costs[i]`, `usages[i]` per strategy; `neighbours[i]` a list of (node j, edge e) and
    `edge_matrix(e, i)` the edge's costs with node i's strategy as rows.

    Example:
        >>> from autostrat.search.solve.instance import read_instance
        >>> arrays = Arrays(read_instance("/work/shared/iopddl/example.json"))
        >>> arrays.neighbours[0], arrays.edge_matrix(0, 1).shape
        ([(1, 0), (2, 1)], (2, 1))
    """

    def __init__(self, instance: Instance):
        self.instance = instance
        self.node_count = instance.node_count
        self.costs = [np.minimum(cost.astype(np.float64), FORBIDDEN * 10) for cost in instance.costs]
        self.usages = [usage.astype(np.int64) if usage.dtype.kind in "iu" else usage for usage in instance.usages]
        self.matrices = [np.minimum(matrix.astype(np.float64), FORBIDDEN * 10) for matrix in instance.edge_costs]
        self.transposed = [np.ascontiguousarray(matrix.T) for matrix in self.matrices]
        self.neighbours = [[] for _ in range(self.node_count)]
        for edge, (u, v) in enumerate(instance.edges.tolist()):
            self.neighbours[u].append((v, edge))
            self.neighbours[v].append((u, edge))
        self.heads = instance.edges[:, 0].tolist() if len(instance.edges) else []
        self.timeline = Timeline(instance)
        self.limit = instance.limit

    def edge_matrix(self, edge: int, node: int) -> np.ndarray:
        """The costs of `edge`, rows indexed by `node`'s strategy (node is one of its ends)."""
        return self.matrices[edge] if self.heads[edge] == node else self.transposed[edge]

    def local_costs(self, node: int, solution: np.ndarray, skip=None) -> np.ndarray:
        """Node `node`'s cost per strategy plus its edges' costs to its neighbours' chosen
        strategies (leaving out the neighbours for which `skip` is true)."""
        total = self.costs[node].copy()
        for neighbour, edge in self.neighbours[node]:
            if skip is None or not skip[neighbour]:
                total += self.edge_matrix(edge, node)[:, solution[neighbour]]
        return total

    def usage_of(self, solution: np.ndarray) -> np.ndarray:
        """Each node's usage under `solution`."""
        return np.array([usage[solution[node]] for node, usage in enumerate(self.usages)])

    def float_cost(self, solution: np.ndarray) -> float:
        """The solution's cost in floats (the search's measure; `solution_cost` is exact)."""
        total = sum(cost[solution[node]] for node, cost in enumerate(self.costs))
        for edge, (u, v) in enumerate(self.instance.edges.tolist()):
            total += self.matrices[edge][solution[u], solution[v]]
        return float(total)
