"""Lower bounds on cost-table entries, cheap enough to read before the entries themselves, so
that propagation's branch and bound (`propagate._total_cost`) prices only the candidates that
can be cheapest: at 1 024 devices one entry is a redistribution search of up to seconds, and
most candidates of an op under a decided neighbour need gathers nobody would choose.

The bound, in bytes per device: a rank must receive every element of its target slice that
its source slice lacks, and every step of a plan between two layouts without partial values
(Slice, AllGather, AllToAll, collective permute) costs each device at least the bytes it
receives (`DESIGN.md`: AllGather (g-1)·s, AllToAll (g-1)·s/g, permute s, slice 0). So each
rank's missing elements times the item size bound the entry; a few ranks are probed (rank 0,
the last, and the first rank along every device-matrix axis) and the largest count is taken.

Cases with no bound here (0): either layout partial (a sum may be created for free or need a
reduction), two shapes (a reshape's route), two device counts, and time entries (an α–β
model: latencies and algorithms, not bytes).
"""

from __future__ import annotations

import math

import numpy as np

from autostrat.cost import dtype_size

_BOUNDS: dict = {}  # (source, target, itemsize) -> bytes; layouts hash as values


def entry_bound(source, target, itemsize: int) -> int:
    """A lower bound on the bytes per device of any redistribution from `source` to `target`
    (layouts of one tensor), 0 where none is known (see the module docstring).

    Example (rows split 4 ways, then whole: each rank lacks three quarters of an 8 x 8 table):
        >>> from autostrat.layout import DeviceMatrix, Layout, TensorMap
        >>> rows = Layout(DeviceMatrix((4,)), TensorMap((0, -1)), (8, 8))
        >>> whole = Layout(DeviceMatrix((4,)), TensorMap((-1, -1)), (8, 8))
        >>> entry_bound(rows, whole, 4), entry_bound(whole, rows, 4)
        (192, 0)
    """
    key = (source, target, itemsize)
    found = _BOUNDS.get(key)
    if found is None:
        found = _BOUNDS[key] = _missing_elements(source, target) * itemsize
    return found


def _missing_elements(source, target) -> int:
    """The most elements of its `target` slice that one probed rank's `source` slice lacks."""
    if source.partial or target.partial or source.shape != target.shape or source.device_num != target.device_num:
        return 0
    wanted = math.prod(target.slice_shape)
    most = 0
    for rank in _probes(source, target):
        held = math.prod(max(0, min(stop, other_stop) - max(start, other_start)) for (start, stop), (other_start, other_stop)
                         in zip(target.slice_range(rank), source.slice_range(rank)))
        most = max(most, wanted - held)
    return most


def _probes(source, target) -> list[int]:
    """Rank 0, the last rank, and per axis of either device matrix the rank one step along it."""
    ranks = {0, source.device_num - 1}
    for matrix in (source.device_matrix, target.device_matrix):
        sizes = matrix.shape
        ranks.update(math.prod(sizes[position + 1:]) for position in range(len(sizes)) if sizes[position] > 1)
    return sorted(ranks)


def table_bounds(table, rows, columns) -> np.ndarray:
    """Lower bounds on the entries ``table[rows, columns]`` of a `LazyCostTable` (one of
    `rows`, `columns` an index, the other a sequence), as the table scales them; zeros for a
    table of times.

    Example:
        >>> from autostrat.layout import DeviceMatrix, Layout, TensorMap
        >>> from autostrat.redistribution import LazyCostTable
        >>> rows = Layout(DeviceMatrix((4,)), TensorMap((0, -1)), (8, 8))
        >>> whole = Layout(DeviceMatrix((4,)), TensorMap((-1, -1)), (8, 8))
        >>> table_bounds(LazyCostTable([rows, whole], [rows, whole]), 0, [0, 1]).tolist()
        [0.0, 192.0]
    """
    count = len(columns) if np.ndim(rows) == 0 else len(rows)
    if table.model is not None:
        return np.zeros(count)
    itemsize = dtype_size(table.dtype)
    sources = [table.producer_layouts[rows]] * count if np.ndim(rows) == 0 else [table.producer_layouts[i] for i in rows]
    targets = [table.consumer_layouts[columns]] * count if np.ndim(columns) == 0 else [table.consumer_layouts[j] for j in columns]
    return np.array([entry_bound(s, t, itemsize) for s, t in zip(sources, targets)], dtype=float) * table.scale
