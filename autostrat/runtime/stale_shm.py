"""MPICH's start-up segments left in ``/dev/shm`` by jobs that were killed, removed before a job
starts on this machine.

MPICH's ranks meet at start-up in a POSIX shared-memory segment named from the job's process
manager key (``mpich_shm_<hash>_0``); the first rank creates it, the others open it, and the
last one removes it once every rank is in. A job killed before that (a rank killed, a launcher
stopped by Ctrl-C or a stall) leaves its segment behind. gforker's key follows mpiexec's process
id, and process ids come round again (``kernel.pid_max`` is 32 768 here), so a later job can
find a dead job's segment under its own name, open it instead of creating it, and read the dead
job's bytes: MPI_Init then fails with "Message from rank 3 and tag 7 truncated" (twice in the
suite's runs, with 591 such segments, 2.9 GB, in /dev/shm). A segment no process maps belongs
to no live job; removing it cannot disturb one.
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
