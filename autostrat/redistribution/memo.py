"""One place to clear every redistribution memo (benchmarks measure cold runs with it)."""

from __future__ import annotations


def clear_memos() -> None:
    """Forget every memoised move list, bound, search, plan and cost-table entry, and the
    layouts' remembered normal forms.

    Example:
        >>> clear_memos()
    """
    from autostrat.layout import layout
    from autostrat.redistribution import algorithms, dim_class, heuristic, layers, moves, planner, relabellings, solving, table, timed

    layout.normal_form.cache_clear()
    algorithms.algorithm_time.cache_clear()
    heuristic.import_bound.cache_clear()
    heuristic.receive_bound.cache_clear()
    moves._blocks.cache_clear()
    moves.canonical.cache_clear()
    moves.moves.cache_clear()
    moves.pool_canonical.cache_clear()
    moves.split_signature.cache_clear()
    planner._reshape_route.cache_clear()
    solving.common_prime_matrix.cache_clear()
    solving.refined.cache_clear()
    solving._class_path.cache_clear()
    solving._class_cost.cache_clear()
    solving._class_time.cache_clear()
    dim_class.dim_class.cache_clear()
    layers.expansions.cache_clear()
    layers.permuted_edges.cache_clear()
    relabellings._class_rows.cache_clear()
    relabellings.bundle_classes.cache_clear()
    relabellings._every_relabelling.cache_clear()
    relabellings.permute_links.cache_clear()
    timed.matrix_of.cache_clear()
    timed.step_nanoseconds.cache_clear()
    timed.timed_bound.cache_clear()
    table._COSTS.clear()
    table._IDS.clear()


class BoundedMemo(dict):
    """A memo dict that forgets everything once it holds `limit` entries: for memos whose
    entries are pure functions of their keys (dropping one changes no result, only the time to
    compute it again) and large, like a search problem's expanded states (`layers.expansions`),
    which otherwise keep every state a process ever expanded.

    Example:
        >>> memo = BoundedMemo(2)
        >>> memo[1], memo[2] = "a", "b"
        >>> memo[3] = "c"
        >>> memo
        {3: 'c'}
    """

    def __init__(self, limit: int):
        super().__init__()
        self.limit = limit

    def __setitem__(self, key, value) -> None:
        if len(self) >= self.limit:
            self.clear()
        super().__setitem__(key, value)
