"""One place to clear every redistribution memo (benchmarks measure cold runs with it)."""

from __future__ import annotations


def clear_memos() -> None:
    """Forget every memoised move list, bound, search, plan and cost-table entry, and the
    layouts' remembered normal forms.

    Example:
        >>> clear_memos()
    """
    from autostrat.layout import layout
    from autostrat.redistribution import heuristic, moves, planner, search, table, timed

    layout.normal_form.cache_clear()
    heuristic.import_bound.cache_clear()
    heuristic.receive_bound.cache_clear()
    moves._blocks.cache_clear()
    moves.canonical.cache_clear()
    moves.moves.cache_clear()
    moves.pool_canonical.cache_clear()
    moves.split_signature.cache_clear()
    planner._common_prime_matrix.cache_clear()
    planner._refined.cache_clear()
    planner._solve.cache_clear()
    planner._solve_cost.cache_clear()
    planner._solve_time.cache_clear()
    search.expansions.cache_clear()
    search.permuted_edges.cache_clear()
    search._step_nanoseconds.cache_clear()
    timed.bundle_classes.cache_clear()
    timed.matrix_of.cache_clear()
    timed.timed_bound.cache_clear()
    table._COSTS.clear()
    table._IDS.clear()
