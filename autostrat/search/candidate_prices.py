"""What each candidate of an op costs given its decided neighbours, priced as little as the
choice allows: propagation's branch and bound (`total_cost`).

A term is one edge's (or one destination's) redistribution price per candidate: called with
candidate indices (None: all) it gives their prices; `bounds()` gives, without any
redistribution search, a lower bound for every candidate (`entry_bounds`).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

import numpy as np

from autostrat.cost import dtype_size
from autostrat.redistribution import cost_table
from autostrat.search.entry_bounds import entry_bound, table_bounds


@dataclass(frozen=True)
class RowTerm:
    """The prices from a decided producer's candidate `row` into each candidate of the consumer;
    0 where `free` says another reader already has the tensor in that layout."""

    table: object
    row: int
    free: np.ndarray | None = None

    def __call__(self, indices):
        values = self.table[self.row, :] if indices is None else np.array([self.table[self.row, int(j)] for j in indices])
        if self.free is not None:
            values = np.where(self.free if indices is None else self.free[indices], 0.0, values)
        return values

    def bounds(self) -> np.ndarray:
        values = table_bounds(self.table, row=self.row)
        return values if self.free is None else np.where(self.free, 0.0, values)

    def key(self) -> tuple:
        """What the term's prices depend on (`choice_key`): the table (one object per pair of
        candidate lists, `problem_edges.edge_table`), the row and the free candidates."""
        return "row", self.table, self.row, None if self.free is None else self.free.tobytes()


@dataclass(frozen=True)
class ColumnTerm:
    """The prices from each candidate of the producer into a decided consumer's `column`."""

    table: object
    column: int

    def __call__(self, indices):
        if indices is None:
            return self.table[:, self.column]
        return np.array([self.table[int(i), self.column] for i in indices])

    def bounds(self) -> np.ndarray:
        return table_bounds(self.table, column=self.column)

    def key(self) -> tuple:
        return "column", self.table, self.column


@dataclass(frozen=True)
class DestinationTerm:
    """The prices from each candidate's output layout (`held`) to the layout `wanted` downstream."""

    held: tuple
    wanted: object
    dtype: str
    model: object

    def __call__(self, indices):
        sources = self.held if indices is None else [self.held[int(j)] for j in indices]
        return cost_table(sources, [self.wanted], self.dtype, self.model)[:, 0]

    def bounds(self) -> np.ndarray:
        return destination_bounds(self.held, self.wanted, dtype_size(self.dtype), self.model)

    def key(self) -> tuple:
        return "destination", self.held, self.wanted, self.dtype, self.model


@cache
def destination_bounds(held: tuple, wanted, itemsize: int, model) -> np.ndarray:
    """`DestinationTerm.bounds`, remembered: every layer's gradients ask for the same ones (in
    DeepSeek-V3's search 22 290 times, 11.5 of its 127 s profiled)."""
    found = np.array([entry_bound(layout, wanted, itemsize, model) for layout in held], dtype=float)
    found.setflags(write=False)
    return found


def choice_key(candidates: tuple, costs, terms: list, tie_break: str) -> tuple:
    """Everything the cheapest candidate of an op depends on (`propagate.best_candidate`): its
    candidates, own costs, terms in order (a float sum's order is part of its value) and the
    tie-break. The ops of repeated layers meet equal keys: their candidates, own costs and
    tables are equal, and so are their decided neighbours' choices.

    Example (two equal terms give one key; another row, another key):
        >>> table = np.zeros((2, 2))
        >>> costs = type("Costs", (), {"comm": np.zeros(2), "flops": np.ones(2), "memory": np.ones(2)})
        >>> key = lambda row: choice_key((0, 1), costs, [RowTerm(table, row)], "memory")
        >>> key(0) == key(0), key(0) == key(1)
        (True, False)
    """
    own = (costs.comm.tobytes(), costs.flops.tobytes(), costs.memory.tobytes())
    return tie_break, candidates, own, tuple(term.key() for term in terms)


def total_cost(base: np.ndarray, terms: list) -> np.ndarray:
    """Per candidate, `base` (its own communication) plus every term; inf for candidates left
    unpriced because they cannot be cheapest.

    Branch and bound, exact, pricing in three rounds:

    1. the candidate of the least lower bound (`base` plus every term's `bounds`), first on a
       tie, is priced whole: its total caps the best;
    2. the first term is priced for every candidate whose lower bound does not exceed that cap;
    3. the others, cheapest first term first, while that does not exceed the best total so far,
       and only while the terms priced so far do not exceed it (`candidate_total`).

    The bounds are summed in the order the totals are, so in floating point a bound never
    exceeds its total. Candidates tied with the best are all priced, so the tie-breaks see
    them; at 1024 devices this skips most redistribution searches of candidates nobody would
    choose.

    Example (the second candidate's bound, 5, exceeds the first's total, 1: never priced):
        >>> class Term:
        ...     def __init__(self, prices, bounds): self.prices, self.lower = prices, bounds
        ...     def __call__(self, indices): return np.array([self.prices[j] for j in indices])
        ...     def bounds(self): return np.array(self.lower)
        >>> total_cost(np.zeros(2), [Term([1.0, 9.0], [0.0, 5.0])]).tolist()
        [1.0, inf]
    """
    if not terms:
        return base.copy()
    bounds = [term.bounds() for term in terms]
    lower = base + bounds[0] + sum(bounds[1:], np.zeros(len(base)))
    total = np.full(len(base), np.inf)
    first = int(np.argmin(lower))
    partial = {first: base[first] + _price(terms[0], first)}
    total[first] = best = candidate_total(partial[first], terms[1:], first, np.inf)
    for j in np.flatnonzero(lower <= best):
        if int(j) != first:
            partial[int(j)] = base[j] + _price(terms[0], j)
    for j in sorted(partial, key=lambda k: (partial[k], k)):
        if partial[j] > best:
            break
        if j != first:
            total[j] = candidate_total(partial[j], terms[1:], j, best)
            best = min(best, total[j])
    return total


def _price(term, j) -> float:
    return float(term(np.array([j]))[0])


def candidate_total(partial: float, terms: list, j: int, best: float) -> float:
    """``partial + sum(terms' prices of candidate j)``, or inf as soon as the terms priced so
    far exceed `best` (the rest are never priced: the last terms, where activation gradients go,
    were 24 of the 38 s of redistribution searches of the 405B estimate, one of them 16 s).

    Exact: in floating point a prefix of a sum of non-negative numbers never exceeds the whole
    sum, so a candidate left at inf totals more than `best` as the whole sum would.
    """
    prices = []
    for term in terms:
        prices.append(_price(term, j))
        if partial + sum(prices) > best:
            return np.inf
    return partial + sum(prices)
