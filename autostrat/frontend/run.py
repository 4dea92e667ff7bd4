"""`run_config`: search a YAML config's plan and run it on local threads or MPI ranks.

A config's seeds are written for its own `device_num` (a pipeline's for one stage's devices).
Searched (`autostrat search`) or run (`autostrat run`) on another number of devices, each
seed is scaled down to use ``gcd(its devices, device_num)`` devices, by dividing its factor
splits in the rule's factor order; if a scaled seed then uses fewer devices than there are, the
search may use repeated calculation. The scaling is printed, never silent.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, replace
from pathlib import Path

from autostrat.errors import AutostratError, ConfigError, InfeasibleError, SolverError
from autostrat.frontend.api import plan_for
from autostrat.frontend.config import check_config_outputs, load_config, with_recompute
from autostrat.frontend.tracing import trace
from autostrat.frontend.world import launched_by_mpiexec
from autostrat.layout import Strategy
from autostrat.layout.named import is_layout_strategy
from autostrat.runtime.job import Fault, make_job
from autostrat.runtime.job_file import save_job
from autostrat.runtime.launcher import STARTUP_TIMEOUT, launch, resolve_hosts
from autostrat.runtime.local import run_job_locally
from autostrat.runtime.rank_table import load_rank_table
from autostrat.runtime.run_folder import make_run_folder
from autostrat.runtime.report import MEASURED
from autostrat.strategies import mesh_axes
from autostrat.search.precision import check_runnable


MAX_LOCAL_RANKS = 256  # ranks one machine starts: each is a thread or a process with its own Python


@dataclass(frozen=True)
class RunOptions:
    device_num: int | None = None
    backend: str = "mpi"
    rank_table: str | None = None
    steps: int = 2
    seed: int = 0
    run_dir: str | None = None
    timeout: float = 300.0
    stall_timeout: float = 10.0
    fault: Fault | None = None
    phase: str | None = None  # overrides the config's
    parallel_optimizer: bool | None = None  # overrides the config's enable_parallel_optimizer
    recompute: tuple[str, ...] = ()  # cell paths recomputed besides the config's
    pipeline_stages: int | None = None  # overrides the config's
    micro_size: int | None = None  # overrides the config's
    startup_timeout: float = STARTUP_TIMEOUT  # seconds for every rank to start (slow ssh: more)
    strategy_ckpt_save_file: str | None = None  # overrides the config's (any path: the caller's, not the file's)
    outputs: tuple = ()  # `io.OutputPath`s the caller writes after the run: checked with the config's first
    pipeline_schedule: str | None = None  # overrides the config's
    pipeline_interleave_num: int | None = None  # overrides the config's


def fit_seed(rule, in_strategy, out_strategy, from_devices: int, to_devices: int, where: str = "seed") -> tuple:
    """A seed written for `from_devices` devices, scaled to ``gcd(its devices, to_devices)``.

    Example (the tutorial MatMul seed on 4 and on 6 devices):
        >>> from autostrat.rules import make_rule
        >>> rule = make_rule("MatMul", [(64, 64), (64, 64)])
        >>> fit_seed(rule, ((2, 1), (1, 4)), None, 8, 4), fit_seed(rule, ((2, 1), (1, 4)), None, 8, 6)
        ((((1, 1), (1, 4)), None), (((1, 1), (1, 2)), None))
    """
    try:
        strategy = Strategy.from_tuples(rule, in_strategy, from_devices, out_strategy, where=where)
    except AutostratError as error:
        raise ConfigError(f"{error} (seeds are written for the config's device_num {from_devices})") from None
    if is_layout_strategy(in_strategy) and from_devices != to_devices:
        raise ConfigError(f"{where}: a Layout names its {from_devices} devices' axes and cannot be scaled to "
                          f"{to_devices} devices; write it for {to_devices} (or use strategy tuples)")
    if is_layout_strategy(in_strategy):
        return in_strategy, out_strategy
    used = math.prod(strategy.splits)
    excess = used // math.gcd(used, to_devices)
    splits = []
    for split in strategy.splits:
        common = math.gcd(split, excess)
        splits.append(split // common)
        excess //= common
    fitted = Strategy(rule, tuple(splits), to_devices)
    return fitted.to_tuples(), fitted.out_tuples()


def fit_seeds(config, device_num: int) -> tuple[object, dict, list[str]]:
    """The config's context and seeds for `device_num` devices, and a note per changed seed.
    A pipeline's seeds are for one stage's devices: the config's written for
    ``device_num / pipeline_stages`` of its file, fitted to the run's stage."""
    own, stages = config.seed_devices or config.context.device_num, config.context.pipeline_stages
    if device_num % stages:
        raise ConfigError(f"pipeline_stages {stages} must divide device_num {device_num}")
    if device_num // stages == own:
        return replace(config.context, device_num=device_num), config.strategies, []
    context = replace(config.context, device_num=device_num)
    device_num //= stages  # what the seeds are validated on from here
    graph = trace(config.net, *config.inputs, device_num=own)
    seeds, notes, repeated = {}, [], False
    for name, (in_strategy, out_strategy) in config.strategies.items():
        rule = graph.ops[name].rule if name in graph.ops else None
        if rule is None:
            seeds[name] = (in_strategy, out_strategy)  # unknown op: the search reports it
            continue
        seeds[name] = fit_seed(rule, in_strategy, out_strategy, own, device_num, where=f"{config.path}: strategies.{name}")
        used = math.prod(Strategy.from_tuples(rule, seeds[name][0], device_num, seeds[name][1]).splits)
        repeated |= used < device_num
        if seeds[name] != (in_strategy, out_strategy):
            notes.append(f"seed {name}: {in_strategy} written for device_num {own} -> {seeds[name][0]} on {device_num} "
                         f"devices (gcd of the devices it uses and {device_num})")
    return replace(context, fully_use_devices=config.context.fully_use_devices and not repeated), seeds, notes


