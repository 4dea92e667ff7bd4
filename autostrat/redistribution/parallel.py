"""Cost-table entries priced by several processes at once: the same prices, sooner.

Each entry is a pure function of its two layouts, its dtype and the α–β model (`table.entry_price`),
so which process prices it changes nothing: `price_in_parallel` hands the missing entries of
some tables (`missing_pairs`) to `workers` processes, this one and spawned ones, one task per
search class (`search_class`), and writes every price it gets back into the entries' memo, where
the tables then read them as if they had priced them themselves. Spawned, not forked: the
caller may hold threads (a solver's, a JAX runtime's), and the processes need nothing of its
memory but the pairs.

Why by class: the pairs of one class share one search (`dim_class`) and its memos (expanded
states, the bounds towards each target). Handed out 4 pairs a task in the tables' order, every
process met every class and searched it again: 2 spawned processes priced the 7B-shaped step's
5 232 entries at 64 devices in 53.9 s, this process alone (its collector on too) in 50.6 s. By
class, with the collector paused in the processes as it is here (`table.collector_paused`),
from cold memos: 2 spawned processes 27.4 s against this one's 47.7 s; this one and 1 spawned
34.1 s against 49.7 s; and in the 7B row's refinement, where this process's memos are warm from
the propagation, 22.8 and 23.3 s against 29.4 and 40.2 s (`benchmarks/parallel_pricing.py`; the
refinement by the phase stamps of two paired runs; 2 shared cores).

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
from autostrat.redistribution.table import collector_paused, entry_price, memoised, remember

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
    entries' memo; how many were priced (fewer when the time ran out). This process is one of
    them: `workers` - 1 spawned processes take the tasks (`by_class`) from the largest, and
    this one, whose memos are warm, takes the smallest that none has started, until they meet.

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
    tasks = by_class(pairs)
    end = time.time() + seconds if math.isfinite(seconds) else math.inf  # the wall clock: shared by every process
    if workers <= 1:
        return sum(_remembered(task, _price(task, end)) for task in tasks)
    import multiprocessing  # here: a search that prices alone never loads them
    from concurrent.futures import ProcessPoolExecutor

    priced = 0
    pool = ProcessPoolExecutor(max_workers=workers - 1, mp_context=multiprocessing.get_context("spawn"))
    try:
        futures = [pool.submit(_price, task, end) for task in tasks]
        for task, future in reversed(list(zip(tasks, futures))):
            if future.cancel():  # no process has started it: price it here
                priced += _remembered(task, _price(task, end))
        for task, future in zip(tasks, futures):
            if not future.cancelled():
                priced += _remembered(task, future.result())
    finally:
        # Not waited for: a process ending frees its memos for seconds (the 7B row's limit of 60 s
        # ran 66.6 s waiting so), and every result is in; on an error or an interrupt the tasks not
        # started are dropped, not run to the end.
        pool.shutdown(wait=False, cancel_futures=True)
    return priced


def _remembered(task: list[tuple], prices: list[float]) -> int:
    """Put the `prices` of the first pairs of `task` in the memo; how many there were."""
    for pair, price in zip(task, prices):
        remember(*pair, price)
    return len(prices)


def search_class(src, dst, dtype, model) -> tuple:
    """What the searches of a pair (`missing_pairs`) depend on beyond which dims hold which
    axes: the element count, each layout's dims as their gcds with the device count (a search
    sees a dim only through that gcd, `dim_class`), the dtype, the device count and the α–β
    model. Pairs of one key share their dim classes' searches and memos, so one process should
    price them all.

    Example (a matrix and its transpose meet one search; a larger tensor does not):
        >>> from autostrat.layout import DeviceMatrix, Layout, TensorMap
        >>> def rows(shape):
        ...     return Layout(DeviceMatrix((8,)), TensorMap((0, -1)), shape)
        >>> def columns(shape):
        ...     return Layout(DeviceMatrix((8,)), TensorMap((-1, 0)), shape)
        >>> search_class(rows((16, 4)), rows((16, 4)), "float32", None) == search_class(columns((4, 16)), columns((4, 16)), "float32", None)
        True
        >>> search_class(rows((16, 4)), rows((16, 4)), "float32", None) == search_class(rows((16, 8)), rows((16, 8)), "float32", None)
        False
    """
    devices = src.device_num

    def gcds(layout) -> tuple[int, ...]:
        return tuple(sorted(math.gcd(size, devices) for size in layout.shape))

    return math.prod(src.shape), gcds(src), gcds(dst), dtype, devices, model


def by_class(pairs: list[tuple]) -> list[list[tuple]]:
    """`pairs` as one task per `search_class`, each in the pairs' order, the most
    pairs first (the longest tasks start first, so the processes end near together), ties in
    first-seen order.

    Example:
        >>> from autostrat.layout import DeviceMatrix, Layout, TensorMap
        >>> def rows(shape):
        ...     return Layout(DeviceMatrix((8,)), TensorMap((0, -1)), shape)
        >>> small, large = rows((16, 4)), rows((64, 4))
        >>> tasks = by_class([(small, small, "float32", None), (large, large, "float32", None), (large, large, "int32", None), (large, large, "float32", None)])
        >>> [[(pair[0].shape, pair[2]) for pair in task] for task in tasks]
        [[((64, 4), 'float32'), ((64, 4), 'float32')], [((16, 4), 'float32')], [((64, 4), 'int32')]]
    """
    groups: dict[tuple, list[tuple]] = {}
    for pair in pairs:
        groups.setdefault(search_class(*pair), []).append(pair)
    return sorted(groups.values(), key=len, reverse=True)  # stable: ties keep the first-seen order


def _price(pairs: list[tuple], end: float) -> list[float]:
    """In a spawned process or this one: the prices of `pairs` in order, until `end` (the ones
    after it left out)."""
    def check():
        if time.time() > end:
            raise _Stopped

    prices = []
    try:
        with collector_paused(), polled(check):  # as `cost_table` prices: a sixth of the time otherwise
            for pair in pairs:
                check()
                prices.append(entry_price(*pair))
    except _Stopped:
        pass
    return prices
