"""Timing for the layout search under an α–β model (`search.Search` with a `model`): the lower
bound in nanoseconds from a state to the target (`TimedBound`), the least latency and greatest
bandwidth of a model (`time_floor`) and each step's time (`step_nanoseconds`). Each is
memoised: a cost table's columns search from every row through many of the same states. The
relabellings a permute can make are in `relabellings`.
"""

from __future__ import annotations

from functools import lru_cache

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


    def fast_relabellings(self, state: State) -> int:
        """A lower bound on this bound at every relabelling of `state` that moves only axes at
        the greatest bandwidth (a permute bundle's children on the fastest link).

        Such a relabelling moves ranks only inside their groups joined by those axes, so each
        group's members hold the same slices between them, and what the group must import
        (``C``) is the same: the children's bounds are at least a slower link's latency plus
        ``C`` at its bandwidth, the terms of `_bound` that do not depend on where inside the
        group a slice lies. 0 without slower links or when nothing must cross them.
        """
        crossing = self.imports(state) if self.imports is not None else 0
        if not crossing:
            return 0
        slow = float(self.slow_bandwidth).as_integer_ratio()
        return max(self.latency, self.slow_latency) + -(-(crossing * slow[1] * 10**9) // slow[0])


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