def plan_config(config, device_num: int | None = None, progress=None) -> tuple:
    """The plan of a loaded config on `device_num` devices (default: the config's), its seeds
    scaled as the module docstring says, and a note per scaled seed (and one saying where the
    strategy checkpoint was written, if the context asks for one). `autostrat search` and
    `autostrat run` both plan through here, so one rule holds for both."""
    context, seeds, notes = fit_seeds(config, device_num or config.context.device_num)
    plan = plan_for(config.network(), config.inputs, context, seeds, progress=progress, optimizer=config.optimizer,
                    recompute=config.recompute)
    if context.strategy_ckpt_save_file:  # plan_for wrote it
        notes.append(context.strategy_output().written("strategy checkpoint"))
    return plan, notes


def peak_of(plan) -> int:
    """The plan's peak bytes per device: its busiest pipeline stage's, or its prediction's."""
    return max(plan.pipeline.peak_bytes) if plan.pipeline else plan.prediction.peak_bytes


def plan_within_memory(config, device_num: int | None = None, progress=None, fallback=None) -> tuple:
    """`plan_config`, never unbounded: a config without ``max_device_memory`` is fitted into its
    hardware profile's `device_memory` (as `fit_into`, the unbounded plan dropped before the search
    under the budget). `autostrat search` and the plans `report`
    and `explain` make again go through here, so they agree. When the search under the budget
    finds no plan (an `InfeasibleError` or a `SolverError`), ``fallback(config, device_num,
    budget, error)`` (`report.fitting_starts.plan_from_starts`) gives the plan and its notes of
    a known start that fits, or raises.

    Example (the tutorial FFN fits an 80 GiB device as it is):
        >>> from autostrat.frontend.config import load_config
        >>> plan, notes = plan_within_memory(load_config("configs/ffn.yaml"))
        >>> peak_of(plan) <= load_config("configs/ffn.yaml").context.hardware_profile().device_memory, notes
        (True, [])
    """
    if config.context.max_device_memory is None:
        plan, notes = plan_config(config, device_num, progress)
        budget, source = memory_budget(config.context)
        peak = peak_of(plan)
        if peak <= budget:
            return plan, notes
        del plan  # only its peak is said from here: not held through the searches that follow
        where = f"{config.path}: max_device_memory not given, so the plan must fit {source} = {budget:,} bytes per device"
        return _search_under(config, where, budget, peak, device_num, progress, fallback)
    try:
        return plan_config(config, device_num, progress)  # the search fits it
    except (InfeasibleError, SolverError) as error:
        if fallback is None:
            raise
        refusal = error.with_traceback(None)  # the search's frames (its problem, its tables) freed before the fallback's
    return fallback(config, device_num or config.context.device_num, config.context.max_device_memory, refusal)


