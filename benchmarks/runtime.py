"""Time per forward step under MPI (8 ranks) against the single-process run, and bytes per rank.

    .venv/bin/python benchmarks/runtime.py [--steps 20] [--device-num 8]

For the tutorial FFN and the 2-layer GPT-style config, the job runs twice under mpiexec, with
mpich's heavy yield off and on (MPIR_CVAR_ENABLE_HEAVY_YIELD: a waiting rank gives its core
away), and once on LocalBackend threads. Times come from each run's report: per step, the
slowest rank's; single device is numpy on whole tensors in one process. Bytes are what each rank
sent per step, plan redistributions plus output assembly, all ranks being equal here.
"""

from __future__ import annotations

import argparse
import os
import re
import time

from mpi_runs import ROOT, mpi_run  # first: it puts the repository on sys.path

from autostrat.frontend.run import RunOptions, prepare_run
from autostrat.runtime.job_file import save_job
from autostrat.runtime.local import run_job_locally
from autostrat.tables import format_table

CONFIGS = (("FFN (tutorial)", "configs/ffn.yaml"), ("GPT 2 layers", "configs/gpt.yaml"))
_TIME = re.compile(r"time per forward step: ([0-9.]+) ms on \d+ ranks \([^)]*\), ([0-9.]+) ms single device")


def mpi_ms(job, heavy_yield: str) -> float:
    """Milliseconds per step of the slowest rank, from the MPI run's report."""
    os.environ["MPIR_CVAR_ENABLE_HEAVY_YIELD"] = heavy_yield
    with mpi_run(job.device_num, lambda folder: save_job(job, folder)) as folder:
        return float(_TIME.search((folder / "report.txt").read_text()).group(1))


def row(label: str, path: str, steps: int, device_num: int) -> list[str]:
    job, _, _ = prepare_run(ROOT / path, RunOptions(device_num=device_num, steps=steps))
    forward = sum(c.predicted for c in job.programs[0].communications() if c.phase == "forward")
    output = sum(c.predicted for c in job.programs[0].communications() if c.phase == "output")
    started = time.perf_counter()
    local = run_job_locally(job)
    local_ms = (time.perf_counter() - started) / steps * 1e3
    assert local.ok, local.text
    return [label, f"{job.single_seconds * 1e3:.2f}", f"{local_ms:.2f}", f"{mpi_ms(job, '0'):.2f}",
            f"{mpi_ms(job, '1'):.2f}", str(forward), str(output)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--device-num", type=int, default=8)
    args = parser.parse_args()
    headers = ["model", "single ms", "local threads ms", "MPI ms", "MPI heavy-yield ms", "forward B/rank", "output B/rank"]
    rows = [row(label, path, args.steps, args.device_num) for label, path in CONFIGS]
    print(f"{args.device_num} ranks on {os.cpu_count()} cores, {args.steps} forward steps, ms per step")
    print(format_table(headers, rows))


if __name__ == "__main__":
    main()
