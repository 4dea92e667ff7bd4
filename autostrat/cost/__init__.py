"""Costs: collective bytes (ring formulas; other algorithms and their choice in `cost.algorithms`),
the hardware and its α–β step-time model, per-strategy op costs."""

from autostrat.cost.collective import COLLECTIVE_KINDS, collective_bytes, dtype_size
from autostrat.cost.hardware import DEFAULT_PROFILE, DEVICES_PER_SERVER, PROFILES, Hardware
from autostrat.cost.op_cost import OpCost, op_cost
from autostrat.cost.time_model import AlphaBeta

__all__ = ["COLLECTIVE_KINDS", "DEFAULT_PROFILE", "DEVICES_PER_SERVER", "PROFILES", "AlphaBeta", "Hardware", "OpCost", "collective_bytes", "dtype_size", "op_cost"]
