"""The `Backend` protocol every runtime backend implements, and its byte counting.

A backend is one rank's view of the cluster: the executor calls it with the rank's own buffers,
MPI style, and every rank of a group makes the same call. Collectives take and return lists of
equally shaped blocks in group order; cutting and joining along tensor dims is the executor's
job, so a backend only moves and reduces buffers.

Every collective is moved as point-to-point messages (`wire.Wire`: ring AllGather and
ReduceScatter, AllReduce as both, pairwise AllToAll, permutes; or the recursive-doubling or
hierarchical algorithm a plan's step records), and every message is recorded at
its send call, with its destination and bytes (`wire.Message`), in `sent`: the run's byte counts
are what was handed to the transport, counted by code that never reads the cost model. A
collective is either run at once (the calls below) or begun on the communication stream and
progressed between kernels (`runtime.stream`, through `Wire.post` and the ``*_steps``
generators): the same messages, counted the same way.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from autostrat.errors import ConfigError
from autostrat.runtime.wire import Message

REDUCE_OPS = ("max", "min", "sum")


class Backend(Protocol):
    """One rank's communication. Groups are tuples of global ranks, in chunk order."""

    rank: int
    device_num: int
    sent: list[Message]  # every message this rank sent, in order

    def prepare(self, partitions) -> None:
        """Make one communicator per group of every partition (all ranks call it once, in order)."""

    def allgather(self, piece: np.ndarray, group: tuple[int, ...], algorithm: str = "ring") -> list[np.ndarray]:
        """Every member's piece, in group order (`algorithm`: the plan's, `wire` lists them)."""

    def alltoall(self, blocks: list[np.ndarray], group: tuple[int, ...]) -> list[np.ndarray]:
        """Block i goes to member i; returns the block every member sent to this rank."""

    def allreduce(self, piece: np.ndarray, group: tuple[int, ...], op: str, algorithm: str = "ring") -> np.ndarray:
        """The elementwise `op` ("sum", "max", "min") of every member's piece."""

    def reduce_scatter(self, blocks: list[np.ndarray], group: tuple[int, ...], op: str, algorithm: str = "ring") -> np.ndarray:
        """The `op` over members of their block number (this rank's position in the group)."""

    def sendrecv(self, piece: np.ndarray, dest: int, source: int) -> np.ndarray:
        """Send `piece` to `dest` and receive a piece of the same shape from `source`."""

    def post(self, piece: np.ndarray, dest: int, source: int, shape: tuple[int, ...] | None = None):
        """`sendrecv` begun, not waited for: a transfer with ``ready()``, ``wait()`` and
        ``result()`` (the communication stream's exchanges)."""

    def send(self, piece: np.ndarray, dest: int, tag: int) -> None:
        """Post `piece` to rank `dest` without waiting for it to be received (pipeline stages)."""

    def recv(self, shape: tuple[int, ...], dtype, source: int, tag: int) -> np.ndarray:
        """Wait for the piece rank `source` posted with `tag` (messages of one tag arrive in order)."""

    def complete_sends(self) -> None:
        """Wait until every posted piece has been taken (the end of a pipeline step)."""

    def barrier(self) -> None:
        """Wait until every rank is here (before a timed step: the step starts on every rank
        together, so the slowest rank's time is the step's). Sends no counted message."""

    def gather_report(self, values: np.ndarray) -> list[np.ndarray] | None:
        """Rank 0 gets every rank's `values` (float64, same length everywhere); others get None.
        For the run report only: not counted as sent bytes."""


def check_world(device_num: int, backend, where: str = "the plan") -> None:
    """A `ConfigError` unless `backend` has exactly the `device_num` ranks `where` was made for.

    Every path that executes a plan calls it before the first step: a world of another size
    would index the wrong slices (fewer ranks) or meet in collectives nobody else joins.

    Example:
        >>> from types import SimpleNamespace
        >>> check_world(8, SimpleNamespace(device_num=4))
        Traceback (most recent call last):
        ...
        autostrat.errors.ConfigError: the plan is for device_num 8 but 4 ranks are running (the world size); \
plan for 4 devices (device_num=4) or start 8 ranks (mpiexec -n 8)
    """
    if backend.device_num != device_num:
        raise ConfigError(
            f"{where} is for device_num {device_num} but {backend.device_num} ranks are running (the world size); "
            f"plan for {backend.device_num} devices (device_num={backend.device_num}) or start {device_num} ranks "
            f"(mpiexec -n {device_num})"
        )

