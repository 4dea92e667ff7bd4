"""The `Backend` protocol every runtime backend implements, and its byte counting.

A backend is one rank's view of the cluster: the executor calls it with the rank's own buffers,
MPI style, and every rank of a group makes the same call. Collectives take and return lists of
equally shaped blocks in group order; cutting and joining along tensor dims is the executor's
job, so a backend only moves and reduces buffers.

Every collective records what the rank sent (`Sent`). The count is made from the buffers the
rank actually hands over and the size of the group it hands them to, with the ring formulas of
DESIGN section 3 (`cost.collective_bytes`): it does not trust the plan. The MPI library may move
the same data with another algorithm internally; mpi4py does not expose that.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from autostrat.cost import collective_bytes
from autostrat.errors import ConfigError

REDUCE_OPS = ("max", "min", "sum")


@dataclass(frozen=True)
class Sent:
    """One collective call of one rank: its kind, group size and the bytes the rank sent."""

    kind: str
    group_size: int
    bytes: int


class Backend(Protocol):
    """One rank's communication. Groups are tuples of global ranks, in chunk order."""

    rank: int
    device_num: int
    sent: list[Sent]

    def prepare(self, partitions) -> None:
        """Make one communicator per group of every partition (all ranks call it once, in order)."""

    def allgather(self, piece: np.ndarray, group: tuple[int, ...]) -> list[np.ndarray]:
        """Every member's piece, in group order."""

    def alltoall(self, blocks: list[np.ndarray], group: tuple[int, ...]) -> list[np.ndarray]:
        """Block i goes to member i; returns the block every member sent to this rank."""

    def allreduce(self, piece: np.ndarray, group: tuple[int, ...], op: str) -> np.ndarray:
        """The elementwise `op` ("sum", "max", "min") of every member's piece."""

    def reduce_scatter(self, blocks: list[np.ndarray], group: tuple[int, ...], op: str) -> np.ndarray:
        """The `op` over members of their block number (this rank's position in the group)."""

    def sendrecv(self, piece: np.ndarray, dest: int, source: int) -> np.ndarray:
        """Send `piece` to `dest` and receive a piece of the same shape from `source`."""

    def send(self, piece: np.ndarray, dest: int, tag: int) -> None:
        """Post `piece` to rank `dest` without waiting for it to be received (pipeline stages)."""

    def recv(self, shape: tuple[int, ...], dtype, source: int, tag: int) -> np.ndarray:
        """Wait for the piece rank `source` posted with `tag` (messages of one tag arrive in order)."""

    def complete_sends(self) -> None:
        """Wait until every posted piece has been taken (the end of a pipeline step)."""

    def gather_report(self, values: np.ndarray) -> list[np.ndarray] | None:
        """Rank 0 gets every rank's `values` (float64, same length everywhere); others get None.
        For the run report only: not counted as sent bytes."""


class CountingBackend:
    """Byte counting shared by the backends: `count` appends one `Sent` per collective."""

    rank: int
    device_num: int

    def __init__(self) -> None:
        self.sent: list[Sent] = []

    def count(self, kind: str, group_size: int, local_bytes: int) -> None:
        self.sent.append(Sent(kind, group_size, collective_bytes(kind, group_size, local_bytes)))

    def count_send(self, piece: np.ndarray) -> None:
        self.sent.append(Sent("Send", 2, piece.nbytes))

    def count_sendrecv(self, piece: np.ndarray, dest: int) -> None:
        self.sent.append(Sent("CollectivePermute", 2, 0 if dest == self.rank else piece.nbytes))


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


def stacked(blocks: list[np.ndarray]) -> np.ndarray:
    """Equally shaped blocks as one contiguous buffer, block i first along a new axis 0."""
    return np.ascontiguousarray(np.stack([np.asarray(block) for block in blocks]))
