"""The command line's parser (`parser`): every command of `autostrat` and its options, with the
types that refuse a bad value before any work (`autostrat.cli` runs the commands).
"""

from __future__ import annotations

import argparse
import os
from importlib import metadata

from autostrat.cost import DEFAULT_PROFILE, PROFILES
from autostrat.runtime.job import FAULTS, Fault
from autostrat.runtime.launcher import STARTUP_TIMEOUT
from autostrat.search.precision import PRECISIONS
from autostrat.search.schedules import SCHEDULE_ORDERS


def positive(kind):
    """An argparse type: a positive `kind` (int or float), else a usage error naming the value."""
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            value = None
        if value is None or not 0 < value < float("inf"):
            noun = "integer" if kind is int else "number"
            raise argparse.ArgumentTypeError(f"expected a positive {noun}, got {text!r}")
        return value
    parse.__name__ = f"positive {kind.__name__}"
    return parse


def _mesh(text: str):
    """An argparse type: "auto", "full" or axis sizes joined by x ("128x8")."""
    if text in ("auto", "full"):
        return text
    sizes = text.split("x")
    if not all(size.isdigit() and int(size) > 0 for size in sizes):
        raise argparse.ArgumentTypeError(f"expected auto, full or axis sizes such as 128x8, got {text!r}")
    return tuple(int(size) for size in sizes)


def _natural(text: str) -> int:
    """An argparse type: a whole number >= 0 (a random seed)."""
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"expected a whole number >= 0, got {text!r}")
    return int(text)


def _fault(text: str) -> Fault:
    """``RANK:KIND[:INSTRUCTION]`` for --inject-fault (default instruction: the first collective)."""
    parts = text.split(":")
    if len(parts) not in (2, 3) or parts[1] not in FAULTS or not all(p.isdigit() for p in parts[:1] + parts[2:]):
        raise argparse.ArgumentTypeError(f"expected RANK:KIND[:INSTRUCTION] with KIND one of {', '.join(FAULTS)}, got {text!r}")
    return Fault(int(parts[0]), parts[1], int(parts[2]) if len(parts) == 3 else -1)


def _add_run(commands) -> None:
    run = commands.add_parser(
        "run", help="run a config's plan on MPI ranks (or local threads) and check it",
        description="Search the config's plan, lower it to one program per rank, then start the ranks itself "
                    "(mpiexec of the mpich wheel in this environment: do not wrap the command in mpiexec) or run "
                    "them as threads (--backend local), and check every result and byte count against the plan "
                    "and the single-device run.")
    run.add_argument("config", help="YAML config (see configs/)")
    run.add_argument("--device-num", type=positive(int),
                     help="number of ranks (default: the config's; a --rank-table must list as many devices). "
                          "Seeds written for another device_num are scaled to gcd(devices they use, N)")
    run.add_argument("--rank-table", default=os.environ.get("RANK_TABLE_FILE") or None,
                     help="MindSpore rank table JSON: run on its servers (default: $RANK_TABLE_FILE)")
    run.add_argument("--backend", choices=["mpi", "local"], default="mpi", help="MPI processes (default) or local threads")
    run.add_argument("--steps", type=positive(int), default=2, help="steps on random batches (default 2)")
    _add_phase(run)
    run.add_argument("--seed", type=_natural, default=0, help="seed of the random batches (default 0)")
    run.add_argument("--run-dir", help="folder for the job and the rank logs (default: a new one under runs/)")
    run.add_argument("--timeout", type=positive(float), default=300.0, help="seconds before the whole job is killed (default 300)")
    run.add_argument("--startup-timeout", type=positive(float), default=STARTUP_TIMEOUT,
                     help=f"seconds every rank has to start (default {STARTUP_TIMEOUT:g}; ssh to a slow host may need more)")
    run.add_argument("--stall-timeout", type=positive(float), default=10.0,
                     help="seconds a rank may make no progress before its watchdog ends the job (default 10)")
    _add_report(run)
    _add_import(run)
    _add_strategy_save(run)
    run.add_argument("--inject-fault", type=_fault, metavar="RANK:KIND[:AT]",
                     help=f"make one rank fail on purpose, to see how a job ends: KIND is {', '.join(FAULTS)}, "
                          "AT the program instruction it fails at (default: its first collective)")


def _add_strategy_save(command) -> None:
    command.add_argument("--strategy-ckpt-save-file", metavar="FILE",
                         help="write the plan's strategy checkpoint to this file (MindSpore's format: protobuf for .ckpt, "
                              "else JSON), instead of the config's strategy_ckpt_save_file, which must stay in the "
                              "config's folder")


