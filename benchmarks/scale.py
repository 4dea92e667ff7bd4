"""Issue #14: how long, and how much memory, planning a 7B- or 175B-class training step takes.

Models (`autostrat.models.GPT`, global batch = devices x 1, float32):

- 7b: LLaMA-7B-shaped, 32 layers, hidden 4096, 32 heads, seq 2048, vocab 32000. LLaMA's FFN is
  SwiGLU; autostrat has no SwiGLU, so the FFN is GPT's GeLU one with 4 x hidden (two MatMuls
  instead of three: fewer ops and parameters than the real LLaMA, the same kind of search).
- 175b: GPT-3-175B-shaped, 96 layers, hidden 12288, 96 heads, seq 2048, vocab 51200 (GPT-3's
  50257 divides by almost nothing; Megatron-LM pads it to a multiple of 128 x its tensor-parallel
  size, and 51200 is that padding).

Each as a training step (forward, backward, Adam) on 8, 64, 256 and 1024 devices, seeded
  megatron: Megatron-LM's tensor parallelism on block 0 only (TP 8 inside a server, DP =
  devices / 8 across servers), the rest propagated by BFS (search_mode sharding_propagation);
  layouts: the same seeds as MindSpore Layouts with their device axes reversed (TP across
  servers): orders strategy tuples cannot write, which the search then offers (`search.orders`);
  none: no seeds, search_mode integer_programming (every op uses every device, the data-parallel
  plan as the hint, CP-SAT refines it within --time-limit seconds; repeated layers share one
  strategy unless --coarsen exact).

Every case runs in its own process, so its peak RSS is its own, and is killed after --timeout
seconds, or once it holds more than --memory-limit MB (default 8192: the machine may be shared,
and a 1024-device case grew to 12 GB within 300 s); its row then says which phase it was in
(the child writes a line as each phase starts and ends). Peak MB is the reaped child's
ru_maxrss, also for a killed or failed case.

Columns: ops of the training graph; candidates summed over the searched ops (update ops follow
their parameter and are not searched); table entries, the sum of the sizes of the edges' cost
tables (entries are priced only when the search first reads them); costs computed, the distinct
redistribution costs computed to fill what was read (the memo of
`autostrat.redistribution.table.cost_table`, one optimal-redistribution search each); of those,
the pairs priced unreachable (none should be: every pair of layouts of one tensor has a plan
since PartialCreate, issue #32) and the fallbacks (pairs answered by the planner's constructive plan past the search's
state limit, not proven optimal; issue #32); seconds
per phase: model (building the Cell), trace (tracing and seeding), training (`build_training`),
tables (candidates, own costs and cost tables: `build_problem`), bfs (`propagate`, or the
data-parallel hint without seeds), refine (CP-SAT), plan (`follow_parameters` and `build_plan`);
total, the sum of the phases (about what `plan_for` costs); peak MB; bytes per device of the
plan; the 1-minute load average when the case started (the machine may be shared: times are
wall-clock).

Targets of issue #14, checked at the models' full depth (no --layers) for either seeding:

- 7b on 64 devices: <= 5 s and <= 500 MB;
- 7b on 1024 devices: <= 15 s and <= 1 GB (1024 MB);
- 175b on 1024 devices: <= 30 s and <= 1.5 GB (1536 MB);
- 7b on 1024 devices with CP-SAT at coarsening "layers" (``--refine cpsat --coarsen layers``,
  or seeding none, whose search coarsens layers by default): the optimum proven (status
  OPTIMAL) in <= 30 s.

Run: .venv/bin/python benchmarks/scale.py [--models 7b 175b] [--devices 8 64 256 1024]
     [--seeding megatron none] [--timeout 300] [--memory-limit 8192] [--layers N]
     [--refine cpsat] [--coarsen layers] [--time-limit 60] [--[no-]allow-repeated]
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run as a script: the repository is not installed

from phases import PhaseClock, counted_pairs, timed_calls  # noqa: E402  (this folder is on sys.path)

from autostrat.tables import format_table  # noqa: E402

MODELS = {
    "7b": {"layers": 32, "hidden": 4096, "heads": 32, "seq": 2048, "vocab": 32000},
    "175b": {"layers": 96, "hidden": 12288, "heads": 96, "seq": 2048, "vocab": 51200},
}
PHASES = ("model", "trace", "training", "tables", "bfs", "refine", "plan")
# The functions `autostrat.search.search.search` calls, timed as phases (see `phases.timed_calls`).
SEARCH_PHASES = {"build_problem": "tables", "propagate": "bfs", "data_parallel": "bfs", "refine": "refine",
                 "follow_parameters": "plan", "build_plan": "plan"}
HEADERS = ["model", "devices", "layers", "seeding", "ops", "candidates", "table entries", "costs computed", "unreachable",
           "fallbacks",
           *(f"{phase} s" for phase in PHASES), "total s", "peak MB", "bytes/device", "load", "status", "target"]
TARGETS = {("7b", 64): (5, 500), ("7b", 1024): (15, 1024), ("175b", 1024): (30, 1536)}  # seconds, MB
CPSAT_TARGET = ("7b", 1024, 30)  # proven optimal within this many seconds


def plan_case(case: dict, clock: PhaseClock) -> dict:
    """Plan one case, phase by phase on `clock`; the figures of its row."""
    from autostrat.autodiff import Adam, build_training
    from autostrat.frontend import trace
    from autostrat.frontend.config import apply_seeds
    from autostrat.models import GPT, megatron_seeds
    from autostrat.redistribution import table
    from autostrat.search.search import SearchOptions

    # The module, not the function the package re-exports under the same name.
    search_module = importlib.import_module("autostrat.search.search")

    shape, devices, layers = MODELS[case["model"]], case["devices"], case["layers"]
    with clock.phase("model"):
        net = GPT(layers, shape["hidden"], shape["heads"], shape["seq"], devices, shape["vocab"])
    with clock.phase("trace"):
        graph = trace(net, *net.example_inputs(), device_num=devices)
        if case["seeding"] in ("megatron", "layouts"):
            seeds = megatron_seeds(layers, 8, first_layer_only=True, data_parallel=devices // 8)
            if case["seeding"] == "layouts":
                seeds = reversed_layouts(graph, seeds, devices)
            graph = apply_seeds(graph, seeds, devices)
    with clock.phase("training"):
        graph = build_training(graph, Adam(1e-3))
    automatic = case["seeding"] == "none"
    options = SearchOptions(search_mode="integer_programming" if automatic else "sharding_propagation",
                            refine=case["refine"], coarsen=case["coarsen"], refine_time_limit=case["time_limit"],
                            allow_repeated=case.get("allow_repeated"))
    with timed_calls(clock, search_module, SEARCH_PHASES), counted_pairs() as counts:
        plan = search_module.search(graph, devices, options)
    problem = clock.results["build_problem"]
    return {
        "ops": len(graph.ops),
        "candidates": sum(len(c) for c in problem.candidates.values()),
        "table entries": sum(edge.table.size for edge in problem.edges),
        "costs computed": len(table._COSTS),  # fresh process: every entry was computed by this case
        "unreachable": counts.unreachable(),
        "fallbacks": counts.fallbacks,
        "bytes": plan.total_bytes,
        "refine status": plan.refinement.result.status if plan.refinement else None,
    }


def reversed_layouts(graph, seeds: dict, devices: int) -> dict:
    """`seeds` as MindSpore Layouts with their device axes in the reverse order (TP across
    servers, DP inside): the same parts per dim, in an order strategy tuples cannot write, so
    that the search offers the orders these seeds start (`search.orders`)."""
    from autostrat.layout import Strategy
    from autostrat.layout.named import named_layouts
    from autostrat.layout.placement import Placement, default_placement

    result = {}
    for name, (in_strategy, out_strategy) in seeds.items():
        rule = graph.ops[name].rule
        splits = Strategy.from_tuples(rule, in_strategy, devices, out_strategy).splits
        default = default_placement(splits, devices)
        ndim = len(default.matrix)
        placement = Placement(tuple(reversed(default.matrix)), tuple(tuple(ndim - 1 - a for a in axes) for axes in default.axes))
        result[name] = (named_layouts(Strategy(rule, splits, devices, placement=placement)), None)
    return result


def run_child(case: dict, progress: Path) -> None:
    with progress.open("a") as stream:
        clock = PhaseClock(stream)
        figures = plan_case(case, clock)
        print("result", json.dumps(figures | {"seconds": clock.seconds}), file=stream, flush=True)
    os._exit(0)  # as the `autostrat` command ends: without freeing the search's memos (see cli.command)


def read_progress(progress: Path) -> tuple[dict, str | None, dict | None]:
    """Seconds of the phases ended, the phase started but not ended, and the result line's figures."""
    seconds, current, result = {}, None, None
    for line in progress.read_text().splitlines():
        words = line.split(maxsplit=1)
        if words[0] == "result":
            result = json.loads(words[1])
        elif words[0] == "start":
            current = words[1].split()[0]
        elif words[0] == "end":
            name, value, _ = words[1].split()
            seconds[name] = seconds.get(name, 0.0) + float(value)
            current = None
    return seconds, current, result


