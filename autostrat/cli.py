"""The `autostrat` command (also `python -m autostrat`).

    autostrat search CONFIG.yaml [--device-num N] [--out plan.json|-] [--dump-ir DIR]
                     [--strategy-ckpt-save-file F] [--refine cpsat|solve] [--time-limit S] [--max-device-memory M]
                     [--coarsen none|exact|layers] [--mesh auto|full|SxP] [--cost-model bytes|time]
                     [--hardware a100-80gb|h100-sxm-80gb|FILE.yaml] [--precision fp32|fp16|bf16]
                     [--phase predict|train] [--parallel-optimizer] [--recompute CELL ...|auto]
                     (never unbounded: without --max-device-memory the plan fits the profile's device_memory)
    autostrat search PLAN_SPACE.yaml [--device-num N] [--max-device-memory M] [--json OUT]
                     a config with global_batch and no plan: the fastest plan of the plan: vocabulary
                     (tp, pp, vp, dp, sequence_parallel, recompute, zero, micro_batch) or of the op-level
                     search that fits, with the estimate's figures (autostrat.report.plan_space)
    autostrat candidates [--device-num N]   candidate strategies of the tutorial FFN's ops
    autostrat run CONFIG.yaml [--device-num N] [--rank-table F] [--backend mpi|local] [--steps S]
                  [--timeout S] [--stall-timeout S] [--run-dir D] [--inject-fault RANK:KIND[:AT]]
                  [--phase predict|train] [--parallel-optimizer] [--recompute CELL ...|auto]
                  [--strategy-ckpt-save-file F]
    autostrat estimate CONFIG.yaml [--json OUT]   a given plan's (plan: tp, pp, dp, ...) step time, MFU and memory
    autostrat report PLAN.json -o plan.html [--png DIR]   the plan's HTML report (also --report on search and run)
    autostrat explain PLAN.json OP [--alternatives N]   how OP got its strategy, and its best alternatives
    search, run, report and explain take --import MODULE: register the Cell classes of your own module as models
    autostrat diff A.json B.json                       how two plans of one model differ
    autostrat solve FILE [SECONDS] [--json] [--seed N] [--workers N]   solve an IOPDDL sharding instance (autostrat.cli_solve)
    autostrat --version

Outputs never clobber (`autostrat.io`): an output that is an input or another output is refused
before any work, "-" is standard output (the text then goes to standard error), a symlink is
written through to its target, a device or FIFO is written through, and a config's
strategy_ckpt_save_file must stay in the config's folder (--strategy-ckpt-save-file may go anywhere).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import sys
import tempfile
import time
import warnings
from dataclasses import replace
from importlib import metadata
from pathlib import Path

from autostrat.cost import DEFAULT_PROFILE, PROFILES
from autostrat.entry import INTERRUPTED, interruption
from autostrat.errors import AutostratError, ConfigError
from autostrat.cli_outputs import command_line_output, planned_outputs, report_outputs, text_stream, write_outputs
from autostrat.io import check_outputs
from autostrat.reading import read_json, read_text
from autostrat.frontend.yaml_text import parse_config_text
from autostrat.frontend.config import check_config_outputs, load_config, with_recompute
from autostrat.frontend.registry import import_models
from autostrat.frontend.run import RunOptions, plan_within_memory, run_and_measure, run_config
from autostrat.frontend.train import world_size
from autostrat.plan_source import SOURCE_OPTIONS, context_overrides, plan_source, source_config
from autostrat.runtime.job import FAULTS, Fault
from autostrat.runtime.launcher import STARTUP_TIMEOUT
from autostrat.runtime.processes import Terminated, ending_on_sigterm
from autostrat.redistribution.table import collector_paused
from autostrat.report import candidates_text
from autostrat.search.checkpoint import checkpoint_bytes
from autostrat.search.dump import dump_texts
from autostrat.search.precision import PRECISIONS
from autostrat.search.schedules import SCHEDULE_ORDERS
from autostrat.search.progress import StatusLine


def _search_config(args):
    options = {key: getattr(args, key) for key in SOURCE_OPTIONS}
    overrides = context_overrides(options) | {"strategy_ckpt_save_file": args.strategy_ckpt_save_file}  # not recorded
    return with_recompute(load_config(args.config, args.micro_size, **overrides), args.recompute)


def _timed_plan(config, device_num, progress=None) -> tuple:
    """The config's plan (never unbounded: `plan_within_memory`; when its strategies fit no plan
    in the budget, a known start's: `report.fitting_starts`), its notes and the search's
    seconds. The strategy checkpoint is not written here: search writes it with its other
    outputs, report and explain write none."""
    config = replace(config, context=replace(config.context, strategy_ckpt_save_file=""))
    started = time.perf_counter()
    plan, notes = plan_within_memory(config, device_num, progress=progress, fallback=_known_start)
    return plan, notes, time.perf_counter() - started


def _known_start(config, device_num, budget, error) -> tuple:
    """`report.fitting_starts.plan_from_starts`, imported only when a search found no plan: the
    report's modules stay off the search's import path."""
    from autostrat.report.fitting_starts import plan_from_starts

    return plan_from_starts(config, device_num, budget, error)


def is_plan_space(path) -> bool:
    """Whether the config at `path` is searched over the ``plan:`` vocabulary (`report.plan_space`):
    it says ``global_batch`` (an estimate config's key) or has a ``plan`` (which that search refuses)."""
    data = parse_config_text(read_text(path, "config"), path)
    return isinstance(data, dict) and ("global_batch" in data or "plan" in data)


def search_command(args) -> str:
    """Search the config's model and return the text to print; writes --out, --dump-ir,
    --report and the strategy checkpoint, all or nothing, after checking before the search that
    none clobbers another or an input. Seeds follow `autostrat run`'s rule on another
    --device-num (scaled, with a note)."""
    if is_plan_space(args.config):
        return _plan_space_command(args)
    if args.json:
        raise ConfigError(f"--json {args.json}: the figures of a plan-space search (a config with global_batch and no "
                          f"plan); {args.config} has no global_batch: --out writes its plan's JSON")
    config = _search_config(args)
    check_config_outputs(config, planned_outputs(args))
    checkpoint = config.context.strategy_output()
    status = StatusLine()  # quiet for a second: short searches print nothing
    try:
        plan, notes, seconds = _timed_plan(config, args.device_num, status)
    finally:
        status.end()
    devices = f"{world_size(plan)} devices" + (f" in {plan.pipeline.stages} stages" if plan.pipeline else "")
    lines = notes + [f"{config.path}: {type(config.net).__name__} on {devices}, {plan.mode}", plan.table()]
    outputs = {command_line_output(args.out, "--out"): ("plan", _plan_json(plan, args, config))} if args.out else {}
    if args.dump_ir:
        outputs |= {command_line_output(str(path), "--dump-ir"): ("IR", text)
                    for path, text in dump_texts(plan, Path(args.dump_ir)).items()}
    if args.report:
        outputs |= report_outputs(plan, args, seconds, _budget(config))
    if checkpoint:
        outputs[checkpoint] = ("strategy checkpoint", checkpoint_bytes(plan, checkpoint.path))
    return "\n".join(lines + write_outputs(outputs))  # all or nothing


def _plan_space_command(args) -> str:
    """`report.plan_space`'s search of a plan-space config and the text to print; writes --json
    atomically, checked before the search not to clobber the config. The options that set what
    the config's plans decide are refused, naming the first."""
    from autostrat.report.plan_space import search_plan_space  # a report: off the search's import path

    allowed = {"config", "device_num", "max_device_memory", "json", "command", "imports", "started"}
    given = [key for key, value in vars(args).items() if key not in allowed and value not in (None, False, [])]
    if given:
        raise ConfigError(f"--{given[0].replace('_', '-')}: {args.config} is a plan-space config (global_batch, no plan), "
                          f"whose search takes --device-num, --max-device-memory and --json only")
    outputs = [command_line_output(args.json, "--json")] if args.json else []
    check_outputs(outputs, {"the config": args.config})
    found = search_plan_space(args.config, args.device_num, args.max_device_memory)
    return "\n".join(found.lines(args.config) + write_outputs({output: ("search", found.to_json()) for output in outputs}))


def _budget(config) -> int:
    """The bytes per device a search fits its plan into (`frontend.run.memory_budget`)."""
    from autostrat.frontend.run import memory_budget

    return memory_budget(config.context)[0]


def _plan_json(plan, args, config):
    """The plan's JSON, with the config and options that made it ("source", see `plan_source`),
    in chunks written as they are made (`Plan.json_chunks`)."""
    options = {key: getattr(args, key) for key in SOURCE_OPTIONS}
    return plan.json_chunks(source=plan_source(config, options, args.imports or ()))


def replan(path) -> tuple:
    """The plan a JSON file (``autostrat search --out``) holds, made again from the config text
    and options it embeds (nothing it names is read or imported); with the search's seconds and
    the config. A plan that comes out other than the file's (autostrat changed since, or a
    time-limited solver stopped elsewhere) is refused: a report of another plan would mislead."""
    recorded = read_json(Path(path), "plan")
    source = recorded.get("source") if isinstance(recorded, dict) else None
    with tempfile.TemporaryDirectory(prefix="autostrat-source-") as work:  # 0700: for an embedded checkpoint
        config, options = source_config(source, str(path), Path(work))
        config = with_recompute(config, options["recompute"])
        plan, _, seconds = _timed_plan(config, options["device_num"])
    if json.loads(plan.to_json()) != {key: value for key, value in recorded.items() if key != "source"}:
        raise ConfigError(f"{path}: planning its embedded config ({source['config']}) again with the recorded options gave "
                          f"another plan than the file's (autostrat changed since it was written, or a time-limited "
                          f"solver stopped elsewhere); search again with autostrat search CONFIG --report FILE")
    return plan, seconds, config


def estimate_command(args) -> str:
    """The estimate of a config's given plan (`report.estimate`); writes --json atomically,
    checked before the search not to clobber the config."""
    from autostrat.report.estimate import estimate  # a report: off the search's import path

    outputs = [command_line_output(args.json, "--json")] if args.json else []
    check_outputs(outputs, {"the config": args.config})
    found = estimate(args.config)
    lines = found.lines(args.config)
    return "\n".join(lines + write_outputs({output: ("estimate", found.to_json()) for output in outputs}))


def report_command(args) -> str:
    planned = planned_outputs(args)
    check_outputs(planned, {"the plan": args.plan})  # before planning it again
    plan, seconds, config = replan(args.plan)  # from the plan's embedded config: no other input
    return "\n".join(write_outputs(report_outputs(plan, args, seconds, _budget(config))))


def explain_command(args) -> str:
    from autostrat.report.explain import explain  # reads plans: off the search's import path

    plan, _, _ = replan(args.plan)
    return explain(plan, args.op, args.alternatives).text


def _positive(kind):
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


def run_command(args) -> tuple[int, str]:
    options = RunOptions(args.device_num, args.backend, args.rank_table, args.steps, args.seed, args.run_dir,
                         args.timeout, args.stall_timeout, args.inject_fault, args.phase, args.parallel_optimizer,
                         tuple(args.recompute or ()), args.pipeline_stages, args.micro_size, args.startup_timeout,
                         args.strategy_ckpt_save_file, tuple(planned_outputs(args)), args.pipeline_schedule,
                         args.pipeline_interleave_num)
    if not args.report:
        return run_config(args.config, options)
    outcome = run_and_measure(args.config, options)
    planned = outcome.planned
    outputs = report_outputs(planned.plan, args, planned.search_seconds, planned.config.context.max_device_memory,
                             outcome.measured)
    return outcome.code, "\n".join([outcome.text, *write_outputs(outputs)])


def _add_run(commands) -> None:
    run = commands.add_parser(
        "run", help="run a config's plan on MPI ranks (or local threads) and check it",
        description="Search the config's plan, lower it to one program per rank, then start the ranks itself "
                    "(mpiexec of the mpich wheel in this environment: do not wrap the command in mpiexec) or run "
                    "them as threads (--backend local), and check every result and byte count against the plan "
                    "and the single-device run.")
    run.add_argument("config", help="YAML config (see configs/)")
    run.add_argument("--device-num", type=_positive(int),
                     help="number of ranks (default: the config's; a --rank-table must list as many devices). "
                          "Seeds written for another device_num are scaled to gcd(devices they use, N)")
    run.add_argument("--rank-table", default=os.environ.get("RANK_TABLE_FILE") or None,
                     help="MindSpore rank table JSON: run on its servers (default: $RANK_TABLE_FILE)")
    run.add_argument("--backend", choices=["mpi", "local"], default="mpi", help="MPI processes (default) or local threads")
    run.add_argument("--steps", type=_positive(int), default=2, help="steps on random batches (default 2)")
    _add_phase(run)
    run.add_argument("--seed", type=_natural, default=0, help="seed of the random batches (default 0)")
    run.add_argument("--run-dir", help="folder for the job and the rank logs (default: a new one under runs/)")
    run.add_argument("--timeout", type=_positive(float), default=300.0, help="seconds before the whole job is killed (default 300)")
    run.add_argument("--startup-timeout", type=_positive(float), default=STARTUP_TIMEOUT,
                     help=f"seconds every rank has to start (default {STARTUP_TIMEOUT:g}; ssh to a slow host may need more)")
    run.add_argument("--stall-timeout", type=_positive(float), default=10.0,
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


def _import_models(args) -> None:
    """The --import modules, imported and their models registered, each said on stderr."""
    for spec in getattr(args, "imports", None) or ():
        names = import_models(spec)
        print(f"autostrat: imported {spec} (--import): model(s) {', '.join(names)} registered", file=sys.stderr)


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
    command.add_argument("--pipeline-stages", type=_positive(int),
                         help="split the devices into this many pipeline stages, each running a contiguous part of "
                              "the layers (the split is searched unless the config sets pipeline_stage); training only")
    command.add_argument("--pipeline-schedule", choices=(*SCHEDULE_ORDERS, "auto"),
                         help="the order each pipeline stage runs its micro-batches' forward, backward and weight-gradient "
                              "work in; auto: the search chooses it and its virtual stages (default: the config's "
                              "pipeline_schedule, or 1f1b)")
    command.add_argument("--pipeline-interleave-num", type=_positive(int),
                         help="model stages per device group (virtual stages): interleaved_1f1b any (default 2), zbv 2")
    command.add_argument("--micro-size", type=_positive(int),
                         help="micro-batches per training step (MindSpore's PipelineCell micro_size; default: the config's, or 1)")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="autostrat", description="Automatic parallel-strategy search.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    commands = parser.add_subparsers(dest="command", required=True)
    search = commands.add_parser("search", help="search the plan of a YAML config and print it")
    search.add_argument("config", help="YAML config (see configs/)")
    search.add_argument("--device-num", type=_positive(int),
                        help="plan for N devices instead of the config's device_num; its seeds are scaled to "
                             "gcd(devices they use, N), as autostrat run does")
    search.add_argument("--out", metavar="FILE", help="write the plan as JSON to this file (-: standard output, and the "
                                                     "table to standard error)")
    search.add_argument("--dump-ir", metavar="DIR", help="write the IR dumps into this folder")
    search.add_argument("--json", metavar="FILE",
                        help="a plan-space config's search (global_batch, no plan: report.plan_space): also write the "
                             "chosen plan's figures, as autostrat estimate --json does, and every candidate's, to this "
                             "file (-: standard output, and the text to standard error)")
    search.add_argument("--refine", choices=["cpsat", "solve"],
                        help="refine the BFS plan: cpsat to the CP-SAT optimum, solve with the IOPDDL solver (large graphs)")
    search.add_argument("--time-limit", type=_positive(float), help="seconds the whole refinement may take (default 60)")
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
    candidates.add_argument("--device-num", type=_positive(int), default=8, help="number of devices (default 8)")
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
    explain.add_argument("--alternatives", type=_positive(int), default=3, help="alternatives to weigh exactly (default 3)")
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
    solve.add_argument("seconds", nargs="?", type=_positive(float),
                       help="wall-time limit (default: the contest's for the file's letter, A-E 60 s ... U-Y 300 s; else 60)")
    solve.add_argument("--json", action="store_true", help="also print cost, lower bound, peak and time as a JSON line")
    solve.add_argument("--seed", type=_natural, default=0, help="seed of the search's random choices (default 0)")
    solve.add_argument("--workers", type=_positive(int),
                       help="searches in parallel, one per process (default: 2, or 1 on a single usable core)")
    return parser


def _version() -> str:
    try:
        return metadata.version("autostrat")
    except metadata.PackageNotFoundError:  # a source tree that was never installed
        return "(not installed)"


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """Warnings as one line for a person at a terminal, not a source location."""
    print(f"autostrat: warning: {message}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    started = time.perf_counter()
    args = _parser().parse_args(argv)
    args.started = started if argv is not None else None  # None: the command line's process, timed from its start
    with warnings.catch_warnings(), ending_on_sigterm():  # SIGTERM (kill, timeout, SLURM) ends it as Ctrl-C does
        warnings.showwarning = _show_warning
        return _dispatch(args)


# Commands that plan in this process and end (`entry.command` exits without freeing): run with
# the cyclic garbage collector paused throughout, as the search itself is (`collector_paused`).
# Outside the search it kept walking the millions of memo entries the search leaves (a young
# collection of all of them as the search ends, then older ones): 32 of 300 profiled seconds of
# the 405B estimate at 16 384 devices. Reference counting still frees everything as usual.
PAUSED_COMMANDS = frozenset({"candidates", "estimate", "explain", "report", "search"})


def _dispatch(args) -> int:
    if args.command in PAUSED_COMMANDS and args.started is None:
        # The command line's own process: it ends after this without collecting (`entry`);
        # turning the collector back on would only make it walk the memos one last time.
        gc.disable()
    with collector_paused() if args.command in PAUSED_COMMANDS else contextlib.nullcontext():
        return _dispatch_command(args)


def _dispatch_command(args) -> int:
    try:
        _import_models(args)
        if args.command == "candidates":
            print(candidates_text(args.device_num, args.repeated))
        elif args.command == "search":
            print(search_command(args), file=text_stream(args))
        elif args.command == "diff":
            from autostrat.plan_diff import diff_plans  # reads plans: off the search's import path
            print(diff_plans(args.plan_a, args.plan_b).text)
        elif args.command == "estimate":
            print(estimate_command(args), file=sys.stderr if args.json == "-" else sys.stdout)
        elif args.command == "report":
            print(report_command(args), file=text_stream(args))
        elif args.command == "explain":
            print(explain_command(args))
        elif args.command == "solve":
            from autostrat.cli_solve import solve_command  # off the plan commands' import path
            return solve_command(args)
        elif args.command == "run":
            code, text = run_command(args)
            print(text, file=sys.stderr if code else sys.stdout)
            return code
    except AutostratError as error:
        print(f"autostrat: error: {error}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # output piped into `head`: stop quietly
        sys.stderr.close()
    except (KeyboardInterrupt, RuntimeError) as error:  # Ctrl-C or SIGTERM: outputs are written only once complete, so none is half-written
        interrupt = interruption(error)
        if interrupt is None:
            raise
        if isinstance(interrupt, Terminated):  # a launcher ended the job's processes first
            job = ", the job ended" if args.command == "run" else ""
            print(f"\nautostrat: terminated by SIGTERM{job}, nothing written", file=sys.stderr)
            return 128 + interrupt.signum
        print(INTERRUPTED, file=sys.stderr)
        return 130
    return 0
