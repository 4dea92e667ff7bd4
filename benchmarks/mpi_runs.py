"""What the benchmarks share to run something on MPI ranks: a fresh run directory, the
launcher (global time limit, rank processes watched and cleaned up), and a plain failure.

Used by `runtime.py` (the job runner, `autostrat.runtime.rank`) and `training.py` (its own
rank entry), both run as ``python benchmarks/<name>.py`` so this folder is on ``sys.path``.
"""

from __future__ import annotations

import contextlib
import io
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from autostrat.runtime.launcher import launch  # once the repository is on sys.path


@contextlib.contextmanager
def mpi_run(device_num: int, prepare, entry=None, timeout: float = 600.0):
    """Write the ranks' input with `prepare(run_dir)` (for the job runner, `job_file.save_job`,
    whose digest it returns), run `device_num` ranks (`entry`: what each runs after
    ``python -m mpi4py``, with RUN_DIR standing for the folder; default the job runner) and
    yield the folder to read their results from."""
    with tempfile.TemporaryDirectory(prefix="autostrat-bench-") as folder:
        digest = prepare(Path(folder))
        command = tuple(folder if part == "RUN_DIR" else part for part in entry) if entry else None
        with contextlib.redirect_stdout(io.StringIO()):  # rank 0's report: the caller reads its files
            result = launch(folder, device_num, timeout=timeout, entry=command, digest=None if entry else digest)
        if result.returncode:
            raise SystemExit(f"MPI run failed: {result.message}")
        yield Path(folder)
