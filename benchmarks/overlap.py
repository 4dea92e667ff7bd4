"""Issue #37: gradient synchronisation overlapped with the backward, predicted and measured on MPI.

One data-parallel training plan (a shipped training config with ``parallel_mode:
data_parallel`` and no seeds) is planned twice on the calibrated profile of this machine
(`time_model.calibrate`, or ``--hardware FILE``): without buckets (every gradient AllReduced
after the backward) and with ``bucket_bytes`` (the AllReduces begun on the communication
stream as each bucket's gradients are final, progressed between the backward's kernels:
`runtime.stream`). Each is predicted (`Plan.prediction.step_time_ns`: with buckets the
two-stream schedule, `search.prediction.sync_schedule`, plus the outputs' assembling a run's
step includes) and run on MPI ranks by the job runner (checked against the reference and the
bytes, as ``autostrat run``), its step measured as the runtime times it (the slowest rank's
median step after the first). The two runs alternate, `--repeats` times, and the table gives
the median of each plan's measured steps, with the load average at each run: the machine is
shared, so a run under load says so, and the repeats show how much the figures move.

Run: .venv/bin/python benchmarks/overlap.py [--config transformer_stack.yaml] [--devices 4]
     [--bucket-bytes 32768] [--steps 8] [--repeats 5] [--hardware profile.yaml]

Measured 2026-12-02 on the shared 2-core machine, never quiet (other sessions' jobs; load
averages 6.5-11.5), transformer_stack.yaml data parallel, buckets of 32 KiB (15 buckets), 8
steps per run, 5 runs each: on 4 ranks the overlapped step measured 245.3 ms against 271.5 ms
(median; 0.903, faster in 4 of the 5 pairs), predicted 29.3 against 36.0 ms (0.813); on 8
ranks 563.4 against 638.4 ms (0.883, 3 of 5 pairs), predicted 89.3 against 106.8 ms (0.836).
Faster, as predicted; the absolute predictions are several times below the measured steps for
the reasons `time_model.py` gives (a loaded machine: each rank gets a fraction of a core), and
single runs of one plan range over a factor 2 under that load, hence the repeats.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import warnings
from dataclasses import replace
from pathlib import Path

from mpi_runs import ROOT  # first: it puts the repository on sys.path

from time_model import calibrate, measured_ms, output_nanoseconds  # noqa: E402

from autostrat.frontend.config import load_config  # noqa: E402
from autostrat.frontend.run import plan_config  # noqa: E402
from autostrat.runtime.job import make_job  # noqa: E402
from autostrat.search.prediction import sync_buckets  # noqa: E402
from autostrat.tables import format_table  # noqa: E402


def data_parallel_plan(config_name: str, device_num: int, hardware: Path, bucket_bytes: int):
    """The config's plan on `device_num` devices, data parallel, on `hardware`, with buckets."""
    config = load_config(ROOT / "configs" / config_name, hardware=str(hardware), device_num=device_num,
                         parallel_mode="data_parallel", bucket_bytes=bucket_bytes)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return plan_config(replace(config, strategies={}), device_num)[0]


def load() -> str:
    return " ".join(f"{value:.2f}" for value in os.getloadavg())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="transformer_stack.yaml", help="a training config under configs/")
    parser.add_argument("--devices", type=int, default=4, help="MPI ranks (default 4)")
    parser.add_argument("--bucket-bytes", type=int, default=32768, help="bucket size of the overlapped plan")
    parser.add_argument("--steps", type=int, default=8, help="steps per run, the first a warm-up (default 8)")
    parser.add_argument("--repeats", type=int, default=5, help="runs of each plan, alternating (default 5)")
    parser.add_argument("--profile", default="/tmp/autostrat-calibrated.yaml", help="where the calibrated profile goes")
    parser.add_argument("--hardware", help="a profile YAML to use instead of calibrating")
    args = parser.parse_args()
    print(f"load average before: {load()}", flush=True)
    profile = Path(args.hardware or args.profile)
    if not args.hardware:
        calibrate(profile)
        print(f"calibrated: {profile}", flush=True)
    plans = {size: data_parallel_plan(args.config, args.devices, profile, size) for size in (0, args.bucket_bytes)}
    measured: dict[int, list[float]] = {size: [] for size in plans}
    for repeat in range(args.repeats):
        for size, plan in plans.items():
            step = measured_ms(make_job(plan, args.steps, name=f"{args.config} buckets {size}"))
            if step is not None:
                measured[size].append(step)
            print(f"run {repeat + 1}, bucket_bytes {size}: {step} ms (load average {load()})", flush=True)
    rows = []
    for size, plan in plans.items():
        predicted = (plan.prediction.step_time_ns + output_nanoseconds(plan)) / 1e6
        buckets = len(sync_buckets(plan)) if size else 0
        median = statistics.median(measured[size]) if measured[size] else float("nan")
        rows.append([str(size), str(buckets), f"{plan.prediction.overlapped_ns / 1e6:.3f}", f"{predicted:.3f}",
                     f"{median:.3f}", " ".join(f"{value:.2f}" for value in measured[size])])
    print(f"\n{args.config}, data parallel on {args.devices} MPI ranks, {args.steps} steps per run, {args.repeats} runs each")
    print(format_table(["bucket_bytes", "buckets", "predicted hidden ms", "predicted ms", "measured median ms", "runs ms"], rows))
    serial, overlapped = (statistics.median(measured[size]) if measured[size] else float("nan") for size in plans)
    predicted = [(plan.prediction.step_time_ns + output_nanoseconds(plan)) / 1e6 for plan in plans.values()]
    print(f"overlapped / serial: predicted {predicted[1] / predicted[0]:.3f}, measured {overlapped / serial:.3f}; "
          f"load average after: {load()}")


if __name__ == "__main__":
    sys.exit(main())
