"""Issue #37: the predicted step time against the step time measured on this machine's MPI ranks.

1. Calibration (`calibration.py`, ~10 s): as many MPI ranks as this machine has cores each
   time a ring message of the runtime at five sizes and three chains of kernels run by the
   executor; the slowest rank's means give α, β, the memory bandwidth, the float32 FLOP rate
   and the fixed cost of an instruction (`kernel_latency`); then, in this process, every op of
   the shipped configs' graphs on one device gives its op type's passes over its bytes
   (`kernel_passes`). The profile also says how many cores the ranks share
   (`cores_per_server`, this machine's): ranks beyond them time-share the cores, and the model
   prices each rank on its share (`Hardware.shared`: every rate divided and every latency
   multiplied by ranks / cores), one profile for every rank count, rather than a calibration
   per rank count. It is written as a hardware YAML (``--profile FILE``), or read from one
   (``--hardware FILE``: no calibration).
2. Plans: the shipped configs × device counts 2, 4, 8 × seeds (the config's, scaled to the
   device count; none: the search decides; data parallel), each planned with ``hardware:`` the
   profile, predicted (`Plan.prediction.step_time_ns`, plus the assembling of the outputs for
   the check, which a run's step includes), then run on MPI ranks as ``autostrat run`` runs
   them (the job runner, checked against the reference) and measured as the runtime times it
   (`runtime.job.step_seconds`: the slowest rank's median step after the first, between two
   barriers), never with the cost model's code.
3. The table per plan, the mean absolute relative error (MARE), Kendall's τ of predicted
   against measured (scipy.stats.kendalltau), and the five worst plans.

Targets (issue #37): MARE <= 15 %, τ >= 0.8. The machine is shared (2 cores; other jobs run):
timings under load are rough, and the script prints the load average before and after.

Run: .venv/bin/python benchmarks/time_model.py [--quick] [--profile out.yaml | --hardware in.yaml]
(72 plans; --quick: 36, about 5 minutes on 2 cores)

Measured 2026-12-02 on the shared 2-core machine, never quiet (load averages 9-14 from other
jobs, so each process had a fraction of a core over any long step): 72 plans in 508 s, 70 run
(2 ended with mpiexec status 4 under load; both pass on local ranks), MARE 78.3 %, τ 0.754;
--quick (36 plans, 263 s) MARE 74.6 %, τ 0.803. Far from the targets, in three ways the worst
plans show: steps that communicate measure several times their prediction (each collective
waits for a partner that lost its core to another job: milliseconds, where the calibration's
exchanges, back to back, rarely met one); training steps measure 3-5 times theirs (the
calibration's kernels run in bursts shorter than a scheduler slice, at a whole core; a 100 ms
step gets the machine's share); and plans that never communicate ("none" forwards) measure
less than predicted at 4 and 8 ranks (nothing makes them wait for one another, so each rank's
short step runs within its own slice and the cores' sharing never shows). To be re-run on a
quiet machine, where the first two vanish.

Re-measured 2026-12-02 11:56 UTC on a quiet machine (load 0.0), --quick, 36 plans in 102 s:
MARE 60.2 %, τ 0.819, every large error measured >> predicted at 4 and 8 ranks (ffn.yaml 8
config 0.638 ms predicted, 23.64 ms measured). What the time went to: a waiting rank slept
(10 us doubling to 2 ms) between polls, so each message arrived and lay unread until the
timer fired; `runtime.mpi.Pause` now yields the core for a wait's first 5 ms, then sleeps.
ffn.yaml + mlp.yaml (18 plans, this profile, load 2.7, one run each): ffn 8 config 25.1 ->
4.6 ms, mlp 8 data 25.5 -> 5.5 ms, MARE 75.5 -> 58.7 %. Then all 72 plans at 13:00 UTC under
other jobs' load (1.9 before, 6.85 after; 338 s, 70 run: gpt_train 4 ranks and llama_train
2 ranks ended with mpiexec status 4): MARE 61.9 %, τ 0.750; its 35 quick plans MARE 72.5 %,
τ 0.825; gpt_train 8 none 709.9 -> 510.6 ms, transformer_stack 8 data 605.0 -> 499.0 ms even
so. Still far from the targets: the steps measure 3-4x their prediction at 2 ranks too under
that load (each rank had about a third of a core), and the small plans' collectives measure
several times the calibration's α (their per-step runtime work: the lowering's Python per
message, not priced).Then --quick at 13:09 UTC (load 3.57 before, 2.67 after; 36 plans, 113 s): MARE 64.6 %,
τ 0.848 (quiet, before: 60.2 %, 0.819); ffn 8 config 23.64 -> 5.77 ms, mlp 8 data 12.43 ->
3.65, gpt_train 8 none 709.9 -> 198.8, transformer_stack 8 data 605.0 -> 394.9. Worst five:
mlp 8 none +104 % (ranks that never wait for one another run in their own slices, not on
the quarter core `Hardware.shared` gives them), transformer_stack 8 data -91 %, 8 config
-89 %, ffn 8 config -88 %, gpt_train 8 config -83 % (8 ranks' collectives on 2 cores: each
message still waits for its partner's turn on a core, which the 4x α does not price).
Re-run quiet 2026-12-04 20:01 UTC (load 0.29 before, 3.46 after), --quick, 36 plans in 87 s:
MARE 53.4 %, τ 0.806 (τ's target met, MARE's not). Every 2-rank plan measures more than
predicted (-3.5 % to -67.5 %: ffn's 0.07 ms steps 0.11-0.23 ms), the communicating plans at 4
and 8 ranks 2-11 times their prediction (transformer_stack 8 data 31.2 -> 352.4 ms), and the
plans that never communicate less (mlp 8 none +113.6 %): the same three patterns, now without
other jobs' load. Per instruction (an ad-hoc timer on `on_instruction`, rank 0 of 2) the
executor spent 20-30 us on each whatever it did, most of it walking every array the rank holds
to sample its memory; kept as arrays come and go (`runtime.held_memory.HeldBlocks`) the same
peaks cost 2-5 us: gpt_train 2 config measures 21.09 -> 9.95 ms. Re-run so (20:25 UTC, load
1.2): MARE 50.8 %, τ 0.800; the larger 2-rank plans now measure less than predicted (gpt_train
+36.7 % to +53.7 %, transformer_stack +15.8 % to +34.6 %), the small ones still more (ffn
-48 % to -74 %): the calibration's kernel chains (kernel_latency 9.6 -> 6.0 us) no longer
carry what a program's instructions cost beside their kernels.
"""

