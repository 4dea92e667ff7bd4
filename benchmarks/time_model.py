"""Issue #37: the predicted step time against the step time measured on this machine's MPI ranks.

1. Calibration (`calibration.py`, ~40 s): as many MPI ranks as this machine has cores, then 2
   and 4 times as many, each run through the executor (`calibration.measure_rank`): chains of
   kernels, of collectives (AllReduce and AllToAll at three sizes, their messages and bytes
   counted by the wire) and of a collective after a millisecond's MatMul, and the executor's
   own time per instruction in a training step. The first run gives α, β, `collective_latency`,
   the memory bandwidth, the float32 FLOP rate, `kernel_latency`, `collective_wait` and, per
   op type, its kernel's passes over its bytes (`kernel_passes`, timed on every rank at once);
   the crowded runs give one `Hardware.crowded` row each: how those figures change where ranks
   outnumber cores (8 ranks on 2 cores: a collective's message latency 10 times, its fixed
   cost 20 times, each collective waiting most of the compute before it while each rank gets
   its turn on a core). The profile is written as a hardware YAML (``--profile FILE``) or read
   from one (``--hardware FILE``: no calibration).
2. Plans: the shipped configs x device counts 2, 4, 8 x seeds (the config's, scaled to the
   device count; none: the search decides; data parallel), each planned with ``hardware:`` the
   profile, predicted (`Plan.prediction.step_time_ns`, plus the assembling of the outputs for
   the check, which a run's step includes), then run on MPI ranks as ``autostrat run`` runs
   them (the job runner, checked against the reference) and measured as the runtime times it
   (`runtime.job.job_step_seconds`: the median step after the first, from the first rank's
   start to the last rank's end; short steps run more steps, `steps_for`), never with the
   cost model's code.
3. The table per plan, the mean absolute relative error (MARE), Kendall's tau of predicted
   against measured (scipy.stats.kendalltau), and the five worst plans.

Targets (issue #37): MARE <= 15 %, tau >= 0.8. The machine is shared (2 cores; other jobs may
run): the script prints the load average before and after.

Run: .venv/bin/python benchmarks/time_model.py [--quick] [--profile out.yaml | --hardware in.yaml]
(72 plans; --quick: 36, about 2 minutes after the calibration)

Measured 2026-12-06 on the 2-core machine, nothing else running but these runs (load averages
0.8-5.6 from them), all 72 plans, each after its own calibration: MARE 13.5 %, tau 0.951; 22.1 %,
0.947 (a calibration whose crowded kernel slowdowns came out 2.61 and 5.19, against 2.07 and
4.05: the mean of the three chains then, their median since); 15.4 %, 0.945. --quick on the
first run's profile: 14.8 %, 0.946. tau's target met in every run; MARE's in one of three, the
others 0.4 and 7.1 points over. One run's measures of the same plans differ from the mean of
three by 8-9 % (tiny steps most); the worst plans are tiny ones at 4 and 8 ranks (ffn's 0.5-3 ms
steps, -40 to -65 %) and, over-predicted, the 4- and 8-rank training steps of some seeds
(+30 to +60 %): how long a crowded rank waits for its turn is the least stable figure.

What the earlier runs found, and what changed (2026-12-02 .. 12-06; figures in the closing notes
of issue #37): a waiting rank slept between polls (now it yields first, `runtime.mpi.Pause`);
the executor walked every held array per instruction (now `runtime.held_memory.HeldBlocks`);
the calibration's MatMul chain turned subnormal (a 20 times slower FLOP rate), its kernels'
passes were timed alone in a process (twice a busy rank's bandwidth), its collectives were
raw exchanges (a fifth of a collective instruction's time) and one crowding was scaled to all;
a rank in a blocking collective left its stream's buckets unmoved (8-rank steps of 400 ms where
100 were due: `settle`'s background); each rank timed its own step (ranks that never wait for
one another, each in its own turn on a core, timed a quarter of the job's step).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import statistics
import sys
import time
import warnings
from dataclasses import replace
from pathlib import Path

from mpi_runs import ROOT, mpi_run  # first: it puts the repository on sys.path

import numpy as np  # noqa: E402

from autostrat.frontend.config import load_config  # noqa: E402
from autostrat.frontend.run import plan_config  # noqa: E402
from autostrat.redistribution import plan_redistribution  # noqa: E402
from autostrat.runtime.job import make_job  # noqa: E402
from autostrat.runtime.job_file import save_job  # noqa: E402
from autostrat.runtime.program import replicated  # noqa: E402
from autostrat.runtime.threads import usable_cores  # noqa: E402
from autostrat.search.prediction import sync_schedule  # noqa: E402
from autostrat.tables import format_table  # noqa: E402

CONFIGS = ("ffn.yaml", "mlp.yaml", "resnet.yaml", "gpt.yaml", "gpt_train.yaml", "transformer_stack.yaml", "llama_train.yaml",
           "moe_train.yaml")
QUICK_CONFIGS = ("ffn.yaml", "mlp.yaml", "gpt_train.yaml", "transformer_stack.yaml")
SEEDS = ("config", "none", "data")  # the config's strategies, none, or parallel_mode data_parallel
DEVICE_COUNTS = (2, 4, 8)
CALIBRATION_FILE = "calibration.json"
SHORT_STEPS, MEASURED_SECONDS = 41, 0.1  # `steps_for`
_TIME = re.compile(r"time per (?:training|forward) step: ([0-9.]+) ms")


def calibration_rank(run_dir: Path, passes: bool) -> None:
    """One rank of a calibration run: `calibration.measure_rank`, and with `passes` the
    kernels' passes (`calibration.kernel_passes`) at the rank's own calibrated rates, timed on
    every rank at once as a plan's kernels run (a kernel alone in its process has the
    machine's memory bandwidth to itself); rank 0 writes the slowest rank's figures."""
    from calibration import fit_profile, kernel_passes, measure_rank
    from threadpoolctl import threadpool_limits

    from autostrat.runtime.mpi import MpiBackend
    from autostrat.runtime.rank import redirect_output

    backend = MpiBackend()
    redirect_output(run_dir, backend.rank)
    measured = measure_rank(backend)
    if passes:
        threadpool_limits(limits=1, user_api="blas")  # as each rank runs its kernels (`runtime.threads`)
        passes, rates = kernel_passes([ROOT / "configs" / name for name in CONFIGS], fit_profile(measured))
        measured |= {f"passes {op_type}": value for op_type, value in passes.items()}
        measured |= {f"rates {op_type}": value for op_type, value in rates.items()}
    gathered = backend.gather_report(np.array(list(measured.values()), np.float64))
    if gathered is not None:
        slowest = {key: max(float(vector[i]) for vector in gathered) for i, key in enumerate(measured)}
        (run_dir / CALIBRATION_FILE).write_text(json.dumps(slowest))


def calibration_run(ranks: int, passes: bool) -> dict:
    """The slowest rank's figures of a calibration run on `ranks` MPI ranks (`calibration_rank`)."""
    entry = (str(Path(__file__).resolve()), "--calibration-rank", "RUN_DIR") + (("--passes",) if passes else ())
    with mpi_run(ranks, lambda folder: None, entry) as folder:
        return json.loads((folder / CALIBRATION_FILE).read_text())


