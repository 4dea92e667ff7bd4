"""Lower bounds on cost-table entries, cheap enough to read before the entries themselves, so
that propagation's branch and bound (`candidate_prices.total_cost`) prices only the candidates that
can be cheapest: at 1 024 devices one entry is a redistribution search of up to seconds, and
most candidates of an op under a decided neighbour need gathers nobody would choose.

The bound, in bytes per device: a rank must receive every element of its target slice that
its source slice lacks, and every step of a plan between two layouts without partial values
(Slice, AllGather, AllToAll, collective permute) costs each device at least the bytes it
receives (`DESIGN.md`: AllGather (g-1)·s, AllToAll (g-1)·s/g, permute s, slice 0). So each
rank's missing elements times the item size bound the entry; a few ranks are probed (rank 0,
the last, and the first rank along every device-matrix axis) and the largest count is taken.

Under an α–β model the entry is a time: those bytes reach the rank over links no faster than
the model's fastest, in at least one message, so the entry takes at least the least latency
plus their time at the greatest bandwidth, rounded up (`redistribution.timed.time_floor`: each
step's time is, whatever algorithm runs it, and a sum of ceilings is at least the ceiling of
the sum).

Partial layouts, in bytes (no time model): the redistribution search's own A* bound at its
start (`redistribution.heuristic.ReceiveBound`, the bound its optimum is proven against: the
sums still to be reduced, and what the reduced values must still move), read on the pair's
search problem (`redistribution.solving.build_problem`), a millisecond where the search may take
seconds: at 1 024 devices DeepSeek-V3's partial expert sums towards a candidate's partial layouts
took 5-31 s each, their start bounds 0.82-0.99 of their price, so a decided neighbour's cheaper
candidate leaves them unpriced.

Cases with no bound here (0): a partial layout under a time model (its collectives run as their
fastest algorithms, which the byte bound does not bound), or with two partial ops (priced
through the whole shadow, `planner._resolved_first`), two shapes (a reshape's route) and two
device counts.
"""

from __future__ import annotations

import math
from weakref import WeakKeyDictionary

import numpy as np

from autostrat.cost import dtype_size
from autostrat.cost.time_model import ceil_nanoseconds
from autostrat.redistribution.heuristic import receive_bound
from autostrat.redistribution.solving import build_problem
from autostrat.redistribution.timed import time_floor

# (id(source), id(target), itemsize) -> (bytes, source, target): keyed by identity, since a
# layout hashes by value through its nested fields (3.9 M reads took 26 of 99 s profiled of
# GPT-OSS's search), and holding both layouts keeps their ids from being reused; so callers pass
# layouts that outlive the question (candidates' own, normal forms), never ones built for it
_BOUNDS: dict = {}
_NORMAL_BOUNDS: dict = {}  # the same, of normal forms
_RANGES: dict = {}  # (id(layout), rank) -> (the rank's slice ranges, layout), likewise
_TABLES: WeakKeyDictionary = WeakKeyDictionary()  # table -> {(row, column): its bounds}


def entry_bound(source, target, itemsize: int, model=None) -> int:
    """A lower bound on the bytes per device of any redistribution from `source` to `target`
    (layouts of one tensor), or with an α–β `model` on its nanoseconds; 0 where none is known
    (see the module docstring).

    Example (rows split 4 ways, then whole: each rank lacks three quarters of an 8 x 8 table):
        >>> from autostrat.layout import DeviceMatrix, Layout, TensorMap
        >>> rows = Layout(DeviceMatrix((4,)), TensorMap((0, -1)), (8, 8))
        >>> whole = Layout(DeviceMatrix((4,)), TensorMap((-1, -1)), (8, 8))
        >>> entry_bound(rows, whole, 4), entry_bound(whole, rows, 4)
        (192, 0)
        >>> from autostrat.cost import Hardware
        >>> entry_bound(rows, whole, 4, Hardware().alpha_beta(4))  # 2 µs + 192 B at 450 GB/s
        2001
    """
    key = (id(source), id(target), itemsize, model)
    found = _BOUNDS.get(key)
    if found is None:
        found = _BOUNDS[key] = (_normal_bound(source.normalized(), target.normalized(), itemsize, model), source, target)
    return found[0]


