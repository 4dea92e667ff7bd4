"""Redistribution: the cheapest step sequence from one layout of a tensor to another.

`plan_redistribution` plans, `redistribution_cost` prices in bytes and `redistribution_time` in
nanoseconds, `cost_table` fills an edge's table,
`LazyCostTable` fills it as searches read it, `simulate` runs a plan on per-rank numpy pieces
and `lower_plan` turns it into primitives.
"""

from autostrat.redistribution.lazy import LazyCostTable
from autostrat.redistribution.lower import Primitive, lower_plan, lower_step, plan_to_text
from autostrat.redistribution.plan import RedistributionPlan, RedistributionStep
from autostrat.redistribution.planner import plan_redistribution, redistribution_cost, redistribution_time
from autostrat.redistribution.simulate import simulate
from autostrat.redistribution.table import collector_paused, cost_table

__all__ = [
    "LazyCostTable",
    "Primitive",
    "RedistributionPlan",
    "RedistributionStep",
    "collector_paused",
    "cost_table",
    "lower_plan",
    "lower_step",
    "plan_redistribution",
    "plan_to_text",
    "redistribution_cost",
    "redistribution_time",
    "simulate",
]
