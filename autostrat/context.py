"""MindSpore's ``mindspore.context``: the parallel and execution contexts (thin face).

Example:
    >>> from autostrat import context
    >>> context.set_auto_parallel_context(parallel_mode=context.ParallelMode.AUTO_PARALLEL, device_num=8)
    >>> context.get_auto_parallel_context("parallel_mode")
    'auto_parallel'
    >>> context.reset_auto_parallel_context()
"""

from autostrat.frontend.context import get_auto_parallel_context, reset_auto_parallel_context, set_auto_parallel_context
from autostrat.frontend.ms_context import GRAPH_MODE, PYNATIVE_MODE, ParallelMode, get_context, reset_context, set_context

__all__ = ["GRAPH_MODE", "PYNATIVE_MODE", "ParallelMode", "get_auto_parallel_context", "get_context",
           "reset_auto_parallel_context", "reset_context", "set_auto_parallel_context", "set_context"]