def _normal_bound(source, target, itemsize: int, model) -> int:
    """`entry_bound` of two normal forms (every rank's slice is a function of the normal form),
    remembered by their identity: the equal layouts of a model's repeated layers share normal
    forms, so one bound serves all (DeepSeek-V3's estimate asked 57 460 pairs of candidates' own
    layouts, 4.7 of its 25.7 s profiled)."""
    key = (id(source), id(target), itemsize, model)
    found = _NORMAL_BOUNDS.get(key)
    if found is None:
        if source.shape != target.shape or source.device_num != target.device_num:
            sent = 0
        elif source.partial or target.partial:
            sent = _partial_bytes(source, target, itemsize) if model is None else 0
        else:
            sent = _missing_elements(source, target) * itemsize
        found = _NORMAL_BOUNDS[key] = (sent if model is None else _least_time(sent, model), source, target)
    return found[0]


def _least_time(sent: int, model) -> int:
    """The least nanoseconds of steps that bring `sent` bytes to one rank under `model`."""
    if not sent:
        return 0
    latency, bandwidth = time_floor(model)
    return latency + ceil_nanoseconds(sent, bandwidth)


def _partial_bytes(source, target, itemsize: int) -> int:
    """The redistribution search's start bound from `source` to `target` (normal forms of one
    shape on one device count, one of them partial), in bytes; 0 where the module docstring
    gives none."""
    if source.partial and target.partial and source.partial_op != target.partial_op:
        return 0
    problem, start, goal = build_problem(source, target, itemsize)
    if len(problem.spaces) != 1:
        return 0
    return receive_bound(problem.spaces[0], goal[1])(start[1])


def _missing_elements(source, target) -> int:
    """The most elements of its `target` slice that one probed rank's `source` slice lacks (two
    whole layouts of one shape on one device count)."""
    wanted = math.prod(target.slice_shape)
    most = 0
    for rank in _probes(source, target):
        held = math.prod(max(0, min(stop, other_stop) - max(start, other_start)) for (start, stop), (other_start, other_stop)
                         in zip(_slice_range(target, rank), _slice_range(source, rank)))
        most = max(most, wanted - held)
    return most


def _slice_range(layout, rank: int) -> tuple:
    """`Layout.slice_range`, remembered: a layout meets many others, each probing the same ranks."""
    key = (id(layout), rank)
    found = _RANGES.get(key)
    if found is None:
        found = _RANGES[key] = (layout.slice_range(rank), layout)
    return found[0]


def _probes(source, target) -> list[int]:
    """Rank 0, the last rank, and per axis of either device matrix the rank one step along it."""
    ranks = {0, source.device_num - 1}
    for matrix in (source.device_matrix, target.device_matrix):
        sizes = matrix.shape
        ranks.update(math.prod(sizes[position + 1:]) for position in range(len(sizes)) if sizes[position] > 1)
    return sorted(ranks)


def table_bounds(table, row: int | None = None, column: int | None = None) -> np.ndarray:
    """Lower bounds on the entries of one `row` or one `column` of a `LazyCostTable`, as the
    table scales them (kept while the table lives: propagation reads a row again in every
    round).

    Example:
        >>> from autostrat.layout import DeviceMatrix, Layout, TensorMap
        >>> from autostrat.redistribution import LazyCostTable
        >>> rows = Layout(DeviceMatrix((4,)), TensorMap((0, -1)), (8, 8))
        >>> whole = Layout(DeviceMatrix((4,)), TensorMap((-1, -1)), (8, 8))
        >>> table_bounds(LazyCostTable([rows, whole], [rows, whole]), row=0).tolist()
        [0.0, 192.0]
    """
    known = _TABLES.setdefault(table, {})
    found = known.get((row, column))
    if found is None:
        found = known[row, column] = _line_bounds(table, row, column)
    return found


def _line_bounds(table, row: int | None, column: int | None) -> np.ndarray:
    sources, targets, model = table.producer_layouts, table.consumer_layouts, table.model
    itemsize = dtype_size(table.dtype)
    if column is None:
        bounds = [entry_bound(sources[row], target, itemsize, model) for target in targets]
    else:
        bounds = [entry_bound(source, targets[column], itemsize, model) for source in sources]
    found = np.array(bounds, dtype=float) * table.scale
    found.setflags(write=False)
    return found
