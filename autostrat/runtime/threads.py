"""The MPI ranks on one machine share its cores: each limits its BLAS threads to its share, and
ranks that outnumber the cores wait asleep rather than polling.

numpy's BLAS (OpenBLAS in the wheels) starts a thread per core in every process. Eight ranks on
a 2-core machine then run sixteen BLAS threads that spin while they wait for one another: the
MindSpore operator-parallel sample took 38 CPU-seconds on 8 ranks, 17.5 with one BLAS thread per
rank (the same run with ``OPENBLAS_NUM_THREADS=1``). As torchrun sets ``OMP_NUM_THREADS=1`` for
its workers, a rank limits its BLAS threads to this machine's cores divided among the ranks on
it (at least one), unless the user set a thread count (`THREAD_VARIABLES`): that choice is theirs.

How many ranks share this machine, the process manager says: ``MPI_LOCALNRANKS`` (MPICH's
hydra), ``OMPI_COMM_WORLD_LOCAL_SIZE`` (Open MPI), or the job's size ``PMI_SIZE`` where neither
is set (MPICH's gforker, which starts every rank on this machine).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import cache

THREAD_VARIABLES = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "BLIS_NUM_THREADS")
LOCAL_SIZE_VARIABLES = ("MPI_LOCALNRANKS", "OMPI_COMM_WORLD_LOCAL_SIZE", "PMI_SIZE")


@dataclass(frozen=True)
class CoreShare:
    """This rank's share of the machine: `threads` for its BLAS (None: left as they are) and
    whether the machine's ranks outnumber its cores (`crowded`)."""

    threads: int | None
    crowded: bool


def core_share(environ, cores: int) -> CoreShare:
    """`cores` divided among the ranks on this machine, as the process manager's variables in
    `environ` count them; threads None when the user set a thread count or no process manager
    says how many ranks share the machine.

    Example:
        >>> core_share({"PMI_SIZE": "8"}, cores=2), core_share({"MPI_LOCALNRANKS": "2", "PMI_SIZE": "16"}, cores=8)
        (CoreShare(threads=1, crowded=True), CoreShare(threads=4, crowded=False))
        >>> core_share({"PMI_SIZE": "8", "OMP_NUM_THREADS": "2"}, cores=2), core_share({}, cores=2)
        (CoreShare(threads=None, crowded=True), CoreShare(threads=None, crowded=False))
    """
    ranks = next((int(text) for text in map(environ.get, LOCAL_SIZE_VARIABLES) if text and text.isdigit() and int(text) > 0), None)
    if ranks is None:
        return CoreShare(None, False)
    user_set = any(variable in environ for variable in THREAD_VARIABLES)
    return CoreShare(None if user_set else max(1, cores // ranks), ranks > cores)


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask where the system has one, as on
    Linux; else every core of the machine).

    Example:
        >>> 1 <= usable_cores() <= (os.cpu_count() or 1)
        True
    """
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


@cache
def share_cores() -> CoreShare:
    """This process's `core_share`, with its BLAS threads limited to it (once per process)."""
    share = core_share(os.environ, usable_cores())
    if share.threads is not None:
        from threadpoolctl import threadpool_limits

        threadpool_limits(limits=share.threads, user_api="blas")
    return share
