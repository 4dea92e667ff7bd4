"""An MPI rank keeps the memory it frees for its next step instead of handing it back to the system.

glibc's malloc serves every block of 128 KiB or more (its default ``M_MMAP_THRESHOLD``) with a
fresh mapping and unmaps it when freed, so each step's transfer buffers and activations of that
size come back as new pages that the kernel faults in again. On 8 MPI ranks of a 2-core machine
the MindSpore optimizer-parallel sample took 1.8 million page faults and 8.5 s of its 21.4
CPU-seconds in the kernel; served from the heap, which keeps what it frees up to
`TRIM_THRESHOLD`, it took 0.22 million faults and 16.0 CPU-seconds (``perf stat``, two runs each,
``GLIBC_TUNABLES`` set to the values below). A user's own malloc settings stay (`MALLOC_VARIABLES`).
"""

from __future__ import annotations

import ctypes
import os
from functools import cache

# mallopt's parameter numbers in glibc's <malloc.h>.
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
# The largest mmap threshold glibc accepts on 64-bit systems (``HEAP_MAX_SIZE / 2``): blocks
# below it come from the heap. Above it a buffer is large enough that faulting it in is cheap
# next to filling it.
MMAP_THRESHOLD = 32 * 1024 * 1024
TRIM_THRESHOLD = 128 * 1024 * 1024  # free memory the heap keeps at its top before returning it
MALLOC_VARIABLES = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_")


def user_set(environ) -> bool:
    """Whether `environ` sets glibc's malloc thresholds: then they are the user's to keep.

    Example:
        >>> user_set({"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=0"}), user_set({"MALLOC_TRIM_THRESHOLD_": "0"})
        (True, True)
        >>> user_set({"GLIBC_TUNABLES": "glibc.pthread.rseq=0"}), user_set({})
        (False, False)
    """
    return any(name in environ for name in MALLOC_VARIABLES) or "glibc.malloc." in environ.get("GLIBC_TUNABLES", "")


@cache
def keep_freed_memory() -> bool:
    """Serve blocks below `MMAP_THRESHOLD` from the heap and keep up to `TRIM_THRESHOLD` of freed
    memory (once per process); False where the C library is not glibc or the user set its
    thresholds. The measured peaks do not change: they count numpy's live allocations
    (`held_memory`), not the process's pages.

    Example:
        >>> keep_freed_memory() in (True, False)
        True
    """
    if user_set(os.environ) or not _glibc():
        return False
    mallopt = ctypes.CDLL(None).mallopt
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))


def _glibc() -> bool:
    try:
        return (os.confstr("CS_GNU_LIBC_VERSION") or "").startswith("glibc")
    except (ValueError, OSError, AttributeError):  # no such name on this system, or no confstr
        return False