def resident_mb(pid: int) -> float:
    """A live process's resident memory (VmRSS) in MB; 0 once it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def wait_measured(child: subprocess.Popen, timeout: float, memory_limit: float) -> tuple[str | None, float]:
    """Wait for `child`, killing its process group after `timeout` seconds or once it holds more
    than `memory_limit` MB (the machine is shared: a 1024-device case grows by gigabytes a minute).
    Why it was killed ("timeout", "memory", None) and its peak RSS in MB (the kernel's ru_maxrss
    of the reaped child, whatever its end)."""
    deadline = time.monotonic() + timeout
    killed = None
    while True:
        pid, status, usage = os.wait4(child.pid, 0 if killed else os.WNOHANG)
        if pid:
            child.returncode = os.waitstatus_to_exitcode(status)  # reaped here: Popen must not wait again
            return killed, usage.ru_maxrss / 1024
        if time.monotonic() >= deadline or resident_mb(child.pid) > memory_limit:
            killed = "timeout" if time.monotonic() >= deadline else "memory"
            os.killpg(child.pid, signal.SIGKILL)
        else:
            time.sleep(0.05)


def run_case(case: dict, timeout: float, memory_limit: float) -> dict:
    """Plan `case` in a child process killed after `timeout` seconds or past `memory_limit` MB;
    what it reported."""
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="scale-") as folder:
        progress, errors = Path(folder) / "progress", Path(folder) / "stderr"
        progress.touch()
        command = [sys.executable, str(Path(__file__).resolve()), "--child", json.dumps(case), str(progress)]
        with errors.open("w") as stderr:
            # Its own session, so that the kill on timeout reaches whatever it started too.
            child = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=stderr, start_new_session=True)
            start = time.monotonic()
            try:
                killed, peak = wait_measured(child, timeout, memory_limit)
            except BaseException:  # interrupted or terminated: the child is in its own session, end it too
                os.killpg(child.pid, signal.SIGKILL)
                child.wait()
                raise
            elapsed = time.monotonic() - start
        outcome = killed or ("ok" if child.returncode == 0 else "failed")
        seconds, current, result = read_progress(progress)
        error = errors.read_text().strip().splitlines()
    return {"case": case, "outcome": outcome, "seconds": seconds, "current": current, "result": result,
            "peak": peak, "error": error[-1] if error else f"exit status {child.returncode}", "load": load, "elapsed": elapsed}


def status_of(run: dict, timeout: float, memory_limit: float) -> str:
    if run["outcome"] == "timeout":
        return f"timeout after {timeout:g} s in {run['current'] or 'start-up'}"
    if run["outcome"] == "memory":
        return f"killed over {memory_limit:g} MB after {run['elapsed']:.0f} s in {run['current'] or 'start-up'}"
    if run["outcome"] == "failed":
        where = f"in {run['current']}" if run["current"] else f"after {list(run['seconds'])[-1]}" if run["seconds"] else "at start-up"
        return f"failed {where}: {run['error']}"
    refined = run["result"]["refine status"]
    return f"ok, CP-SAT {refined}" if refined else "ok"


def target_of(run: dict, full_depth: bool) -> str:
    """Whether the case meets its issue #14 targets: "-" when it has none, else met or missed (why)."""
    case = run["case"]
    key = (case["model"], case["devices"])
    cpsat = case["refine"] == "cpsat" or case["seeding"] == "none"
    coarsening = case["coarsen"] or ("layers" if case["seeding"] == "none" else "exact")  # SearchOptions.coarsening
    wants_cpsat = cpsat and coarsening == "layers" and key == CPSAT_TARGET[:2]
    if not full_depth or (key not in TARGETS and not wants_cpsat):
        return "-"
    if run["outcome"] != "ok":
        return f"missed ({run['outcome']})"
    total, peak = sum(run["seconds"].values()), run["peak"]
    misses = []
    if key in TARGETS:
        seconds, megabytes = TARGETS[key]
        misses += [f"{total:.1f} s > {seconds} s"] if total > seconds else []
        misses += [f"{peak:.0f} MB > {megabytes} MB"] if peak > megabytes else []
    if wants_cpsat:
        refined, limit = run["result"]["refine status"], CPSAT_TARGET[2]
        misses += [f"CP-SAT {refined}"] if refined != "OPTIMAL" else []
        misses += [f"{total:.1f} s > {limit} s"] if total > limit and f"{total:.1f} s > {limit} s" not in misses else []
    return f"missed ({'; '.join(misses)})" if misses else "met"