def calibrate(path: Path) -> dict:
    """Calibrate on as many ranks as cores, and on 2 and 4 times as many (the crowdings the
    plans run at, `Hardware.crowded`); write the profile YAML at `path`; its fields."""
    from calibration import crowded_row, fit_profile

    cores = usable_cores()
    measured = calibration_run(max(2, cores), passes=True)
    passes = {key.split(" ", 1)[1]: value for key, value in measured.items() if key.startswith("passes ")}
    rates = {key.split(" ", 1)[1]: value for key, value in measured.items() if key.startswith("rates ") and value > 1}
    fields = fit_profile(measured) | {"devices_per_server": 8, "cores_per_server": cores}
    crowded = [crowded_row(measured, calibration_run(cores * c, passes=False), c)
               for c in (2, 4) if cores * c <= max(DEVICE_COUNTS)]
    lines = [f"# calibrated by benchmarks/time_model.py on {max(2, cores)}, then {', '.join(str(int(cores * c)) for c, *_ in crowded)} "
             f"MPI ranks, {cores} cores, load average {os.getloadavg()[0]:.2f}"]
    lines += [f"{key}: {value:.6g}" if isinstance(value, float) else f"{key}: {value}" for key, value in fields.items()]
    lines += ["kernel_passes:"] + [f"  {op_type}: {max(0.01, round(value, 3)):g}" for op_type, value in passes.items()]
    lines += ["kernel_rates:"] + [f"  {op_type}: {value:.4g}" for op_type, value in rates.items()] if rates else []
    lines += ["crowded:  # ranks per core: [message latency s, message bandwidth B/s, kernel slowdown, collective latency s, "
              "collective wait, its most s]"]
    lines += [f"  {c:g}: [{latency:.6g}, {bandwidth:.6g}, {slowdown:.4g}, {fixed:.6g}, {wait:.4g}, {most:.6g}]"
              for c, latency, bandwidth, slowdown, fixed, wait, most in crowded]
    path.write_text("\n".join(lines) + "\n")
    return fields | {f"crowded {c:g}": f"{latency * 1e6:.1f} us, {bandwidth / 1e9:.3g} GB/s, kernels x{slowdown:.3g}, "
                                          f"collectives {fixed * 1e6:.1f} us, wait {wait:.3g} (at most {most * 1e3:.2f} ms)"
                     for c, latency, bandwidth, slowdown, fixed, wait, most in crowded}


