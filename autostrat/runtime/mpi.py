"""MpiBackend: one real process per rank, collectives through mpi4py on numpy buffers.

Only the buffer (upper-case) methods are used: Allgather, Alltoall, Allreduce,
Reduce_scatter_block, Sendrecv, and Isend/Recv between pipeline stages, on contiguous numpy arrays, so nothing is pickled. mpi4py is
imported on first use, so `autostrat` imports without it; a missing MPI becomes a
`RuntimeBackendError` before any collective.
"""

from __future__ import annotations

import numpy as np

from autostrat.errors import RuntimeBackendError
from autostrat.runtime.backend import CountingBackend, stacked


def import_mpi():
    """The `mpi4py.MPI` module, or a `RuntimeBackendError` saying how to get it."""
    try:
        from mpi4py import MPI
    except ImportError as error:  # also an MPI library that fails to load
        raise RuntimeBackendError(
            f"the MPI backend needs mpi4py and an MPI library (pip install mpi4py mpich); import failed: {error}"
        ) from None
    return MPI


class MpiBackend(CountingBackend):
    """This process's rank of ``MPI.COMM_WORLD`` (see `backend.Backend`).

    Sub-communicators are made once per rank-group set (`prepare`) by ``Comm.Split`` with the
    member's position as key, so rank order inside a communicator is the group's chunk order.
    """

    def __init__(self, comm=None):
        super().__init__()
        self.MPI = import_mpi()
        self.comm = comm if comm is not None else self.MPI.COMM_WORLD
        self.rank, self.device_num = self.comm.Get_rank(), self.comm.Get_size()
        self._communicators: dict[tuple[int, ...], object] = {}
        self._prepared: set = set()
        self._ops = {"sum": self.MPI.SUM, "max": self.MPI.MAX, "min": self.MPI.MIN}
        self._posted: list = []  # pipeline sends not known to be received yet, with their buffers

    def prepare(self, partitions) -> None:
        if not hasattr(self, "_spare"):
            self._spare = self.comm.Dup()  # for `barrier_on_copy`; made by every rank together
        for partition in partitions:
            if partition in self._prepared:
                continue  # every rank skips the same partitions, so Splits stay matched
            color = next(index for index, group in enumerate(partition) if self.rank in group)
            group = partition[color]
            self._communicators[group] = self.comm.Split(color, group.index(self.rank))
            self._prepared.add(partition)

    def _communicator(self, group: tuple[int, ...]):
        if group not in self._communicators:
            raise RuntimeBackendError(f"rank {self.rank}: no communicator for group {group}; prepare() was not given it")
        return self._communicators[group]

    def allgather(self, piece, group):
        self.count("AllGather", len(group), piece.nbytes)
        received = np.empty((len(group),) + piece.shape, piece.dtype)
        self._communicator(group).Allgather(np.ascontiguousarray(piece), received)
        return list(received)

    def alltoall(self, blocks, group):
        send = stacked(blocks)
        self.count("AllToAll", len(group), send.nbytes)
        received = np.empty_like(send)
        self._communicator(group).Alltoall(send, received)
        return list(received)

    def allreduce(self, piece, group, op):
        self.count("AllReduce", len(group), piece.nbytes)
        result = np.empty_like(piece)
        self._communicator(group).Allreduce(np.ascontiguousarray(piece), result, op=self._ops[op])
        return result

    def reduce_scatter(self, blocks, group, op):
        send = stacked(blocks)
        self.count("ReduceScatter", len(group), send.nbytes)
        result = np.empty_like(send[0])
        self._communicator(group).Reduce_scatter_block(send, result, op=self._ops[op])
        return result

    def sendrecv(self, piece, dest, source):
        self.count_sendrecv(piece, dest)
        piece = np.ascontiguousarray(piece)
        if dest == self.rank and source == self.rank:
            return piece.copy()
        result = np.empty_like(piece)
        self.comm.Sendrecv(piece, dest, recvbuf=result, source=source)
        return result

    def send(self, piece, dest, tag):
        self.count_send(piece)
        piece = np.ascontiguousarray(piece)
        self._posted.append((self.comm.Isend(piece, dest, tag=tag), piece))  # the buffer lives until completed

    def recv(self, shape, dtype, source, tag):
        result = np.empty(shape, dtype)
        self.comm.Recv(result, source, tag=tag)
        return result

    def complete_sends(self) -> None:
        self.MPI.Request.Waitall([request for request, _ in self._posted])
        self._posted.clear()

    def gather_report(self, values):
        values = np.ascontiguousarray(values, np.float64)
        received = np.empty((self.device_num,) + values.shape, np.float64) if self.rank == 0 else None
        self.comm.Gather(values, received, root=0)
        return list(received) if self.rank == 0 else None

    def barrier_on_copy(self) -> None:
        """A barrier on a duplicate of the world communicator (fault tests: a rank entering it
        alone deadlocks, as a mismatched collective would)."""
        self._spare.Barrier()

    def abort(self, code: int = 1) -> None:
        """End every rank of the job now (MPI_Abort)."""
        self.comm.Abort(code)