def row_of(run: dict, timeout: float, memory_limit: float, full_depth: bool) -> list[str]:
    case, result, seconds = run["case"], run["result"] or {}, run["seconds"]
    phases = []
    for phase in PHASES:
        if phase in seconds:
            phases.append(f"{seconds[phase]:.2f}")
        else:
            phases.append("killed" if phase == run["current"] else "-")
    peak = run["peak"]
    counted = ("ops", "candidates", "table entries", "costs computed", "unreachable", "fallbacks")
    figures = [f"{result[key]:,}" if key in result else "-" for key in counted]
    return [
        case["model"], str(case["devices"]), str(case["layers"]),
        case["seeding"] + (f"+{case['refine']}" if case["refine"] else ""), *figures, *phases,
        f"{sum(seconds.values()):.2f}" if run["outcome"] == "ok" else "-",
        "-" if peak is None else f"{peak:.0f}", f"{result['bytes']:,}" if "bytes" in result else "-",
        f"{run['load']:.1f}", status_of(run, timeout, memory_limit), target_of(run, full_depth),
    ]


def cases(args) -> list[dict]:
    return [
        {"model": model, "devices": devices, "seeding": seeding, "layers": args.layers or MODELS[model]["layers"],
         "refine": args.refine, "coarsen": args.coarsen, "time_limit": args.time_limit,
         "allow_repeated": args.allow_repeated}
        for model in args.models for devices in args.devices for seeding in args.seeding
    ]


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", choices=sorted(MODELS), default=["7b", "175b"])
    parser.add_argument("--devices", type=int, nargs="+", default=[8, 64, 256, 1024])
    parser.add_argument("--seeding", nargs="+", choices=["megatron", "layouts", "none"], default=["megatron", "none"])
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per case before it is killed (default 300)")
    parser.add_argument("--memory-limit", type=float, default=8192.0,
                        help="MB of resident memory per case before it is killed (default 8192)")
    parser.add_argument("--layers", type=int, help="override every model's depth (quick runs; no targets then)")
    parser.add_argument("--refine", choices=["cpsat"], help="refine the seeded plans with CP-SAT too")
    parser.add_argument("--coarsen", choices=["exact", "layers"],
                        help="CP-SAT coarsening level (default: as the search mode does: layers without seeds, "
                             "exact when refining the propagated plan)")
    parser.add_argument("--time-limit", type=float, default=60.0, help="CP-SAT seconds per solve (default 60)")
    parser.add_argument("--allow-repeated", action=argparse.BooleanOptionalAction,
                        help="candidates may repeat work over devices (default: as the search mode does: "
                             "sharding_propagation yes, integer_programming no)")
    parser.add_argument("--child", nargs=2, metavar=("CASE", "PROGRESS"), help=argparse.SUPPRESS)  # one case's process
    args = parser.parse_args(argv)
    if args.layers is not None and args.layers < 1:
        parser.error(f"--layers must be at least 1, got {args.layers}")
    if {"megatron", "layouts"} & set(args.seeding) and any(d % 8 for d in args.devices):
        parser.error(f"megatron seeding needs devices divisible by 8 (TP 8), got {args.devices}")
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.child:
        return run_child(json.loads(args.child[0]), Path(args.child[1]))
    # SIGTERM (e.g. from `timeout`) as an exception, so that the running case's child is killed too.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    rows = []
    for case in cases(args):
        run = run_case(case, args.timeout, args.memory_limit)
        rows.append(row_of(run, args.timeout, args.memory_limit, args.layers is None))
        print("  ".join(rows[-1]), flush=True)  # progress while the next case runs
    print()
    print(format_table(HEADERS, rows))


if __name__ == "__main__":
    main()
