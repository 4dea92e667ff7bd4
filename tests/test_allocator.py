"""An MPI rank keeps freed buffers for its next step (`runtime.allocator`): counted in page faults."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from autostrat.runtime.allocator import user_set

# Twenty steps, each filling four 2 MiB buffers and freeing them: the minor page faults they cost,
# in a new process (the thresholds are per process and set once). By default glibc hands the 8 MiB
# back to the system after each step (past its adapted trim threshold) and faults it in again.
_FAULTS = """
import resource, sys
import numpy as np
from autostrat.runtime.allocator import keep_freed_memory
kept = keep_freed_memory() if sys.argv[1] == "keep" else None
np.ones(1 << 18).sum()  # numpy's own first allocations, before counting
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(20):
    blocks = [np.ones(1 << 18) for _ in range(4)]
    del blocks
print(kept, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""
_GLIBC = (os.confstr("CS_GNU_LIBC_VERSION") or "").startswith("glibc") if hasattr(os, "confstr") else False


def _faults(mode: str, **environ) -> tuple[str, int]:
    env = {name: value for name, value in os.environ.items() if name != "GLIBC_TUNABLES" and not name.startswith("MALLOC_")}
    done = subprocess.run([sys.executable, "-c", _FAULTS, mode], capture_output=True, text=True, timeout=60,
                          env=env | environ, check=True)
    kept, faults = done.stdout.split()
    return kept, int(faults)


@pytest.mark.skipif(not _GLIBC, reason="the thresholds are glibc's")
def test_freed_buffers_are_reused_without_new_page_faults():
    kept, faults = _faults("keep")
    default, default_faults = _faults("default")
    assert kept == "True" and default == "None"
    assert faults < 3 * 4 * 512  # the first step's pages (4 x 512 of 4 KiB), then the same heap memory again
    assert default_faults > 10 * faults  # measured: 40 340 against 1 536


def test_a_users_malloc_settings_are_kept():
    assert _faults("keep", MALLOC_TRIM_THRESHOLD_="0")[0] == "False"
    assert _faults("keep", GLIBC_TUNABLES="glibc.malloc.mmap_threshold=131072")[0] == "False"
    assert user_set({"GLIBC_TUNABLES": "glibc.malloc.tcache_count=0:glibc.pthread.rseq=0"})
