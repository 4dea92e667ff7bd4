"""The world a script runs in, MindSpore's `init`, `get_rank` and `get_group_size`.

Under mpiexec the world is the MPI job: mpich's process manager tells every process its rank
and the job's size (``PMI_RANK``, ``PMI_SIZE``) without MPI being loaded. Run alone, the ranks
are threads of this process and the world has ``RANK_SIZE`` of them (the variable MindSpore's
launch scripts set), or the context's `device_num` when it is not set.
"""

from __future__ import annotations

import atexit
import os
from functools import cache

from autostrat.errors import ConfigError
from autostrat.frontend.context import current_context, set_auto_parallel_context


@cache
def _mpi_world():
    from autostrat.runtime.mpi import MpiBackend

    return MpiBackend()


def world_backend():
    """This process's MPI backend under mpiexec (made once per process and shared), else None:
    the ranks then run as threads."""
    return _mpi_world() if launched_by_mpiexec() else None


CHECK_VARIABLE = "AUTOSTRAT_CHECK"  # "1": every Model.train and value_and_grad call is checked against one device


def checking() -> bool:
    """Whether this process checks its runs against one device (``AUTOSTRAT_CHECK=1``, as
    `sample_code/mindspore_tutorial/run.sh` sets it for MindSpore scripts run unchanged)."""
    return os.environ.get(CHECK_VARIABLE) == "1"


def launched_by_mpiexec() -> bool:
    """True in a process that mpiexec started (mpich's process manager sets PMI_RANK)."""
    return "PMI_RANK" in os.environ or "OMPI_COMM_WORLD_RANK" in os.environ


def _count(variable: str) -> int | None:
    """The positive integer in environment `variable`, None when unset."""
    text = os.environ.get(variable)
    if text is None:
        return None
    if not text.strip().isdigit() or int(text) < 1:
        raise ConfigError(f"environment variable {variable} must be a positive number of ranks, got {text!r}")
    return int(text)


def get_group_size() -> int:
    """The number of ranks of this job: the MPI world size under mpiexec, else ``RANK_SIZE``,
    else the context's `device_num`.

    Example:
        >>> os.environ["RANK_SIZE"] = "4"; get_group_size()
        4
        >>> del os.environ["RANK_SIZE"]
    """
    if launched_by_mpiexec():
        size = _count("PMI_SIZE") or _count("OMPI_COMM_WORLD_SIZE")
        rank_size = _count("RANK_SIZE")
        if size and rank_size and size != rank_size:
            raise ConfigError(f"RANK_SIZE is {rank_size} but mpiexec started {size} ranks: unset RANK_SIZE or make them equal")
        if size:
            return size
    return _count("RANK_SIZE") or current_context().device_num


def get_rank() -> int:
    """This process's rank under mpiexec; 0 in a process that runs every rank as a thread."""
    if launched_by_mpiexec():
        return int(os.environ.get("PMI_RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "0")))
    return 0


def init(backend_name: str | None = None) -> None:
    """MindSpore's ``init()``: join the world; the context's `device_num` becomes its size and
    `global_rank` this process's rank, so a script plans for the world it runs in.
    `backend_name` (MindSpore's "hccl"/"nccl") is accepted and ignored: the runtime is MPI.

    Example:
        >>> from autostrat import get_auto_parallel_context, reset_auto_parallel_context
        >>> os.environ["RANK_SIZE"] = "2"; init(); del os.environ["RANK_SIZE"]
        >>> get_auto_parallel_context("device_num")
        2
        >>> reset_auto_parallel_context()
    """
    size = get_group_size()
    set_auto_parallel_context(device_num=size, global_rank=get_rank())


class CheckTally:
    """The checks against one device of one path of a script (`checking`): how many, the
    largest error and a `note`, reported in `line(tally)` when the process exits, by rank 0
    (the rank that checks). The exit hook is registered at the first check.

    Example:
        >>> tally = CheckTally(lambda t: f"{t.count} call(s), max error {t.error:g}")
        >>> tally.add(1e-7); tally.add(3e-7); tally.line(tally)
        '2 call(s), max error 3e-07'
    """

    def __init__(self, line):
        self.line = line
        self.count, self.error, self.note = 0, 0.0, ""

    def add(self, error: float, note: str = "") -> None:
        if self.count == 0:
            atexit.register(self._report)
        self.count, self.error, self.note = self.count + 1, max(self.error, error), note or self.note

    def _report(self) -> None:
        if get_rank() == 0:
            print(self.line(self), flush=True)