def plan_job(config_name: str, device_num: int, seeds: str, hardware: Path, steps: int):
    """(predicted ns, job, plan) of one plan: the config with `hardware`, on `device_num`
    devices; the job runs at least `steps` steps, more for a short step (`steps_for`)."""
    overrides = {"hardware": str(hardware), "device_num": device_num}
    if seeds == "data":
        overrides["parallel_mode"] = "data_parallel"
    config = load_config(ROOT / "configs" / config_name, **overrides)
    if seeds != "config":
        config = replace(config, strategies={})
    with warnings.catch_warnings():  # no seed: every op keeps the all-ones strategy, as meant
        warnings.simplefilter("ignore")
        plan, _ = plan_config(config, device_num)
    predicted = plan.prediction.step_time_ns + output_nanoseconds(plan)
    return predicted, make_job(plan, steps_for(predicted, steps), name=config_name), plan


def steps_for(predicted_ns: int, steps: int) -> int:
    """Steps for a run whose step is predicted at `predicted_ns`: `steps`, or up to
    `SHORT_STEPS` so that the measured steps take about `MEASURED_SECONDS` in all: the median
    of three 0.2 ms steps moved by 50 % from run to run (a scheduler tick on one of them).

    Example:
        >>> steps_for(200_000, 6), steps_for(10_000_000, 6), steps_for(100_000_000, 6)
        (41, 11, 6)
    """
    return max(steps, min(SHORT_STEPS, 1 + math.ceil(MEASURED_SECONDS * 1e9 / max(predicted_ns, 1))))


def output_nanoseconds(plan) -> int:
    """The predicted time of assembling the graph outputs on every rank, which a run's step
    does after the plan's (for the check; `runtime.program`, phase "output"), priced as the
    plan's own redistributions are (`Plan.prediction`)."""
    model = plan.hardware.shared(plan.device_num).alpha_beta(plan.device_num)
    total = 0
    for tensor in plan.graph.outputs:
        layout = plan.layouts[tensor]
        if not layout.equivalent(replicated(layout)):
            total += plan_redistribution(layout, replicated(layout), plan.sizes.priced(tensor)).nanoseconds(model)
    return total


def measured_ms(job) -> float | None:
    """The job's step time as its MPI run reports it (`runtime.report`); None (and a line
    saying why) when the run failed or does not match its reference or bytes."""
    try:
        with mpi_run(job.device_num, lambda folder: save_job(job, folder)) as folder:
            report = (folder / "report.txt").read_text()
    except SystemExit as failure:
        print(f"{job.name} on {job.device_num} ranks: {failure}", flush=True)
        return None
    if "FAILED" in report or "MISMATCH" in report:
        print(f"{job.name} on {job.device_num} ranks: the run does not match the reference or its bytes", flush=True)
        return None
    return float(_TIME.search(report).group(1))


def median_ms(runs: list) -> float | None:
    """The median of a plan's runs' step times (None when any run failed): one run's measures
    of the same plans differ from the mean of three by 8-9 %, a sub-millisecond step's by up
    to a factor 2.5 (a scheduler tick in the wrong place), which a median of three leaves out.

    Example:
        >>> median_ms([1.0, 2.5, 1.1]), median_ms([1.0, None])
        (1.1, None)
    """
    return None if None in runs else statistics.median(runs)


