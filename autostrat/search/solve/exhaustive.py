"""Exact answers for instances small enough to try every solution of the groups: the optimum,
proven, in the time the search would take to start (the README's five-node example has 12)."""

from __future__ import annotations

import itertools
import math

import numpy as np

from autostrat.search.solve.arrays import Arrays
from autostrat.search.solve.instance import FORBIDDEN
from autostrat.search.solve.evaluate import solution_cost

EXHAUSTIVE_LIMIT = 4096  # solutions of the groups; a few milliseconds each at most on small instances


def exhaustive_best(arrays: Arrays, limit: int = EXHAUSTIVE_LIMIT) -> list | None:
    """The instance's cheapest solution within its usage limit, found by trying every solution
    of the groups (exact: any solution of finite cost gives each member its root's mapping);
    None when there are more than `limit` of them or none of finite cost fits.

    Ranked by the float costs, ties and near-ties settled by the exact integer cost, first in
    enumeration order: the same instance always gives the same solution.

    Example:
        >>> from autostrat.search.solve.instance import read_instance
        >>> exhaustive_best(Arrays(read_instance("configs/iopddl_example.json")))
        [0, 0, 2, 1, 0]
    """
    counts = [len(costs) for costs in arrays.costs]
    if math.prod(counts) > limit:
        return None
    fitting = []
    for choice in itertools.product(*map(range, counts)):
        solution = np.array(choice, dtype=np.int64)
        if arrays.limit is None or not (arrays.profile(solution) > arrays.limit).any():
            fitting.append((arrays.float_cost(solution), solution))
    finite = [(cost, solution) for cost, solution in fitting if cost < FORBIDDEN]
    if not finite:
        return None
    lowest = min(cost for cost, _ in finite)
    near = [arrays.expand(solution) for cost, solution in finite if cost <= lowest * (1 + 1e-9) + 1e-9]
    return min(near, key=lambda expanded: solution_cost(arrays.instance, expanded))