def memory_budget(context, given: int | None = None) -> tuple[int, str]:
    """``(bytes, where from)``: the bytes per device a plan must fit, `given` or the context's
    max_device_memory, else its hardware profile's `device_memory` (a search is never unbounded).

    Example:
        >>> from autostrat.frontend.context import ParallelContext
        >>> memory_budget(ParallelContext())
        (85899345920, "hardware h100-sxm-80gb's device_memory")
    """
    given = given or context.max_device_memory
    if given:
        return given, "max_device_memory"
    hardware = context.hardware_profile()
    return hardware.device_memory, f"hardware {hardware.name or 'given field by field'}'s device_memory"


def fit_into(config, plan, notes: list, device_num: int | None = None, progress=None, budget: int | None = None,
             fallback=None) -> tuple:
    """`plan` (and its `notes`), the unbounded search's plan of `config`, if it fits `budget`
    bytes per device (default: the hardware profile's `device_memory`); else the config searched
    again under that budget (the search's own bounded refinement), with a note saying so; when
    that finds none either, `fallback`'s plan (`plan_within_memory`), else an `InfeasibleError`
    naming the budget and the smallest peak found."""
    where = (f"{config.path}: max_device_memory not given, so the plan must fit {memory_budget(config.context, budget)[1]}"
             if budget is None else f"{config.path}: the plan must fit")
    budget, peak = memory_budget(config.context, budget)[0], peak_of(plan)
    if peak <= budget:
        return plan, notes
    return _search_under(config, f"{where} = {budget:,} bytes per device", budget, peak, device_num, progress, fallback)


def _search_under(config, where: str, budget: int, peak: int, device_num: int | None, progress, fallback) -> tuple:
    """`config` searched under `budget` bytes per device, its unbounded plan having peaked at
    `peak` (`fit_into`); when that finds none, `fallback`'s plan, else the error."""
    bounded = replace(config, context=replace(config.context, max_device_memory=budget))
    refusal = None
    try:
        plan, notes = plan_config(bounded, device_num, progress)
    except (InfeasibleError, SolverError) as error:
        # A new error: the failed search's frames (its problem, its tables) are not held by a
        # traceback while the fallback searches.
        refusal = type(error)(f"{where}: no plan found fits it; the smallest peak found is {peak:,} bytes per device "
                              f"(the unbounded search's plan), and the search under the budget says: {error}")
    if refusal is None:
        return plan, notes + [f"{where}: the unbounded search's plan peaked at {peak:,} bytes, so it was searched under that budget"]
    if fallback is None:
        raise refusal
    return fallback(config, device_num or config.context.device_num, budget, refusal)


def run_device_num(config, options: RunOptions, table) -> int:
    """How many ranks run: --device-num, else the rank table's count, which must then agree
    with the config's `device_num` (a table is no reason to scale a plan silently)."""
    if options.device_num is not None or table is None:
        return options.device_num or config.context.device_num
    if table.device_num != config.context.device_num:
        raise ConfigError(
            f"{table.path} lists {table.device_num} device(s) but {config.path} has device_num {config.context.device_num}; "
            f"pass --device-num {table.device_num} to run the config on the table's devices (its seeds scaled), "
            f"or use a rank table of {config.context.device_num} devices"
        )
    return table.device_num


