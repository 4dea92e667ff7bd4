"""Exact evaluation of a solution (one strategy index per node): its cost as an exact Python
number, and its memory profile — the summed usage at every point where some interval starts,
the only points where the usage can rise, so its maximum is the peak.
"""

from __future__ import annotations

import numpy as np

from autostrat.search.solve.instance import Instance


def solution_cost(instance: Instance, solution) -> int | float:
    """The sum of the chosen node costs and edge costs, exactly (Python integers when the
    instance's costs are integers).

    Example:
        >>> from autostrat.search.solve.instance import read_instance
        >>> solution_cost(read_instance("configs/iopddl_example.json"), [0, 0, 1, 1, 0])
        330
    """
    chosen = np.asarray(solution, dtype=np.int64)
    total = sum(cost[chosen[node]].item() for node, cost in enumerate(instance.costs))
    for (u, v), matrix in zip(instance.edges, instance.edge_costs):
        total += matrix[chosen[u], chosen[v]].item()
    return total


class Timeline:
    """The points where some non-empty interval starts, and each node's range of them: node i
    uses memory at points `first[i]` up to (not including) `last[i]`.

    Example:
        >>> from autostrat.search.solve.instance import read_instance
        >>> timeline = Timeline(read_instance("configs/iopddl_example.json"))
        >>> timeline.points.tolist(), timeline.first.tolist(), timeline.last.tolist()
        ([0, 10, 20, 80], [0, 1, 2, 3, 3], [3, 3, 4, 4, 4])
    """

    def __init__(self, instance: Instance):
        starts, ends = instance.intervals[:, 0], instance.intervals[:, 1]
        used = starts < ends
        self.points = np.unique(starts[used])
        self.first = np.searchsorted(self.points, starts).astype(np.int64)
        self.last = np.searchsorted(self.points, ends).astype(np.int64)  # points < end
        self.last[~used] = self.first[~used]

    def profile(self, usages: np.ndarray) -> np.ndarray:
        """The summed usage at every point, given each node's chosen usage."""
        change = np.zeros(len(self.points) + 1, dtype=usages.dtype)
        np.add.at(change, self.first, usages)
        np.add.at(change, self.last, -usages)
        return np.cumsum(change[:-1])


def chosen_usages(instance: Instance, solution) -> np.ndarray:
    """Each node's usage under `solution`."""
    chosen = np.asarray(solution, dtype=np.int64)
    return np.array([usage[chosen[node]] for node, usage in enumerate(instance.usages)])


def peak_usage(instance: Instance, solution, timeline: Timeline | None = None):
    """The largest summed usage at any time point (0 when no interval is used).

    Example:
        >>> from autostrat.search.solve.instance import read_instance
        >>> peak_usage(read_instance("configs/iopddl_example.json"), [0, 0, 1, 1, 0])
        40
    """
    timeline = timeline or Timeline(instance)
    profile = timeline.profile(chosen_usages(instance, solution))
    return profile.max().item() if len(profile) else 0


def is_feasible(instance: Instance, solution, timeline: Timeline | None = None) -> bool:
    """Whether `solution` picks a strategy for every node and keeps the peak within the limit.

    Example:
        >>> from autostrat.search.solve.instance import read_instance
        >>> instance = read_instance("configs/iopddl_example.json")
        >>> is_feasible(instance, [0, 0, 1, 1, 0]), is_feasible(instance, [0, 0, 0, 1, 0])
        (False, True)
    """
    chosen = np.asarray(solution, dtype=np.int64)
    if chosen.shape != (instance.node_count,) or (chosen < 0).any() or (chosen >= instance.strategy_counts).any():
        return False
    return instance.limit is None or peak_usage(instance, chosen, timeline) <= instance.limit