def _add_report(command, required: bool = False) -> None:
    names = ("-o", "--report") if required else ("--report",)
    command.add_argument(*names, dest="report", required=required, metavar="FILE",
                         help="write the plan's report to this HTML file: summary, op graph, charts, lower bound "
                              "(one self-contained file; on search and report, -: standard output)")
    command.add_argument("--png", metavar="DIR", help="also write the report's charts as PNG files into this folder")


def _add_import(command) -> None:
    command.add_argument("--import", dest="imports", action="append", metavar="MODULE",
                         help="import MODULE (a module name, looked up in the current folder first, or a .py file) "
                              "and register the Cell classes it defines as models a config may name; this runs its "
                              "code, which autostrat never does for a name written in a file (repeatable)")


def _add_phase(command) -> None:
    command.add_argument("--phase", choices=["predict", "train"],
                         help="override the config's phase: train plans (and runs) forward, backward, gradient "
                              "synchronisation and the optimiser's update")
    command.add_argument("--recompute", nargs="+", metavar="CELL",
                         help="cells (paths such as blocks.0) whose forward runs again in the backward, "
                              "keeping only their inputs (MindSpore's Cell.recompute); added to the config's list. "
                              "'auto': the search chooses how many repeated layers to recompute under "
                              "max_device_memory (auto_recompute)")
    command.add_argument("--parallel-optimizer", action="store_true", default=None,
                         help="split each parameter's optimiser state and update over its replicas (MindSpore's "
                              "enable_parallel_optimizer, ZeRO 1-2); parallel_optimizer_config comes from the config")
    command.add_argument("--pipeline-stages", type=positive(int),
                         help="split the devices into this many pipeline stages, each running a contiguous part of "
                              "the layers (the split is searched unless the config sets pipeline_stage); training only")
    command.add_argument("--pipeline-schedule", choices=(*SCHEDULE_ORDERS, "auto"),
                         help="the order each pipeline stage runs its micro-batches' forward, backward and weight-gradient "
                              "work in; auto: the search chooses it and its virtual stages (default: the config's "
                              "pipeline_schedule, or 1f1b)")
    command.add_argument("--pipeline-interleave-num", type=positive(int),
                         help="model stages per device group (virtual stages): interleaved_1f1b any (default 2), zbv 2")
    command.add_argument("--micro-size", type=positive(int),
                         help="micro-batches per training step (MindSpore's PipelineCell micro_size; default: the config's, or 1)")


