"""Edge cost tables: redistribution bytes (or, with an α–β model, nanoseconds) from every producer
layout to every consumer layout.

Costs are memoised on the normalised layouts (which carry the shape) and the dtype, so repeated
layers, and equivalent layouts written over different device matrices, cost one search.
"""

from __future__ import annotations

import gc
from contextlib import contextmanager

import numpy as np

from autostrat.cost import dtype_size
from autostrat.redistribution.algorithms import algorithm_time
from autostrat.redistribution.planner import redistribution_cost

_COSTS: dict = {}  # (src id, dst id, itemsize, model) -> bytes, or nanoseconds with a model
_IDS: dict = {}  # normalised layout -> small int, so that memo keys hash fast


def _layout_id(layout) -> int:
    return _IDS.setdefault(layout.normalized(), len(_IDS))


def cost_table(producer_layouts, consumer_layouts, dtype="float32", model=None) -> np.ndarray:
    """Bytes per device of the cheapest redistribution, rows = producers, columns = consumers;
    with an α–β `model` (`cost.AlphaBeta`), nanoseconds of the fastest (`redistribution_time`).

    Every entry is an exact integer: every pair of layouts of one tensor on one cluster has a
    plan (`constructive`), and a pair the planner cannot price raises, never priced ``inf``,
    since an infinite price would remove a candidate the layouts allow.

    Example:
        >>> from autostrat.layout import DeviceMatrix, Layout, TensorMap
        >>> rows = Layout(DeviceMatrix((4,)), TensorMap((0, -1)), (8, 8))
        >>> whole = Layout(DeviceMatrix((4,)), TensorMap((-1, -1)), (8, 8))
        >>> cost_table([rows, whole], [rows, whole]).tolist()
        [[0.0, 192.0], [0.0, 0.0]]
    """
    itemsize = dtype_size(dtype)
    rows = [(layout, _layout_id(layout)) for layout in producer_layouts]
    columns = [(layout, _layout_id(layout)) for layout in consumer_layouts]
    table = np.empty((len(rows), len(columns)))
    with collector_paused():
        for i, (src, src_id) in enumerate(rows):
            for j, (dst, dst_id) in enumerate(columns):
                key = (src_id, dst_id, itemsize, model)
                if key not in _COSTS:
                    _COSTS[key] = entry_price(src, dst, dtype, model)
                table[i, j] = _COSTS[key]
    return table


@contextmanager
def collector_paused():
    """Pause Python's cyclic garbage collector while a table fills (or a whole search runs),
    then restore it.

    The searches allocate hundreds of thousands of small tuples (states, heap entries) and keep
    many in their memos; none forms a cycle, so the collector frees nothing here, yet each of its
    passes walks every young tuple and, now and then, every memo entry: about a sixth of a cold
    fill, and 6 of 16 s of a 1024-device CP-SAT search (whose coarsening and model building run
    between fills). Reference counting still frees everything as usual.
    """
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def memoised(src, dst, dtype, model) -> bool:
    """Whether the entry of `src` to `dst` is in `cost_table`'s memo (`parallel`).

    Example:
        >>> from autostrat.layout import DeviceMatrix, Layout, TensorMap
        >>> rows = Layout(DeviceMatrix((4,)), TensorMap((0, -1)), (4, 12))
        >>> memoised(rows, rows, "float32", None), cost_table([rows], [rows]).tolist(), memoised(rows, rows, "float32", None)
        (False, [[0.0]], True)
    """
    return (_layout_id(src), _layout_id(dst), dtype_size(dtype), model) in _COSTS


def remember(src, dst, dtype, model, price: float) -> None:
    """Put the entry of `src` to `dst`, priced elsewhere (`entry_price` in another process), in the memo."""
    _COSTS[(_layout_id(src), _layout_id(dst), dtype_size(dtype), model)] = float(price)


def entry_price(src, dst, dtype, model) -> float:
    """One entry, planned (no memo of its own); an error planning it is raised (see `cost_table`)."""
    if model is not None:
        return float(algorithm_time(src, dst, dtype, model))  # collectives as their fastest algorithms
    return float(redistribution_cost(src, dst, dtype, model))
