"""Issues #17 and #34: pipeline stages on the LLaMA-7B shape, the stage split searched; every
schedule run on MPI ranks.

The pipeline rows of `benchmarks/quality.py` alone; its docstring says what each row and column
means and why ``m = 8 S`` micro-batches. With ``--schedules``: each pipeline schedule on 4
stages x 8 micro-batches on 4 MPI ranks, its measured bubble against the closed form, its peak
memory per rank measured against predicted, and its equality with one device
(`benchmarks/schedule_runs.py` says what each column means).

Run: .venv/bin/python benchmarks/pipeline.py [--devices 64 1024] [--stages 2 4 8] [--budget 80GB] [--refined]
(the same as .venv/bin/python benchmarks/quality.py --pipeline 64 1024 ...)
or:  .venv/bin/python benchmarks/pipeline.py --schedules [--steps 6]
"""

from __future__ import annotations

import argparse
import subprocess
import sys

from quality import add_pipeline_options, print_pipeline  # the script's directory is on sys.path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, nargs="+", default=[64, 1024])
    add_pipeline_options(parser)
    parser.add_argument("--schedules", action="store_true", help="run every pipeline schedule on 4 MPI ranks instead")
    parser.add_argument("--steps", type=int, default=6, help="training steps per schedule, the first a warm-up (with --schedules)")
    args = parser.parse_args()
    if not args.schedules:
        print_pipeline(args.devices, args)
        return 0
    from autostrat.frontend.world import launched_by_mpiexec
    from autostrat.runtime.launcher import find_mpiexec

    import schedule_runs

    if launched_by_mpiexec():
        return schedule_runs.main(args.steps)
    command = [str(find_mpiexec()), "-n", str(schedule_runs.RANKS), sys.executable, __file__, "--schedules",
               "--steps", str(args.steps)]
    return subprocess.run(command, check=False).returncode  # the ranks print the table


if __name__ == "__main__":
    sys.exit(main())