def prepare_run(config_path, options: RunOptions):
    """Load the config and the rank table, search the plan and make the job; nothing starts."""
    return _prepare(config_path, options)[:3]


@dataclass(frozen=True)
class Planned:
    """What a run planned before it started: the plan, the config, the search's seconds."""

    plan: object
    config: object
    search_seconds: float


def _prepare(config_path, options: RunOptions):
    check_run_options(options)
    table = load_rank_table(options.rank_table, options.device_num) if options.rank_table else None
    resolve_hosts(table.hosts() if table else ())  # a host with no address is refused before the search
    config = with_recompute(load_config(config_path, phase=options.phase, enable_parallel_optimizer=options.parallel_optimizer,
                                        pipeline_stages=options.pipeline_stages, micro_size=options.micro_size,
                                        pipeline_schedule=options.pipeline_schedule,
                                        pipeline_config={} if options.pipeline_schedule else None,  # the option replaces it
                                        pipeline_interleave_num=options.pipeline_interleave_num,
                                        strategy_ckpt_save_file=options.strategy_ckpt_save_file),
                            options.recompute)
    context = config.context
    check_runnable(context.precision, config.path, context.pipeline_stages > 1, context.loss_scale)  # before the search
    check_config_outputs(config, options.outputs, {"the rank table": options.rank_table} if options.rank_table else None)
    device_num = run_device_num(config, options, table)
    check_local_ranks(device_num, options)
    started = time.perf_counter()
    plan, notes = plan_config(with_table_servers(with_table_mesh(config, table, device_num), table), device_num)
    planned = Planned(plan, config, time.perf_counter() - started)
    name = f"{Path(str(config_path)).name}: {type(config.net).__name__}"
    job = make_job(plan, options.steps, options.seed, options.stall_timeout, options.fault, name, context.loss_scale)
    return job, table, notes, planned


def with_table_mesh(config, table, device_num: int):
    """`config` with the rank table's servers x devices per server as its mesh, where its mesh
    is "auto" and the search would take one (`strategies.mesh_axes`), instead of the default
    8 devices per server."""
    mesh = table.mesh() if table else None
    if mesh is None or config.context.mesh != "auto" or mesh_axes(device_num) is None or math.prod(mesh) != device_num:
        return config
    return replace(config, context=replace(config.context, mesh=mesh))


def with_table_servers(config, table):
    """`config` with the rank table's devices per server as its `devices_per_server`, when every
    server has as many: the table knows the cluster's servers. It carries no speeds, so the
    bandwidths and latencies stay the context's (or their defaults)."""
    mesh = table.mesh() if table else None
    if mesh is None or mesh[1] == config.context.hardware_profile().devices_per_server:
        return config
    return replace(config, context=replace(config.context, devices_per_server=mesh[1]))


