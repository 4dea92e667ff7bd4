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

Run: .venv/bin/python benchmarks/overlap.py [--alternate] [--config transformer_stack.yaml]
     [--devices 4] [--bucket-bytes 32768] [--steps 8] [--repeats 5] [--hardware profile.yaml]

``--alternate`` runs both plans in each job instead, a step of each in turn from the same
parameters, so that both meet the same load: the table gives per job the median of each plan's
steps after the first (the slowest rank's), their ratio, and the seconds each spent in the
synchronisation the backward did not hide (the blocking "sync" steps, or the stream's waits),
and checks that their losses agree bit for bit.

Measured 2026-12-02 on the shared 2-core machine, never quiet (other sessions' jobs),
transformer_stack.yaml data parallel, buckets of 32 KiB (15 buckets), ``--alternate
--repeats 3 --steps 10``: on 4 ranks (load average 4.3-4.8) the bucketed step measured 0.600,
0.636 and 0.635 of the serial one (156.7-175.1 ms against 246.9-292.1 ms; its sync waits
50-62 ms against 175-206 ms), predicted 0.825 (42.8 against 51.9 ms), and repeated (load
average 4.0-4.7) 0.762, 0.664 and 0.721; on 8 ranks (load
average 4.8-7.4) 0.961, 0.968 and 0.908 (778-803 ms against 813-856 ms; waits 478-526 ms
against 601-644 ms), predicted 0.849. Faster in every job, as predicted; the serial
synchronisation measures several times its prediction (each message waits for a partner that
lost its core: milliseconds), which the stream partly hides, more on 4 ranks than on 8 (each of
8 ranks on 2 cores polls its stream less often). Separate jobs of each plan (without
``--alternate``) measured 0.66-1.06 under load averages 6.5-11.7, single jobs of one plan
ranging over a factor 2: the alternated jobs are the measurement. With one edge at a time on
the stream (before its lanes) the ratio was 1.00-1.08: one collective's ring, step by step,
advanced 11 messages during the backward where 16 lanes advance 42-109 (of 204).

Fused buckets (`search.fusion`: a bucket's AllReduces over one group run as one), the same
calibrated profile, ``--alternate --repeats 3 --steps 10`` on 4 ranks, the code before fusing
(a copy of its commit) and after, one right after the other. Buckets of 32 KiB (15 buckets; 32
edges run as 15 collectives, 8 of them fused): bucketed / serial 0.758 (0.677-0.862, load
average 3.6-5.4) before, 0.716 (0.713-0.825, load 6.2-6.9) after, predicted 0.938 and 0.935 (the
profile prices the 32 edges' sync at 4.8 ms against a 25.4 ms backward: hidden either way). One
bucket of 1 MiB, which overlaps nothing (its last gradient is the backward's last), so fusing
alone: 0.611 (0.569-0.652, load 5.5-5.7) before, its 32 edges on the stream's lanes, 0.470
(0.402-0.536, load 5.6-5.7) after, as 2 collectives (31 edges fused, and the AllGather of
one); the stream's waits 36-40 ms before, 15-18 ms after; predicted 1.000 and 0.957. Losses
equal bit for bit in every job. Fusing measures faster, as predicted, by more than predicted:
each message saved is a partner's wait for a core here, not the calibrated α.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import warnings
from dataclasses import replace
from pathlib import Path

from mpi_runs import ROOT, mpi_run  # first: it puts the repository on sys.path

import numpy as np  # noqa: E402
from time_model import calibrate, measured_ms, output_nanoseconds  # noqa: E402

from autostrat.frontend.config import load_config  # noqa: E402
from autostrat.frontend.run import plan_config  # noqa: E402
from autostrat.runtime.job import make_job  # noqa: E402
from autostrat.runtime.job_file import load_job, save_job  # noqa: E402
from autostrat.search.prediction import sync_buckets  # noqa: E402
from autostrat.tables import format_table  # noqa: E402


def data_parallel_plan(config_name: str, device_num: int, hardware: Path, bucket_bytes: int):
    """The config's plan on `device_num` devices, data parallel, on `hardware`, with buckets."""
    config = load_config(ROOT / "configs" / config_name, hardware=str(hardware), device_num=device_num,
                         parallel_mode="data_parallel", bucket_bytes=bucket_bytes)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return plan_config(replace(config, strategies={}), device_num)[0]


ALTERNATED = "alternated.json"


def alternated_rank(run_dir: Path) -> None:
    """One rank of the alternated run: the two jobs saved under RUN_DIR/serial and
    RUN_DIR/bucketed, from the same parameters (the serial job's: each plan was traced with
    weights of its own), one step of each in turn (which goes first alternates), each step timed
    from a barrier as the runtime times its steps (`runtime.job`); rank 0 writes the slowest
    rank's seconds per step of each, and whether their losses agreed bit for bit."""
    from autostrat.runtime.executor import execute
    from autostrat.runtime.mpi import MpiBackend
    from autostrat.runtime.rank import redirect_output

    backend = MpiBackend()
    redirect_output(run_dir, backend.rank)
    jobs = [load_job(run_dir / name, (run_dir / name / "digest").read_text(), backend.rank) for name in ("serial", "bucketed")]
    resident, seconds, waited, agreed = [None, None], [[], []], [[], []], True
    for step, batch in enumerate(jobs[0].batches):
        losses = [None, None]
        for which in ((0, 1) if step % 2 == 0 else (1, 0)):
            program, marks = jobs[which].programs[backend.rank], []
            backend.barrier()
            started = time.perf_counter()
            result = execute(program, backend, jobs[0].values | batch, lambda index, _: marks.append(time.perf_counter()),
                             resident[which])  # one start for both
            seconds[which].append(time.perf_counter() - started)
            waited[which].append(sync_seconds(program, marks + [started + seconds[which][-1]]))
            resident[which], losses[which] = result.updated, result.outputs[program.outputs[0][0]]
        agreed &= bool(np.array_equal(losses[0], losses[1]))
    gathered = backend.gather_report(np.array(seconds[0] + seconds[1] + waited[0] + waited[1] + [float(agreed)], np.float64))
    if gathered is not None:
        slowest, steps = np.max(np.stack(gathered), axis=0), len(seconds[0])
        parts = [slowest[k * steps:(k + 1) * steps].tolist() for k in range(4)]
        record = dict(zip(("serial", "bucketed", "serial_sync", "bucketed_sync"), parts))
        (run_dir / ALTERNATED).write_text(json.dumps(record | {"agreed": bool(min(vector[-1] for vector in gathered))}))


def sync_seconds(program, marks: list[float]) -> float:
    """Seconds the rank spent in the step's synchronisation instructions that the backward does
    not hide: the blocking "sync" steps, or the stream's waits (`marks`: each instruction's
    start, then the step's end)."""
    from autostrat.runtime.instructions import Communicate
    from autostrat.runtime.stream import SyncWait

    return sum(marks[i + 1] - marks[i] for i, instruction in enumerate(program.instructions)
               if isinstance(instruction, SyncWait) or (isinstance(instruction, Communicate) and instruction.phase == "sync"))


def alternated(jobs: tuple) -> dict:
    """The alternated run of the two jobs, serial and bucketed (`alternated_rank`), on their ranks."""
    def prepare(folder: Path) -> None:
        for name, job in zip(("serial", "bucketed"), jobs):
            (folder / name).mkdir()
            (folder / name / "digest").write_text(save_job(job, folder / name))

    entry = (str(Path(__file__).resolve()), "--alternated-rank", "RUN_DIR")
    with mpi_run(jobs[0].device_num, prepare, entry) as folder:
        return json.loads((folder / ALTERNATED).read_text())


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
    parser.add_argument("--alternate", action="store_true",
                        help="run both plans in each job, a step of each in turn (both under the same load)")
    parser.add_argument("--alternated-rank", metavar="RUN_DIR", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.alternated_rank:
        return alternated_rank(Path(args.alternated_rank))
    print(f"load average before: {load()}", flush=True)
    profile = Path(args.hardware or args.profile)
    if not args.hardware:
        calibrate(profile)
        print(f"calibrated: {profile}", flush=True)
    plans = {size: data_parallel_plan(args.config, args.devices, profile, size) for size in (0, args.bucket_bytes)}
    predicted = {size: (plan.prediction.step_time_ns + output_nanoseconds(plan)) / 1e6 for size, plan in plans.items()}
    print(format_table(["bucket_bytes", "buckets", "predicted hidden ms", "predicted ms"],
                       [[str(size), str(len(sync_buckets(plan)) if size else 0), f"{plan.prediction.overlapped_ns / 1e6:.3f}",
                         f"{predicted[size]:.3f}"] for size, plan in plans.items()]))
    print(f"predicted bucketed / serial: {predicted[args.bucket_bytes] / predicted[0]:.3f}", flush=True)
    if args.alternate:
        return print_alternated(plans, args)
    separate_runs(plans, args)


def separate_runs(plans: dict, args) -> None:
    """Each plan in jobs of its own, alternating, `args.repeats` each: the median of their steps."""
    measured: dict[int, list[float]] = {size: [] for size in plans}
    for repeat in range(args.repeats):
        for size, plan in plans.items():
            step = measured_ms(make_job(plan, args.steps, name=f"{args.config} buckets {size}"))
            if step is not None:
                measured[size].append(step)
            print(f"run {repeat + 1}, bucket_bytes {size}: {step} ms (load average {load()})", flush=True)
    rows = [[str(size), f"{statistics.median(runs):.3f}" if runs else "-", " ".join(f"{value:.2f}" for value in runs)]
            for size, runs in measured.items()]
    print(f"\n{args.config}, data parallel on {args.devices} MPI ranks, {args.steps} steps per run, {args.repeats} runs each")
    print(format_table(["bucket_bytes", "measured median ms", "runs ms"], rows))
    serial, overlapped = (statistics.median(runs) if runs else float("nan") for runs in measured.values())
    print(f"measured bucketed / serial: {overlapped / serial:.3f}; load average after: {load()}")


def print_alternated(plans: dict, args) -> None:
    """Both plans in one job, a step of each in turn, `args.repeats` jobs: per job the median of
    each plan's steps after the first (the slowest rank's), and their ratio."""
    rows, ratios = [], []
    jobs = tuple(make_job(plan, args.steps, name=name) for name, plan in zip(("serial", "bucketed"), plans.values()))
    for repeat in range(args.repeats):
        record = alternated(jobs)
        serial, bucketed, serial_sync, bucketed_sync = (statistics.median(record[key][1:]) * 1e3 for key in
                                                        ("serial", "bucketed", "serial_sync", "bucketed_sync"))
        ratios.append(bucketed / serial)
        rows.append([str(repeat + 1), f"{serial:.3f}", f"{bucketed:.3f}", f"{bucketed / serial:.3f}", f"{serial_sync:.3f}",
                     f"{bucketed_sync:.3f}", "yes" if record["agreed"] else "NO", load()])
        print(" | ".join(rows[-1]), flush=True)
    print(f"\nalternated in one job ({args.steps} steps of each per job, a step of each in turn, losses compared bit for bit)")
    print(format_table(["job", "serial median ms", "bucketed median ms", "bucketed / serial", "serial sync ms",
                        "bucketed sync waits ms", "same losses", "load average"], rows))
    print(f"median ratio {statistics.median(ratios):.3f} over {len(ratios)} jobs; load average after: {load()}")


if __name__ == "__main__":
    sys.exit(main())
