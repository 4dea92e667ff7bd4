"""One place to clear every redistribution memo (benchmarks measure cold runs with it)."""

from __future__ import annotations


def clear_memos() -> None:
    """Forget every memoised move list, search, plan and cost-table entry.

    Example:
        >>> clear_memos()
    """
    from autostrat.redistribution import moves, planner, table

    moves.moves.cache_clear()
    planner._solve.cache_clear()
    table._COSTS.clear()
    table._IDS.clear()