def check_run_options(options: RunOptions) -> None:
    """A `ConfigError` for an option no run can honour, before anything is planned or started."""
    for key in ("device_num", "steps"):
        value = getattr(options, key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ConfigError(f"run option {key} must be a positive integer, got {value!r}")
    for key in ("timeout", "stall_timeout", "startup_timeout"):
        value = getattr(options, key)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
            raise ConfigError(f"run option {key} must be a positive number of seconds, got {value!r}")
    if options.backend not in ("local", "mpi"):
        raise ConfigError(f"run option backend must be 'local' or 'mpi', got {options.backend!r}")
    if options.backend == "local" and (options.run_dir or options.rank_table or options.fault):
        given = "--run-dir" if options.run_dir else "--rank-table" if options.rank_table else "--inject-fault"
        raise ConfigError(f"run option {given} means nothing with --backend local (its ranks are threads of this process: "
                          f"they write no run folder, start on no other host and are not made to fail); drop it, or use "
                          f"--backend mpi")
    if options.device_num is not None:
        check_local_ranks(options.device_num, options)


def check_local_ranks(device_num: int, options: RunOptions) -> None:
    """A `ConfigError` for more ranks than one machine starts, unless a rank table spreads them
    over hosts: --device-num, or the config's device_num (checked once it is loaded)."""
    if device_num > MAX_LOCAL_RANKS and not options.rank_table:
        raise ConfigError(f"a run on this machine starts at most {MAX_LOCAL_RANKS} ranks (threads or MPI processes), "
                          f"got device_num {device_num}; give a rank table to spread more over hosts, or plan "
                          f"them with autostrat search")


def run_config(config_path, options: RunOptions) -> tuple[int, str]:
    """Run a config end to end; returns the exit status and the text to print last.

    Example (two steps of the tutorial FFN on 8 local threads):
        >>> code, text = run_config("configs/ffn.yaml", RunOptions(backend="local"))
        >>> code, "ReduceScatter (forward) sent 6144, predicted 6144" in text
        (0, True)
    """
    outcome = run_and_measure(config_path, options)
    return outcome.code, outcome.text


@dataclass(frozen=True)
class RunOutcome:
    """A finished run: its exit status, the text to print last, what it planned, and what rank 0
    measured (`runtime.report.RunCheck.measured`; None when the ranks did not finish)."""

    code: int
    text: str
    planned: Planned
    measured: dict | None


def run_and_measure(config_path, options: RunOptions) -> RunOutcome:
    """`run_config`, keeping the plan and the measured figures (for ``autostrat run --report``)."""
    job, table, notes, planned = _prepare(config_path, options)
    if options.backend == "local":
        check = run_job_locally(job)
        return RunOutcome(0 if check.ok else 4, "\n".join(notes + [check.text]), planned, check.measured)
    run_dir = make_run_folder(options.run_dir)
    digest = save_job(job, run_dir)
    for note in notes:
        print(note, flush=True)
    result = launch(run_dir, job.device_num, table.hosts() if table else None, options.timeout, options.stall_timeout,
                    startup_timeout=options.startup_timeout, digest=digest)
    footer = f"run directory: {run_dir} (rank logs in rank_<i>/log), {result.seconds:.1f} s"
    measured = run_dir / MEASURED
    return RunOutcome(result.returncode, "\n".join([result.message, footer] if result.message else [footer]), planned,
                      json.loads(measured.read_text()) if result.returncode == 0 and measured.exists() else None)


def run_forward(net, *inputs, steps: int = 3, seed: int = 0, stall_timeout: float = 10.0):
    """Search `net`'s plan under the current parallel context and run `steps` forward passes
    on random batches, checked against the single-device result. Under mpiexec every process
    is one rank (MpiBackend, with a watchdog); otherwise all ranks run as local threads.
    Returns rank 0's `RunCheck` (None on the other ranks).

    Example:
        >>> from autostrat import nn, set_auto_parallel_context, reset_auto_parallel_context
        >>> from autostrat.models import FFN
        >>> set_auto_parallel_context(parallel_mode="auto_parallel", device_num=8)
        >>> net = FFN(); _ = net.dense1.matmul.shard(((2, 1), (1, 4)))
        >>> run_forward(net, nn.Tensor(shape=(64, 64)), steps=1).ok
        True
        >>> reset_auto_parallel_context()
    """
    from autostrat.frontend.api import parallelize
    from autostrat.runtime.job import run_steps
    from autostrat.runtime.report import format_report

    job = make_job(parallelize(net, *inputs), steps, seed, stall_timeout, name=type(net).__name__)
    if not launched_by_mpiexec():
        return run_job_locally(job)
    from autostrat.runtime.mpi import MpiBackend
    from autostrat.runtime.watchdog import Watchdog

    backend = MpiBackend()
    watchdog = Watchdog(backend.rank, stall_timeout, lambda: backend.abort(3))
    summaries = run_steps(job, backend, lambda index, _: watchdog.progress(f"instruction {index}"))
    watchdog.stop()
    return None if summaries is None else format_report(job, summaries, "MPI")
