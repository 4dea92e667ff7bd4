"""The MindSpore-style front end: parallel context, Cell/Parameter/Tensor, primitives, tracing."""

from autostrat.frontend.context import (
    ParallelContext,
    current_context,
    get_auto_parallel_context,
    reset_auto_parallel_context,
    set_auto_parallel_context,
)
from autostrat.frontend.tracing import trace

__all__ = [
    "ParallelContext",
    "current_context",
    "get_auto_parallel_context",
    "reset_auto_parallel_context",
    "set_auto_parallel_context",
    "trace",
]
