"""Cost-table entries priced by several processes at once: the same prices, sooner.

Each entry is a pure function of its two layouts, its dtype and the α–β model (`table.entry_price`),
so which process prices it changes nothing: `price_in_parallel` hands the missing entries of
some tables (`missing_pairs`) to `workers` spawned processes, a few pairs per task in the
tables' order (their searches take from microseconds to seconds, so the tasks are small and
taken as processes free up), and writes every price it gets back into the entries' memo, where
the tables then read them as if they had priced them themselves. Spawned, not forked: the
caller may hold threads (a solver's, a JAX runtime's), and the processes need nothing of its
memory but the pairs.

Within `seconds` only: each process stops pricing at that time, inside an entry's search too
(`polling`), and the pairs it did not price are left missing for the caller, whose own clock
then says that the time ran out. (Measured on the 7B-shaped step at 64 devices refined for time:
1 747 entries, 226 of them over 0.1 s each and 272 of the 292 s in all.)
"""

from __future__ import annotations

import math
import time
from contextlib import contextmanager
from contextvars import ContextVar

from autostrat.redistribution.polling import polled
from autostrat.redistribution.table import entry_price, memoised, remember

PAIRS_PER_TASK = 4
_PROCESSES: ContextVar[int] = ContextVar("pricing_processes", default=0)


@contextmanager
def pricing(count: int):
    """Have the cost-table pricing started inside use `count` processes (above 1; `processes`).

    Example:
        >>> with pricing(4):
        ...     processes()
        4
        >>> processes()
        0
    """
    token = _PROCESSES.set(count)
    try:
        yield
    finally:
        _PROCESSES.reset(token)


def processes() -> int:
    """How many processes `pricing` asked for (0 outside)."""
    return _PROCESSES.get()


class _Stopped(Exception):
    """A worker's time ran out inside an entry's search."""


def missing_pairs(tables) -> list[tuple]:
    """The ``(src, dst, dtype, model)`` pairs the entries of `tables` (`lazy.LazyCostTable`) still
    need priced and no memo holds, each once, in the tables' order.

    Example:
        >>> from autostrat.layout import DeviceMatrix, Layout, TensorMap
        >>> from autostrat.redistribution.lazy import LazyCostTable
        >>> from autostrat.redistribution.memo import clear_memos
        >>> clear_memos()  # what another caller priced is memoised: not missing
        >>> rows = Layout(DeviceMatrix((4,)), TensorMap((0, -1)), (8, 8))
        >>> whole = Layout(DeviceMatrix((4,)), TensorMap((-1, -1)), (8, 8))
        >>> [(str(src), str(dst)) for src, dst, _, _ in missing_pairs([LazyCostTable([rows], [rows, whole])])]
        [('[8, 8] dm[4] tm(0, -1)', '[8, 8] dm[4] tm(0, -1)'), ('[8, 8] dm[4] tm(0, -1)', '[8, 8] dm[4] tm(-1, -1)')]
    """
    found: dict = {}
    for table in tables:
        for pair in table.missing():
            if not memoised(*pair):
                found.setdefault(pair, None)
    return list(found)


def price_in_parallel(pairs: list[tuple], workers: int, seconds: float = math.inf) -> int:
    """Price `pairs` (`missing_pairs`) on `workers` processes within `seconds`, into the
    entries' memo; how many were priced (fewer when the time ran out).

    Example (two pairs on two processes; the tables then find them memoised):
        >>> from autostrat.layout import DeviceMatrix, Layout, TensorMap
        >>> from autostrat.redistribution.lazy import LazyCostTable
        >>> rows = Layout(DeviceMatrix((4,)), TensorMap((0, -1)), (8, 16))
        >>> whole = Layout(DeviceMatrix((4,)), TensorMap((-1, -1)), (8, 16))
        >>> table = LazyCostTable([rows], [rows, whole])
        >>> price_in_parallel(missing_pairs([table]), 2), missing_pairs([table])
        (2, [])
    """
    if not pairs:
        return 0
    import multiprocessing  # here: a search that prices alone never loads them
    from concurrent.futures import ProcessPoolExecutor

    tasks = [pairs[start:start + PAIRS_PER_TASK] for start in range(0, len(pairs), PAIRS_PER_TASK)]
    end = time.time() + seconds if math.isfinite(seconds) else math.inf  # the wall clock: shared by every process
    priced = 0
    pool = ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn"))
    try:
        for task, prices in zip(tasks, pool.map(_price, tasks, [end] * len(tasks))):
            for pair, price in zip(task, prices):
                remember(*pair, price)
                priced += 1
    finally:
        # Not waited for: a process ending frees its memos for seconds (the 7B row's limit of 60 s
        # ran 66.6 s waiting so), and every result is in; on an error or an interrupt the tasks not
        # started are dropped, not run to the end.
        pool.shutdown(wait=False, cancel_futures=True)
    return priced


def _price(pairs: list[tuple], end: float) -> list[float]:
    """In a worker: the prices of `pairs` in order, until `end` (the ones after it left out)."""
    def check():
        if time.time() > end:
            raise _Stopped

    prices = []
    try:
        with polled(check):
            for pair in pairs:
                check()
                prices.append(entry_price(*pair))
    except _Stopped:
        pass
    return prices
