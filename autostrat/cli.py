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

import contextlib
import gc
import json
import sys
import tempfile
import time
import warnings
from dataclasses import replace
from pathlib import Path

from autostrat.entry import INTERRUPTED, interruption
from autostrat.errors import AutostratError, ConfigError
from autostrat.cli_parser import parser
from autostrat.cli_outputs import command_line_output, planned_outputs, report_outputs, text_stream, write_outputs
from autostrat.io import check_outputs
from autostrat.reading import read_json, read_text
from autostrat.frontend.yaml_text import parse_config_text
from autostrat.frontend.config import check_config_outputs, load_config, with_recompute
from autostrat.frontend.registry import import_models
from autostrat.frontend.run import RunOptions, plan_within_memory, run_and_measure, run_config
from autostrat.frontend.train import world_size
from autostrat.plan_source import SOURCE_OPTIONS, context_overrides, plan_source, source_config
from autostrat.runtime.processes import Terminated, ending_on_sigterm
from autostrat.redistribution.table import collector_paused
from autostrat.report import candidates_text
from autostrat.search.checkpoint import checkpoint_bytes
from autostrat.search.dump import dump_texts
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
    if args.processes:
        raise ConfigError(f"--processes {args.processes}: the processes of a plan-space search (a config with global_batch "
                          f"and no plan); {args.config} has no global_batch: its config's pricing_processes prices its refinement")
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

    allowed = {"config", "device_num", "max_device_memory", "json", "processes", "time_limit", "command", "imports", "started"}
    given = [key for key, value in vars(args).items() if key not in allowed and value not in (None, False, [])]
    if given:
        raise ConfigError(f"--{given[0].replace('_', '-')}: {args.config} is a plan-space config (global_batch, no plan), "
                          f"whose search takes --device-num, --max-device-memory, --json, --processes and --time-limit only")
    outputs = [command_line_output(args.json, "--json")] if args.json else []
    check_outputs(outputs, {"the config": args.config})
    found = search_plan_space(args.config, args.device_num, args.max_device_memory, processes=args.processes or 1,
                              time_limit=args.time_limit)
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


def _import_models(args) -> None:
    """The --import modules, imported and their models registered, each said on stderr."""
    for spec in getattr(args, "imports", None) or ():
        names = import_models(spec)
        print(f"autostrat: imported {spec} (--import): model(s) {', '.join(names)} registered", file=sys.stderr)


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """Warnings as one line for a person at a terminal, not a source location."""
    print(f"autostrat: warning: {message}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    started = time.perf_counter()
    args = parser().parse_args(argv)
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