def parser() -> argparse.ArgumentParser:
    """The parser of `autostrat`'s command line.

    Example:
        >>> parser().parse_args(["search", "configs/ffn.yaml"]).command
        'search'
    """
    parser = argparse.ArgumentParser(prog="autostrat", description="Automatic parallel-strategy search.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    commands = parser.add_subparsers(dest="command", required=True)
    search = commands.add_parser("search", help="search the plan of a YAML config and print it")
    search.add_argument("config", help="YAML config (see configs/)")
    search.add_argument("--device-num", type=positive(int),
                        help="plan for N devices instead of the config's device_num; its seeds are scaled to "
                             "gcd(devices they use, N), as autostrat run does")
    search.add_argument("--out", metavar="FILE", help="write the plan as JSON to this file (-: standard output, and the "
                                                     "table to standard error)")
    search.add_argument("--dump-ir", metavar="DIR", help="write the IR dumps into this folder")
    search.add_argument("--json", metavar="FILE",
                        help="a plan-space config's search (global_batch, no plan: report.plan_space): also write the "
                             "chosen plan's figures, as autostrat estimate --json does, and every candidate's, to this "
                             "file (-: standard output, and the text to standard error)")
    search.add_argument("--processes", type=positive(int),
                        help="a plan-space config's search: price its candidates on N processes, this one among them "
                             "(the same answer on any number; default 1)")
    search.add_argument("--refine", choices=["cpsat", "solve"],
                        help="refine the BFS plan: cpsat to the CP-SAT optimum, solve with the IOPDDL solver (large graphs)")
    search.add_argument("--time-limit", type=positive(float), help="seconds the whole refinement may take (default 60); "
                                                                   "a plan-space config's search: seconds it may price "
                                                                   "candidates (default: until its branch and bound ends)")
    search.add_argument("--max-device-memory", help="per-device memory budget: bytes or e.g. 16GB (implies --refine); "
                                                     "default: the hardware profile's device_memory, searched under only "
                                                     "when the unbounded plan peaks over it")
    search.add_argument("--coarsen", choices=["none", "exact", "layers"],
                        help="reduce the solver's model first: exact (same optimum) or layers (repeated layers share one "
                             "strategy); default: layers in integer_programming, exact when refining a propagated plan")
    search.add_argument("--mesh", type=_mesh,
                        help="logical mesh the candidates split over: auto (default: every divisor up to 16 devices, "
                             "servers x 8 beyond), full (every divisor) or axis sizes such as 128x8")
    search.add_argument("--cost-model", choices=["bytes", "time"],
                        help="what the search minimises: bytes sent per device (default) or the predicted step time")
    search.add_argument("--precision", choices=list(PRECISIONS),
                        help="the dtype of parameters, activations and communication: fp32 (default), or 16-bit with fp32 "
                             "main copies as Megatron's distributed optimizer keeps them (runs hold it so; fp16 runs need "
                             "a loss_scale, and 16-bit runs no pipeline stages)")
    search.add_argument("--hardware", metavar="PROFILE",
                        help=f"the hardware the step time is predicted on: {', '.join(PROFILES)} (default "
                             f"{DEFAULT_PROFILE}) or a YAML file of a profile's fields; the config's device_flops, "
                             "..., devices_per_server keys still override its fields")
    _add_phase(search)
    _add_report(search)
    _add_import(search)
    _add_strategy_save(search)
    candidates = commands.add_parser("candidates", help="print the candidate strategies of the tutorial FFN")
    candidates.add_argument("--device-num", type=positive(int), default=8, help="number of devices (default 8)")
    candidates.add_argument("--repeated", action="store_true", help="also list repeated-calculation strategies")
    diff = commands.add_parser("diff", help="compare two plans of one model (JSON from search --out)")
    diff.add_argument("plan_a", help="plan A (JSON)")
    diff.add_argument("plan_b", help="plan B (JSON)")
    report = commands.add_parser("report", help="write the HTML report of a plan (JSON from search --out)",
                                 description="Plan the config the plan's JSON records again (it must give the same "
                                             "plan) and write its report: summary, op graph, charts, lower bound.")
    report.add_argument("plan", help="plan (JSON from autostrat search --out)")
    _add_report(report, required=True)
    _add_import(report)
    explain = commands.add_parser("explain", help="how an op of a plan got its strategy, and its best alternatives")
    explain.add_argument("plan", help="plan (JSON from autostrat search --out)")
    explain.add_argument("op", help="the op's name (as in the plan's table)")
    explain.add_argument("--alternatives", type=positive(int), default=3, help="alternatives to weigh exactly (default 3)")
    _add_import(explain)
    _add_run(commands)
    estimate = commands.add_parser(
        "estimate", help="predict the step time, throughput and memory of a given Megatron-style plan",
        description="Plan the config's `plan:` section (tp, pp, vp, dp, cp, ep, etp, sequence_parallel, recompute, zero, "
                    "micro_batch; with global_batch) with the search's own machinery and print the step time per phase "
                    "and the bubble, tokens/s and model TFLOP/s per device, MFU, and each stage's peak memory per device "
                    "by kind. Values not yet expressible are refused, naming the key.")
    estimate.add_argument("config", help="YAML config with a plan section (see configs/estimate/)")
    estimate.add_argument("--json", metavar="FILE", help="also write the figures as JSON to this file (-: standard output, "
                                                          "and the text to standard error)")
    _add_import(estimate)
    solve = commands.add_parser("solve", help="solve an IOPDDL instance (gzipped or plain JSON) and print its solution",
                                description="Progress lines '# cost C bound B after T s', then as the last line the "
                                            "solution [s0, s1, ...] ([] when none fits the memory limit, exit 1).")
    solve.add_argument("file", help="the instance (github.com/google/iopddl format)")
    solve.add_argument("seconds", nargs="?", type=positive(float),
                       help="wall-time limit (default: the contest's for the file's letter, A-E 60 s ... U-Y 300 s; else 60)")
    solve.add_argument("--json", action="store_true", help="also print cost, lower bound, peak and time as a JSON line")
    solve.add_argument("--seed", type=_natural, default=0, help="seed of the search's random choices (default 0)")
    solve.add_argument("--workers", type=positive(int),
                       help="searches in parallel, one per process (default: 2, or 1 on a single usable core)")
    return parser


def _version() -> str:
    try:
        return metadata.version("autostrat")
    except metadata.PackageNotFoundError:  # a source tree that was never installed
        return "(not installed)"
