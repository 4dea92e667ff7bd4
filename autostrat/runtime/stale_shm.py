"""MPICH's shared-memory segments left in ``/dev/shm`` by jobs that were killed, removed before
a job starts on this machine.

Each job's ranks share a POSIX segment named from the job's process-manager key
(``mpich_shm_<hash>_0``, about 2 MB for 2 ranks, 8 MB for 8), made at MPI_Init and removed at
MPI_Finalize; a job killed in between (a fault test, Ctrl-C, a stall, a timeout) leaves it
behind: 591 of them, 2.9 GB, had piled up here. Twice in full suite runs MPI_Init failed with
"Message from rank 3 and tag 7 truncated", which a job opening a dead job's segment under its
own name would explain (the key comes from the process manager, and process ids come round:
``kernel.pid_max`` is 32 768 here); that cause is inferred, not shown. Either way a segment no
process maps belongs to no live job, and removing it cannot disturb one.
"""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path

SHM = Path("/dev/shm")
PREFIX = "mpich_shm_"
SETTLING_SECONDS = 10.0  # a segment younger than this may be one a starting job has not mapped yet


def mapped_paths() -> set[str]:
    """Every file some process this user can see has mapped (from ``/proc/*/maps``)."""
    paths = set()
    for maps in Path("/proc").glob("[0-9]*/maps"):
        try:
            text = maps.read_text()
        except OSError:  # the process ended, or it is another user's
            continue
        paths.update(line.split(maxsplit=5)[5] for line in text.splitlines() if line.count(" ") >= 5 and "/" in line)
    return paths


def remove_stale_segments(folder: Path = SHM, now: float | None = None) -> list[str]:
    """Remove this user's MPICH segments in `folder` that no process maps and that are older than
    `SETTLING_SECONDS`; return their names. Nothing else is touched, and a segment that cannot
    be removed is left (the next job may still start: most names never come round).

    Example:
        >>> import tempfile
        >>> folder = Path(tempfile.mkdtemp())
        >>> (folder / "mpich_shm_dead_0").write_bytes(b"old"); os.utime(folder / "mpich_shm_dead_0", (0, 0))
        3
        >>> remove_stale_segments(folder), sorted(os.listdir(folder))
        (['mpich_shm_dead_0'], [])
    """
    now = time.time() if now is None else now
    try:
        candidates = [path for path in folder.iterdir() if path.name.startswith(PREFIX)]
    except OSError:  # no /dev/shm: nothing of MPICH's to find
        return []
    old = [path for path in candidates if _owned_and_older(path, now)]
    if not old:
        return []
    mapped = mapped_paths()
    removed = []
    for path in old:
        if str(path) not in mapped:
            try:
                path.unlink()
            except OSError:
                continue
            removed.append(path.name)
    return sorted(removed)


def _owned_and_older(path: Path, now: float) -> bool:
    try:
        status = path.lstat()
    except OSError:
        return False
    return stat.S_ISREG(status.st_mode) and status.st_uid == os.getuid() and now - status.st_mtime > SETTLING_SECONDS
