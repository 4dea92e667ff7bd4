"""The algorithm each collective step of a plan runs as (`cost.algorithms`), chosen once, here.

The planner finds the steps with every collective priced as a ring (its exactness is proven for
those prices); then `with_algorithms` gives each AllReduce, AllGather and ReduceScatter step the
algorithm `cost.algorithms.choose_algorithm` picks for its group, placement over the servers of
the α–β model and local bytes, and the step's bytes become that algorithm's. Under the time
objective a cost table prices a pair as that plan's time (`algorithm_time`), so the search's
objective is the predicted time of the plan it builds. Under the bytes objective only the
hierarchical algorithms, across servers, replace a ring, with no more bytes than it (equal
unless an AllReduce's chunks round differently), so cost tables of bytes stay what the planner
proves up to that rounding.

Not searched jointly: the step sequence is the fastest under ring prices, then each step takes
its best algorithm; a sequence that is only faster with other algorithms is not looked for.
"""

from __future__ import annotations

import math
from dataclasses import replace
from functools import lru_cache

from autostrat.cost import dtype_size
from autostrat.cost.algorithms import ALGORITHMS, choose_algorithm
from autostrat.redistribution.plan import RedistributionPlan
from autostrat.redistribution.planner import plan_redistribution


def with_algorithms(plan: RedistributionPlan, model, dtype, objective: str) -> RedistributionPlan:
    """`plan` with each collective step run as its best algorithm under `model` and `objective`
    ("bytes" or "time"), its bytes (and the plan's) those of the algorithm.

    Example (a partial sum over 16 devices in 2 servers of 8, made whole: hierarchical under
    both objectives, the same bytes as the ring):
        >>> from autostrat.cost import Hardware
        >>> from autostrat.layout import DeviceMatrix, Layout, TensorMap
        >>> src = Layout(DeviceMatrix((16,)), TensorMap((-1,)), (1024,), partial=(0,))
        >>> plan = plan_redistribution(src, src.with_partial(()))
        >>> str(with_algorithms(plan, Hardware().alpha_beta(16), "float32", "bytes"))
        'AllReduce(axes (3, 2, 1, 0), 7680B, hierarchical:8); 7680B'
    """
    itemsize = dtype_size(dtype)
    steps = tuple(_chosen(step, model, itemsize, objective) for step in plan.steps)
    if steps == plan.steps:
        return plan
    cost = plan.cost - sum(step.bytes for step in plan.steps) + sum(step.bytes for step in steps)
    return replace(plan, steps=steps, cost=cost)


def _chosen(step, model, itemsize: int, objective: str):
    if step.kind not in ALGORITHMS or not step.axes or step.group_size == 1:
        return step
    local_bytes = math.prod(step.before.slice_shape) * itemsize
    algorithm, _, sent = choose_algorithm(model, step.kind, step.before.device_matrix, tuple(step.axes), local_bytes,
                                          itemsize, objective)
    if algorithm == "ring":
        return step
    return replace(step, algorithm=algorithm, bytes=sent, itemsize=itemsize)


def plan_with_algorithms(src, dst, dtype, model, timing, objective: str) -> RedistributionPlan:
    """The plan from `src` to `dst` (fastest under `model`, fewest bytes when it is None), its
    collectives run as their best algorithms on `timing` for `objective`: what a plan's edge or
    writeback holds (`search.plan.build_plan`)."""
    return with_algorithms(plan_redistribution(src, dst, dtype, model), timing, dtype, objective)


@lru_cache(maxsize=1 << 15)
def algorithm_time(src, dst, dtype, model) -> int:
    """Nanoseconds of the plan from `src` to `dst` fastest under `model` (ring prices), its
    collectives run as their fastest algorithms: what a time cost table holds for the pair.

    Example (a small partial sum over 2 servers of 8: the fastest ring plan is four AllReduces,
    one per prime axis, of 2 ring messages each; as recursive doubling each is one message):
        >>> from autostrat.cost import Hardware
        >>> from autostrat.layout import DeviceMatrix, Layout, TensorMap
        >>> src = Layout(DeviceMatrix((16,)), TensorMap((-1,)), (16,), partial=(0,))
        >>> model = Hardware().alpha_beta(16)
        >>> algorithm_time(src, src.with_partial(()), "float32", model), plan_redistribution(src, src.with_partial(()), "float32", model).nanoseconds(model)
        (10005, 20005)
    """
    return plan_with_algorithms(src, dst, dtype, model, model, "time").nanoseconds(model)
