"""Search: candidates and cost tables, BFS propagation, and the resulting plan."""

from autostrat.search.checkpoint import load_checkpoint_seeds, seeds_by_phase
from autostrat.search.plan import EdgeRedistribution, OpPlan, Plan
from autostrat.search.options import SearchOptions
from autostrat.search.search import search

__all__ = ["EdgeRedistribution", "OpPlan", "Plan", "SearchOptions", "load_checkpoint_seeds", "search", "seeds_by_phase"]
