"""What a plan of repeated layers computes once and shares: the redistribution plan of each
pair of layouts (`PlanMemo`, for `plan.build_plan`) and the primitives' text of each plan
(`LoweredPlans`, for `plan.Plan.to_dict`). At 16 384 devices a 126-layer LLaMA's 7 833 edges
and writebacks share far fewer plans, each listing every rank group of its collectives.
"""

from __future__ import annotations

from autostrat.layout import Layout
from autostrat.redistribution import RedistributionPlan, lower_plan
from autostrat.redistribution.algorithms import plan_with_algorithms


class LoweredPlans(dict):
    """The primitives' text of each plan asked for (by identity: plans live while asked)."""

    def __call__(self, plan: RedistributionPlan) -> tuple[str, ...]:
        found = self.get(id(plan))
        if found is None:
            found = self[id(plan)] = tuple(str(primitive) for primitive in lower_plan(plan))
        return found


class PlanMemo(dict):
    """`plan_with_algorithms` on one plan's `model`, `timing` and objective, each pair of layouts
    and dtype planned once: repeated layers repeat their edges (a 126-layer LLaMA at 16 384
    devices has 7 833 edges and writebacks), and a plan is a pure function of its key, so every
    edge holds the plan it would get alone (tested: the same plan JSON as planned edge by edge).
    """

    def __init__(self, model, timing, cost_model: str):
        super().__init__()
        self.model, self.timing, self.cost_model = model, timing, cost_model

    def __call__(self, src: Layout, dst: Layout, dtype: str) -> RedistributionPlan:
        key = (src, dst, dtype)
        plan = self.get(key)
        if plan is None:
            plan = self[key] = plan_with_algorithms(src, dst, dtype, self.model, self.timing, self.cost_model)
        return plan
