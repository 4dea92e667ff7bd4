"""Costs: collective bytes (ring formulas), an optional α–β time model, per-strategy op costs."""

from autostrat.cost.collective import COLLECTIVE_KINDS, collective_bytes, dtype_size
from autostrat.cost.op_cost import OpCost, op_cost
from autostrat.cost.time_model import AlphaBeta

__all__ = ["COLLECTIVE_KINDS", "AlphaBeta", "OpCost", "collective_bytes", "dtype_size", "op_cost"]