def cases(quick: bool, only=None) -> list[tuple[str, int, str]]:
    configs = only or (QUICK_CONFIGS if quick else CONFIGS)
    return [(config, device_num, seeds) for config in configs for device_num in DEVICE_COUNTS for seeds in SEEDS]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="4 configs (36 plans)")
    parser.add_argument("--profile", default="/tmp/autostrat-calibrated.yaml", help="where the calibrated profile goes")
    parser.add_argument("--hardware", help="a profile YAML to use instead of calibrating")
    parser.add_argument("--steps", type=int, default=6, help="steps per run at least, the first a warm-up (default 6; "
                                                             "short steps run more: `steps_for`)")
    parser.add_argument("--bucket-bytes", type=int, default=16384, help="bucket size of the overlap table")
    parser.add_argument("--configs", nargs="+", help="these configs only (names under configs/)")
    parser.add_argument("--runs", type=int, default=3, help="MPI runs per plan, their median measured (default 3)")
    parser.add_argument("--calibration-rank", metavar="RUN_DIR", help=argparse.SUPPRESS)
    parser.add_argument("--passes", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.calibration_rank:
        return calibration_rank(Path(args.calibration_rank), args.passes)
    print(f"load average before: {' '.join(f'{v:.2f}' for v in os.getloadavg())}", flush=True)
    started = time.perf_counter()
    profile = Path(args.hardware or args.profile)
    if not args.hardware:
        fields = calibrate(profile)
        print(f"calibrated in {time.perf_counter() - started:.0f} s, {profile}:")
        print("\n".join(f"  {key}: {value:.4g}" if isinstance(value, float) else f"  {key}: {value}" for key, value in fields.items()),
              flush=True)
    rows, pairs, overlaps = [], [], []
    for config, device_num, seeds in cases(args.quick, args.configs):
        predicted_ns, job, plan = plan_job(config, device_num, seeds, profile, args.steps)
        if plan.graph.updates:  # a training step: it has a gradient synchronisation to overlap
            overlaps.append(overlap_row(f"{config} {device_num} {seeds}", plan, args.bucket_bytes))
        measured = median_ms([measured_ms(job) for _ in range(args.runs)])
        if measured is None:
            continue
        predicted = predicted_ns / 1e6
        pairs.append((predicted, measured, f"{config} {device_num} {seeds}"))
        rows.append([config, str(device_num), seeds, f"{predicted:.3f}", f"{measured:.3f}", f"{predicted / measured - 1:+.1%}"])
        print(" | ".join(rows[-1]), flush=True)
    report(rows, pairs)
    print(f"\ngradient synchronisation overlapped with the backward in buckets of {args.bucket_bytes} bytes "
          f"(`search.prediction.sync_schedule`), predicted for every training plan; a config's bucket_bytes runs it "
          f"(transformer_stack.yaml's; benchmarks/overlap.py measures it)")
    print(format_table(["plan", "backward + sync ms", "overlapped ms", "buckets", "step saved"], overlaps))
    print(f"total {time.perf_counter() - started:.0f} s; load average after: {' '.join(f'{v:.2f}' for v in os.getloadavg())}")


def overlap_row(label: str, plan, bucket_bytes: int) -> list[str]:
    """The predicted backward with its synchronisation, serial and overlapped in buckets."""
    serial, overlapped = sync_schedule(plan, plan.hardware, 0), sync_schedule(plan, plan.hardware, bucket_bytes)
    saved = (serial.end_ns - overlapped.end_ns) / max(plan.prediction.step_time_ns + plan.prediction.overlapped_ns, 1)
    return [label, f"{serial.end_ns / 1e6:.3f}", f"{overlapped.end_ns / 1e6:.3f}", str(len(overlapped.buckets)), f"{saved:.1%}"]


def report(rows: list, pairs: list) -> None:
    """The table, the MARE, Kendall's τ and the five worst plans."""
    from scipy.stats import kendalltau

    print(format_table(["config", "devices", "seeds", "predicted ms", "measured ms", "error"], rows))
    errors = [abs(p / m - 1) for p, m, _ in pairs]
    tau = kendalltau([p for p, _, _ in pairs], [m for _, m, _ in pairs]).statistic
    print(f"{len(pairs)} plans: mean absolute relative error {statistics.mean(errors):.1%} (target <= 15 %), "
          f"Kendall's tau {tau:.3f} (target >= 0.8)")
    worst = sorted(range(len(pairs)), key=lambda i: -errors[i])[:5]
    print("worst five: " + "; ".join(f"{pairs[i][2]} {pairs[i][0] / pairs[i][1] - 1:+.1%}" for i in worst))


if __name__ == "__main__":
    sys.exit(main())
