"""Sequential tree-reweighted message passing (TRW-S, Kolmogorov 2006) on the groups' graph,
with the primal decoding of its passes: along the pass's order each group takes the strategy
best for its own cost, its edges to the groups already decided, and the messages from the
groups not yet decided. Each pass yields a solution; the messages make later ones better.
"""

from __future__ import annotations

import numpy as np

from autostrat.search.solve.arrays import Arrays


class MessagePassing:
    """Messages on every directed edge of the groups' graph, for unary costs `unary` (the
    groups' costs, plus any memory prices).

    Example:
        >>> from autostrat.search.solve.instance import read_instance
        >>> arrays = Arrays(read_instance("configs/iopddl_example.json"))
        >>> passing = MessagePassing(arrays)
        >>> [passing.run_pass(unary=arrays.costs, forward=f).tolist() for f in (True, False)]
        [[0, 1, 1], [0, 1, 1]]
    """

    def __init__(self, arrays: Arrays):
        self.arrays = arrays
        self.messages = {}
        for edge, (u, v) in enumerate(arrays.edges):
            self.messages[(edge, u)] = np.zeros(len(arrays.costs[u]))
            self.messages[(edge, v)] = np.zeros(len(arrays.costs[v]))
        self.weights = [1.0 / max(sum(j < i for j, _ in near), sum(j > i for j, _ in near), 1)
                        for i, near in enumerate(arrays.neighbours)]

    def run_pass(self, unary: list, forward: bool) -> np.ndarray:
        """One pass in group order (or reversed): update the messages to the groups later in
        the pass, and return the solution decoded along it."""
        arrays, messages = self.arrays, self.messages
        order = range(arrays.node_count) if forward else range(arrays.node_count - 1, -1, -1)
        solution = np.zeros(arrays.node_count, dtype=np.int64)
        done = np.zeros(arrays.node_count, dtype=bool)
        for node in order:
            belief = unary[node].copy()
            decoded = unary[node].copy()
            for neighbour, edge in arrays.neighbours[node]:
                incoming = messages[(edge, node)]
                belief += incoming
                decoded += arrays.edge_matrix(edge, node)[:, solution[neighbour]] if done[neighbour] else incoming
            solution[node] = int(decoded.argmin())
            done[node] = True
            scaled = self.weights[node] * belief
            for neighbour, edge in arrays.neighbours[node]:
                if not done[neighbour]:
                    table = arrays.edge_matrix(edge, node) + (scaled - messages[(edge, node)])[:, None]
                    message = table.min(axis=0)
                    messages[(edge, neighbour)] = message - message.min()
        return solution
