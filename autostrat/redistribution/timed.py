"""Timing for the layout search under an α–β model (`search.Search` with a `model`): the lower
bound in nanoseconds from a state to the target (`TimedBound`), and the relabellings a permute
can make, grouped by the link of the axes they move and by the classes of child they reach.
Each is memoised: a cost table's columns search from every row through many of the same states.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from autostrat.cost.time_model import ceil_nanoseconds
from autostrat.layout import DeviceMatrix
from autostrat.redistribution.heuristic import MemoisedBound, import_bound, receive_bound
from autostrat.redistribution.moves import Space, State


@lru_cache(maxsize=1024)
def matrix_of(sizes: tuple[int, ...]) -> DeviceMatrix:
    """The device matrix of a space's axis sizes (memoised: a timed search asks for every edge)."""
    return DeviceMatrix(tuple(reversed(sizes)))


class TimedBound(MemoisedBound):
    """Under an α–β model, a lower bound in nanoseconds on the time from a state to the target.

    Of the bytes the remaining steps charge a device, at least ``C`` (`heuristic.ImportBound`,
    for groups joined by the axes at the greatest bandwidth ``β_f``) go over steps touching a
    slower axis, at ``β_s`` (the greatest bandwidth of those) or less, and in all at least ``R``
    (the receive bound). So the steps take at least ``C/β_s + max(R - C, 0)/β_f``, rounded up
    (each step's transfer is, and a sum of ceilings is at least the ceiling of the sum), plus
    the latency of the messages some rank must still receive (`ReceiveBound.sources`), one of
    them over a slower axis when ``C > 0``. Between servers this is the
    bound that matters: a tensor that must reach other servers costs their bandwidth, and the
    plain receive bound, priced at the fastest link, is several times too low there for A* to
    prune anything.

    Example (8 devices as 2 servers of 4; axis 2 crosses them. Gathering 16 MiB of rows split
    over the servers: each device receives 8 MiB, and each server's 8 MiB enter it at 2 MiB
    per device, as in the fastest plan, which slices the rows over the 4 devices of a server,
    gathers across, then inside, in 77 907 ns):
        >>> from autostrat.cost import Hardware
        >>> model = Hardware(devices_per_server=4).alpha_beta(8)
        >>> space = Space((2, 2, 2), (4096, 1024), 4)
        >>> bound = timed_bound(space, (((), ()), ()), matrix_of(space.sizes), model)
        >>> rows = (((2,), ()), ())
        >>> bound.receive(rows), bound.imports(rows), bound(rows)  # 4 µs + 2 MiB at 50 GB/s + 6 MiB at 450 GB/s
        (8388608, 2097152, 59925)
    """

    def __init__(self, space: Space, target: State, matrix: DeviceMatrix, model):
        self.receive = receive_bound(space, target)
        self.latency, self.bandwidth = time_floor(model)
        links = [model.link(matrix, (axis,)) for axis in range(len(space.sizes))]
        slow = [link for link in links if link[1] < self.bandwidth]
        fast = tuple(axis for axis, link in enumerate(links) if link[1] >= self.bandwidth)
        self.imports = import_bound(space, target, fast) if slow else None
        if slow:
            self.slow_latency = min(round(alpha * 1e9) for alpha, _ in slow)
            self.slow_bandwidth = max(beta for _, beta in slow)
        self.memo: dict = {}  # state -> nanoseconds

    def _bound(self, state: State) -> int:
        sent = self.receive(state)
        crossing = self.imports(state) if self.imports is not None else 0
        # Messages: at least ceil(log2(sources)) (`ReceiveBound.sources`), and one if anything moves.
        messages = max((self.receive.sources(state) - 1).bit_length(), 1 if sent or crossing else 0)
        if not crossing:
            return messages * self.latency + ceil_nanoseconds(sent, self.bandwidth)
        slow, fast = float(self.slow_bandwidth).as_integer_ratio(), float(self.bandwidth).as_integer_ratio()
        # ceil(10⁹ (C/β_s + rest/β_f)) with each bandwidth an exact fraction.
        numerator = (crossing * slow[1] * fast[0] + max(sent - crossing, 0) * fast[1] * slow[0]) * 10**9
        latency = max(self.latency, self.slow_latency) + (messages - 1) * self.latency  # one of them crosses
        return latency + -(-numerator // (slow[0] * fast[0]))


@lru_cache(maxsize=1 << 16)
def step_nanoseconds(model, kind: str, matrix: DeviceMatrix, axes: tuple[int, ...], sent: int) -> int:
    """`AlphaBeta.step_nanoseconds`, memoised: a timed search meets few distinct steps (a state
    has a permute per relabelling, and they share their axes and bytes) many times over."""
    return model.step_nanoseconds(kind, matrix, axes, sent)


@lru_cache(maxsize=256)
def timed_bound(space: Space, target: State, matrix: DeviceMatrix, model) -> TimedBound:
    """The shared `TimedBound` towards `target` (a table's column is searched from every row)."""
    return TimedBound(space, target, matrix, model)


@lru_cache(maxsize=64)
def time_floor(model) -> tuple[int, float]:
    """(nanoseconds, bytes per second): the least latency and the greatest bandwidth of any
    axis of `model`. Steps that still have to send B > 0 bytes include at least one message,
    and each step's bytes take at least their time at the greatest bandwidth, rounded up; so
    they take at least ``latency + ceil(B / bandwidth)``: the receive bound, timed, stays a
    lower bound (A* stays exact)."""
    return min(round(alpha * 1e9) for alpha in model.latency), max(model.bandwidth)


@lru_cache(maxsize=256)
def permute_links(sizes: tuple[int, ...], matrix: DeviceMatrix, model) -> tuple[tuple[tuple[int, ...], tuple], ...]:
    """The relabellings of `sizes` grouped by the link (`AlphaBeta.link`) of the axes they move,
    which is all a permute's time depends on besides its bytes: ``(moved axes of one, all)``.

    Example (three axes of 2; only the outer one crosses the two servers of 4):
        >>> from autostrat.cost import Hardware
        >>> links = permute_links((2, 2, 2), DeviceMatrix((2, 2, 2)), Hardware(devices_per_server=4).alpha_beta(8))
        >>> [(moved, len(mappings)) for moved, mappings in links]
        [((1, 2), 4), ((0, 1), 1)]
    """
    found: dict = {}
    for mapping in relabellings(sizes):
        moved = tuple(a for a, image in enumerate(mapping) if a != image)
        found.setdefault(model.link(matrix, moved), (moved, []))[1].append(mapping)
    return tuple((moved, tuple(mappings)) for moved, mappings in found.values())


@lru_cache(maxsize=256)
def relabellings(sizes: tuple[int, ...]) -> tuple[tuple[int, ...], ...]:
    """Every map of axes onto axes of equal size but the identity (``mapping[a]``: a's new name).

    Example:
        >>> relabellings((2, 3, 2))
        ((2, 1, 0),)
    """
    found = [()]
    for axis in range(len(sizes)):
        found = [m + (b,) for m in found for b in range(len(sizes)) if sizes[b] == sizes[axis] and b not in m]
    return tuple(m for m in found if any(a != b for a, b in enumerate(m)))


@lru_cache(maxsize=1 << 12)
def bundle_classes(sizes, matrix, model, index: int, pools, used: tuple[int, ...], partial: tuple[int, ...]) -> tuple[tuple, ...]:
    """``(mapping, moved axes, child's axes, representative's axes)`` for the relabellings of
    one bundle (`permute_links`) that reach distinct classes of child (up to relabellings
    within `pools`) other than the state's own, each the first of its class in the bundle's
    order, for states whose dims list the axes `used` in order and whose partial axes are
    `partial`: all the classes depend on (many states share them, hence the memo). The axes
    are listed as `used` then the partial ones (`search.Search._bundle_edges` cuts them into dims).

    A child's representative (`moves.pool_canonical`) lists the images of `used` in order, then
    those of `partial` sorted, each pool's axes renamed to the pool's ids in order of appearance;
    that sequence is the class's key, computed for every relabelling at once.

    Example (three axes of 2 in one link, one pool (1, 2); a state splitting a dim over axis 0:
    the children put that role on axis 1 or 2, one class):
        >>> from autostrat.cost import Hardware
        >>> model = Hardware(devices_per_server=8).alpha_beta(8)
        >>> [found[0] for found in bundle_classes((2, 2, 2), matrix_of((2, 2, 2)), model, 0, ((1, 2),), (0,), ())]
        [(1, 0, 2)]
    """
    mappings = np.array(permute_links(sizes, matrix, model)[index][1] + (tuple(range(len(sizes))),), dtype=np.int64)
    images = np.concatenate([mappings[:, list(used)], np.sort(mappings[:, list(partial)], axis=1)], axis=1)
    keys = images
    for pool in pools:
        inside = np.isin(keys, pool)
        rank = np.minimum(np.maximum(np.cumsum(inside, axis=1) - 1, 0), len(pool) - 1)
        keys = np.where(inside, np.array(pool)[rank], keys)
    _, first = np.unique(keys, axis=0, return_index=True)
    other = (keys != keys[-1]).any(axis=1)  # the identity, appended last, has the state's own class
    found = []
    for row in sorted(first):
        if other[row]:
            mapping = tuple(mappings[row].tolist())
            moved = tuple(a for a, image in enumerate(mapping) if a != image)
            found.append((mapping, moved, images[row].tolist(), keys[row].tolist()))
    return tuple(found)


def conjugated(mapping, back) -> tuple[int, ...]:
    """A relabelling of representative axes (`mapping`) as one of the real axes `back` names."""
    real = [0] * len(mapping)
    for axis, image in enumerate(mapping):
        real[back[axis]] = back[image]
    return tuple(real)


def speed_pools(matrix: DeviceMatrix, model, pools) -> tuple[tuple[int, ...], ...]:
    """`pools` split into axes the α–β `model` times alike on `matrix` (equal latency and
    bandwidth): swapping two of them changes no step's time, since a step is timed on the
    slowest link its axes span."""
    found = []
    for pool in pools:
        classes: dict = {}
        for axis in pool:
            classes.setdefault(model.link(matrix, (axis,)), []).append(axis)
        found += [tuple(axes) for axes in classes.values() if len(axes) > 1]
    return tuple(found)