from __future__ import annotations

import argparse
import json
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
_TIME = re.compile(r"time per (?:training|forward) step: ([0-9.]+) ms")


def calibration_rank(run_dir: Path) -> None:
    """One rank of the calibration run: `calibration.measure_rank`; rank 0 writes the slowest
    rank's medians."""
    from calibration import measure_rank

    from autostrat.runtime.mpi import MpiBackend
    from autostrat.runtime.rank import redirect_output

    backend = MpiBackend()
    redirect_output(run_dir, backend.rank)
    measured = measure_rank(backend)
    gathered = backend.gather_report(np.array(list(measured.values()), np.float64))
    if gathered is not None:
        slowest = {key: max(float(vector[i]) for vector in gathered) for i, key in enumerate(measured)}
        (run_dir / CALIBRATION_FILE).write_text(json.dumps(slowest))


def calibrate(path: Path) -> dict:
    """Calibrate on as many ranks as cores, write the profile YAML at `path`; its fields."""
    from calibration import fit_profile, kernel_passes
    from threadpoolctl import threadpool_limits

    cores = usable_cores()
    entry = (str(Path(__file__).resolve()), "--calibration-rank", "RUN_DIR")
    with mpi_run(max(2, cores), lambda folder: None, entry) as folder:
        measured = json.loads((folder / CALIBRATION_FILE).read_text())
    fields = fit_profile(measured) | {"devices_per_server": 8, "cores_per_server": cores}
    threadpool_limits(limits=1, user_api="blas")  # as each rank runs its kernels (`runtime.threads`)
    passes = kernel_passes([ROOT / "configs" / name for name in CONFIGS])
    lines = [f"# calibrated by benchmarks/time_model.py on {max(2, cores)} MPI ranks, {cores} cores, "
             f"load average {os.getloadavg()[0]:.2f}"]
    lines += [f"{key}: {value:.6g}" if isinstance(value, float) else f"{key}: {value}" for key, value in fields.items()]
    lines += ["kernel_passes:"] + [f"  {op_type}: {value:g}" for op_type, value in passes.items()]
    path.write_text("\n".join(lines) + "\n")
    return fields


def plan_job(config_name: str, device_num: int, seeds: str, hardware: Path, steps: int):
    """(predicted ns, job) of one plan: the config with `hardware`, on `device_num` devices."""
    overrides = {"hardware": str(hardware), "device_num": device_num}
    if seeds == "data":
        overrides["parallel_mode"] = "data_parallel"
    config = load_config(ROOT / "configs" / config_name, **overrides)
    if seeds != "config":
        config = replace(config, strategies={})
    with warnings.catch_warnings():  # no seed: every op keeps the all-ones strategy, as meant
        warnings.simplefilter("ignore")
        plan, _ = plan_config(config, device_num)
    return plan.prediction.step_time_ns + output_nanoseconds(plan), make_job(plan, steps, name=config_name), plan


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


def cases(quick: bool, only=None) -> list[tuple[str, int, str]]:
    configs = only or (QUICK_CONFIGS if quick else CONFIGS)
    return [(config, device_num, seeds) for config in configs for device_num in DEVICE_COUNTS for seeds in SEEDS]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="4 configs (36 plans)")
    parser.add_argument("--profile", default="/tmp/autostrat-calibrated.yaml", help="where the calibrated profile goes")
    parser.add_argument("--hardware", help="a profile YAML to use instead of calibrating")
    parser.add_argument("--steps", type=int, default=4, help="steps per run, the first a warm-up (default 4)")
    parser.add_argument("--bucket-bytes", type=int, default=16384, help="bucket size of the overlap table")
    parser.add_argument("--configs", nargs="+", help="these configs only (names under configs/)")
    parser.add_argument("--calibration-rank", metavar="RUN_DIR", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.calibration_rank:
        return calibration_rank(Path(args.calibration_rank))
    print(f"load average before: {' '.join(f'{v:.2f}' for v in os.getloadavg())}", flush=True)
    started = time.perf_counter()
    profile = Path(args.hardware or args.profile)
    if not args.hardware:
        fields = calibrate(profile)
        print(f"calibrated in {time.perf_counter() - started:.0f} s, {profile}:")
        print("\n".join(f"  {key}: {value:.4g}" for key, value in fields.items()), flush=True)
    rows, pairs, overlaps = [], [], []
    for config, device_num, seeds in cases(args.quick, args.configs):
        predicted_ns, job, plan = plan_job(config, device_num, seeds, profile, args.steps)
        if plan.graph.updates:  # a training step: it has a gradient synchronisation to overlap
            overlaps.append(overlap_row(f"{config} {device_num} {seeds}", plan, args.bucket_bytes))
        measured = measured_ms(job)
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
