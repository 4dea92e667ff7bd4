"""Issue #15, item 5: CP-SAT refinement of a training step under a memory budget.

The GPT-style stack of solver_scale.py (hidden 1024, seq 128, batch 16, 16 heads, vocab 32768)
as a training step (`build_training`, Adam) on 8 devices, with 8, 32 and 96 blocks:

- budget: the per-device peak of Megatron-LM's plan (`megatron_seeds` on every block, tensor
  parallel over the 8 devices, propagated by BFS), as `max_device_memory`;
- the problem refined: Megatron's seeds on block 0 only, the rest free (sharding_propagation);
- starts: the BFS plan and the data-parallel plan around the seeds (what `search` passes);
- refined at coarsening --levels (default "layers": repeated layers share variables).

Every case runs in its own process (its peak RSS is its own: ru_maxrss of the reaped child) and
is killed after --timeout seconds. Columns: blocks; coarsening level; budget; bytes and peak per
device of each start; status, objective, bound and gap of the refinement; refine seconds
(wall-clock, the solver's time limit included) and the CPU seconds the refinement used (the
machine may be shared: wall-clock stretches with its load, CPU time much less so); peak RSS of
the case's process in MB; the 1-minute load average when the case started; whether the plan
fits the budget. Targets of the issue: gap 0 within 30 s and 500 MB for 32 and 96 blocks at
level "layers".

Run: .venv/bin/python benchmarks/budget.py [--blocks 8 32 96] [--levels layers] [--time-limit 60] [--timeout 600]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run as a script: the repository is not installed

from autostrat.tables import format_table  # noqa: E402

DEVICES = 8
HEADERS = ["blocks", "level", "budget", "bfs bytes", "bfs peak", "dp bytes", "dp peak", "status", "objective",
           "bound", "gap", "refine s", "refine cpu s", "peak MB", "load", "fits"]


def problems(blocks: int):
    """The problem to refine (Megatron's seeds on block 0), and Megatron's peak as the budget."""
    from autostrat.autodiff import Adam, build_training
    from autostrat.frontend import trace
    from autostrat.frontend.config import apply_seeds
    from autostrat.models import GPT, megatron_seeds
    from autostrat.search.memory import peak_bytes
    from autostrat.search.problem import build_problem
    from autostrat.search.propagate import propagate

    net = GPT(layers=blocks, hidden=1024, heads=16, seq=128, batch=16, vocab=32768)
    graph = trace(net, *net.example_inputs(), device_num=DEVICES)
    megatron = build_problem(build_training(apply_seeds(graph, megatron_seeds(blocks, DEVICES), DEVICES), Adam()), DEVICES)
    budget = peak_bytes(megatron, propagate(megatron).choice)
    seeded = apply_seeds(graph, megatron_seeds(blocks, DEVICES, first_layer_only=True), DEVICES)
    return build_problem(build_training(seeded, Adam()), DEVICES), budget


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def run_child(blocks: int, level: str, time_limit: float) -> None:
    """Refine one case and print its figures as one JSON line."""
    from autostrat.search.memory import peak_bytes
    from autostrat.search.propagate import data_parallel, propagate
    from autostrat.search.refine import refine

    problem, budget = problems(blocks)
    starts = {"bfs": propagate(problem).choice, "dp": data_parallel(problem, keep_seeds=True).choice}
    figures = {"budget": budget}
    for name, choice in starts.items():
        figures[name] = [problem.cost(choice), peak_bytes(problem, choice)]
    cpu = cpu_seconds()
    try:
        result = refine(problem, starts["bfs"], time_limit, max_device_memory=budget, coarsen_level=level, starts=[starts["dp"]])
    except Exception as error:  # the row says what went wrong; the table goes on
        figures |= {"status": f"{type(error).__name__}: {error}"[:60], "cpu": cpu_seconds() - cpu}
    else:
        figures |= {"status": result.status, "objective": result.objective, "bound": result.bound, "gap": result.gap,
                    "seconds": result.seconds, "cpu": cpu_seconds() - cpu, "fits": peak_bytes(problem, result.choice) <= budget}
    print(json.dumps(figures), flush=True)
    os._exit(0)  # as the `autostrat` command ends: without freeing the search's memos


def run_case(blocks: int, level: str, time_limit: float, timeout: float) -> list[str]:
    """One row: the case refined in a child process, with that process's peak RSS."""
    load = os.getloadavg()[0]
    command = [sys.executable, str(Path(__file__).resolve()), "--child", str(blocks), level, str(time_limit)]
    child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline, killed = time.monotonic() + timeout, False
    while True:
        pid, _, usage = os.wait4(child.pid, os.WNOHANG)
        if pid:
            break
        if time.monotonic() > deadline and not killed:
            os.killpg(child.pid, signal.SIGKILL)
            killed = True
        time.sleep(0.1)
    child.returncode = 0  # reaped here: Popen must not wait again
    lines = child.stdout.read().splitlines()
    figures = json.loads(lines[-1]) if lines and not killed else {"status": "killed after timeout" if killed else child.stderr.read()[-60:]}
    return row(blocks, level, figures, usage.ru_maxrss / 1024, load)


def row(blocks: int, level: str, figures: dict, peak_mb: float, load: float) -> list[str]:
    def number(key: str, form: str = "{:,}") -> str:
        return form.format(figures[key]) if key in figures else "-"

    starts = [f"{figures[name][i]:,}" if name in figures else "-" for name in ("bfs", "dp") for i in (0, 1)]
    return [str(blocks), level, number("budget"), *starts, figures.get("status", "-"), number("objective"), number("bound"),
            number("gap", "{:.2%}"), number("seconds", "{:.1f}"), number("cpu", "{:.1f}"), f"{peak_mb:.0f}", f"{load:.1f}",
            str(figures.get("fits", "-"))]


def main() -> None:
    if sys.argv[1:2] == ["--child"]:
        run_child(int(sys.argv[2]), sys.argv[3], float(sys.argv[4]))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, nargs="+", default=[8, 32, 96])
    parser.add_argument("--levels", nargs="+", default=["layers"], help="coarsening levels to refine at (default: layers)")
    parser.add_argument("--time-limit", type=float, default=60.0, help="CP-SAT seconds per case (default 60)")
    parser.add_argument("--timeout", type=float, default=600.0, help="kill a case after this many seconds (default 600)")
    args = parser.parse_args()
    rows = []
    for blocks in args.blocks:
        for level in args.levels:
            rows.append(run_case(blocks, level, args.time_limit, args.timeout))
            print("  ".join(rows[-1]), flush=True)  # progress while the next case runs
    print()
    print(format_table(HEADERS, rows))


if __name__ == "__main__":
    main()
