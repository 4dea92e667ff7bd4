"""A job: everything the ranks of one run need, made once by the launcher and read by every rank.

The launcher searches the plan, lowers it, draws the random batches and computes the
single-device reference, then writes the job as data (`job_file.save_job`: JSON and ``.npz``
in ``RUN_DIR/job/``, no pickle) and gives every rank its digest. Ranks only read it
(`job_file.load_job`, after checking the digest), so a rank imports neither the search nor the
front end, and all ranks run the very same program. Across hosts the run directory must be on
a filesystem every host sees.
"""

from __future__ import annotations

import socket
import statistics
import time
import zlib
from dataclasses import dataclass, replace

import numpy as np

from autostrat.errors import ConfigError
from autostrat.runtime.backend import check_world
from autostrat.runtime.executor import execute, graph_values, single_device_run
from autostrat.runtime.pipeline import StageRunner, pipeline_values, stage_peaks_per_rank
from autostrat.runtime.program import lower_programs
from autostrat.runtime.instructions import LOCAL_KINDS, Load, Program
from autostrat.runtime.stage_program import StageProgram, lower_stage_programs
from autostrat.runtime.reference import reference_run, sixteen_bit_tolerance, tensor_errors
from autostrat.runtime.report import rank_summary
from autostrat.runtime.training import reference_graph
from autostrat.search.precision import check_runnable

FAULTS = ("hang", "kill", "loop", "raise", "stop")


@dataclass(frozen=True)
class Fault:
    """A failure to inject (fault tests): `rank` does `kind` before instruction `at`."""

    rank: int
    kind: str
    at: int


@dataclass(frozen=True)
class Job:
    name: str
    device_num: int
    programs: tuple[Program, ...]
    values: dict
    batches: tuple[dict, ...]
    expected: tuple[dict, ...]
    plan_table: str
    plan_bytes: int
    predicted_peak: int  # the plan's peak memory per device (`search.memory.peak_bytes`)
    single_seconds: float
    stall_timeout: float = 10.0
    fault: Fault | None = None
    final: dict | None = None  # a training job: the whole parameters and state after the last step
    predicted_peaks: tuple[int, ...] = ()  # per rank, when ranks differ (a pipeline's stages); else predicted_peak
    reference: str = ""  # the library that computed `expected` and `final` (`reference.Reference.library`)
    pooled: tuple[str, ...] = ()  # parameters compared on their kind's scale (`reference.Reference.noise_driven`)
    gradient_worst: str = ""  # the gradient of autostrat's stand-alone run furthest from the reference's
    gradient_error: float = 0.0  # its relative error (each gradient on its own scale)
    tolerance: float = 0.0  # a 16-bit run's limit on every tensor (`reference.sixteen_bit_tolerance`); 0: by dtype

    def checked_names(self) -> tuple[str, ...]:
        """The tensors a rank compares, in the order `rank_summary` indexes its worst one by."""
        return tuple(sorted(self.expected[0] if self.expected else ())) + tuple(sorted(self.final or ()))

    def worst_index(self, errors: tuple) -> tuple:
        """`reference.tensor_errors` with the worst tensor's name as its index in `checked_names`."""
        names = self.checked_names()
        return (*errors[:3], names.index(errors[3]) if errors[3] in names else -1)

    @property
    def training(self) -> bool:
        return self.final is not None


def integer_bound(graph, tensor: str) -> int:
    """Exclusive upper bound of valid values of an integer graph input: the rows of the table
    a Gather reads with it, or a OneHot's depth (2 when no consumer says)."""
    bounds = []
    for op_name, index in graph.consumers(tensor):
        op = graph.ops[op_name]
        if op.op_type == "Gather" and index == 1:
            bounds.append(graph.tensors[op.inputs[0]].shape[op.attr_dict.get("axis", 0)])
        elif op.op_type == "OneHot":
            bounds.append(op.attr_dict["depth"])
    return min(bounds, default=2)


# Ops that move an index tensor's values unchanged: an index input read through them is still one.
_MOVES_VALUES = ("BroadcastTo", "ExpandDims", "Identity", "Reshape", "Slice", "Squeeze", "Transpose")


def _index_reader(graph, tensor: str) -> tuple[int, str] | None:
    """The tightest ``(exclusive bound, op)`` of the Gathers (table rows) and OneHots (depth)
    that read `tensor` as indices, directly or through ops that only move values; None if none."""
    found = []
    for op_name, index in graph.consumers(tensor):
        op = graph.ops[op_name]
        if op.op_type == "Gather" and index == 1:
            found.append((graph.tensors[op.inputs[0]].shape[op.attr_dict.get("axis", 0)], op_name))
        elif op.op_type == "OneHot":
            found.append((op.attr_dict["depth"], op_name))
        elif op.op_type in _MOVES_VALUES and index == 0:
            found += [reader for output in op.outputs if (reader := _index_reader(graph, output))]
    return min(found, default=None)


def check_indices(graph, batch: dict, where: str) -> None:
    """A `ConfigError` naming `where`, the input and the value, when an integer input of `batch`
    holds an index its Gather or OneHot cannot take: MindSpore refuses those, where a OneHot
    would give a row of zeros (a loss of 0) and a Gather would read past its table.

    Example:
        >>> from autostrat.frontend import trace
        >>> from autostrat.models import GPT
        >>> from autostrat.nn import Tensor
        >>> graph = trace(GPT(layers=1, hidden=16, heads=2, seq=4, batch=2, vocab=8),
        ...               Tensor(shape=(2, 4), dtype="int32"), Tensor(shape=(8,), dtype="int32"))
        >>> check_indices(graph, {"labels": np.full(8, 8, np.int32)}, "dataset element 0")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        autostrat.errors.ConfigError: dataset element 0: input labels holds 8, but ... reads it as an index in [0, 8)
    """
    for name, array in batch.items():
        array = np.asarray(array)
        if name not in graph.tensors or array.dtype.kind not in "iu" or not array.size:
            continue
        reader = _index_reader(graph, name)
        low, high = int(array.min()), int(array.max())
        if reader is not None and (low < 0 or high >= reader[0]):
            raise ConfigError(f"{where}: input {name} holds {low if low < 0 else high}, but {reader[1]} "
                              f"({graph.ops[reader[1]].op_type}) reads it as an index in [0, {reader[0]})")


def random_batch(graph, rng: np.random.Generator) -> dict:
    """One batch of every graph input: standard normal floats, integers in their valid range."""
    batch = {}
    for info in graph.inputs():
        if np.issubdtype(np.dtype(info.dtype), np.integer):
            batch[info.name] = rng.integers(0, integer_bound(graph, info.name), size=info.shape).astype(info.dtype)
        else:
            batch[info.name] = rng.standard_normal(info.shape).astype(info.dtype)
    return batch


def _checked_fault(fault: Fault, plan, programs) -> Fault:
    """`fault` with its instruction (default: the rank's first collective, mid-run), after
    checking that it can fire: a `ConfigError` otherwise, before anything starts."""
    if plan.pipeline is not None:
        raise ConfigError("fault injection runs plans without pipeline stages")
    if not (0 <= fault.rank < plan.device_num and fault.kind in FAULTS):
        raise ConfigError(f"a fault is a rank below {plan.device_num} and one of {FAULTS}, got {fault}")
    count = len(programs[fault.rank].instructions)
    if fault.at < 0:
        collectives = [i for i, ins in enumerate(programs[fault.rank].instructions) if getattr(ins, "kind", "Slice") not in LOCAL_KINDS]
        return Fault(fault.rank, fault.kind, collectives[0] if collectives else 0)
    if fault.at >= count:
        raise ConfigError(f"a fault at instruction {fault.at} of rank {fault.rank} never fires: its program has {count} "
                          f"instructions (0 to {count - 1})")
    return fault


def make_job(plan, steps: int = 1, seed: int = 0, stall_timeout: float = 10.0, fault: Fault | None = None, name: str = "",
             loss_scale: float = 1.0) -> Job:
    """Lower `plan` and prepare `steps` random batches with their single-device results (a
    pipeline plan's: its stage programs, and the whole batch's reference; `reference_graph`).
    A 16-bit plan runs with the static `loss_scale` (`precision.check_runnable` refuses fp16
    without one): the ranks are fed the sensitivity scaled by it and unscale every gradient."""
    check_runnable(plan.precision, pipeline=plan.pipeline is not None, loss_scale=loss_scale)
    graph = reference_graph(plan)
    programs = lower_programs(plan) if plan.pipeline is None else lower_stage_programs(plan)
    device_num = len(programs)
    if fault is not None:
        fault = _checked_fault(fault, plan, programs)
    rng = np.random.default_rng(seed)
    values = graph_values(graph, {})
    batches = tuple(random_batch(graph, rng) for _ in range(steps))
    reference = reference_run(graph, values, batches, plan.precision, loss_scale)
    started = time.perf_counter()
    gradient_names = tuple(f"grad/{name}" for name in (reference.gradients[0] if reference.gradients else ()))
    own, _ = single_device_run(graph, values, batches, keep=gradient_names)
    single = (time.perf_counter() - started) / max(steps, 1)
    # autostrat's stand-alone run is fp32: its gradients are checked against an fp32 reference only
    gradients = _gradient_errors(reference, own) if plan.precision == "fp32" else (0.0, 0.0, 0.0, "")
    peaks = () if plan.pipeline is None else stage_peaks_per_rank(plan)
    values = values if plan.pipeline is None else pipeline_values(plan, values)
    if loss_scale != 1:
        programs, values = _loss_scaled(plan.graph, programs, values, loss_scale)
    return Job(name or plan.graph.name, device_num, programs, values, batches, reference.outputs, plan.table(), plan.total_bytes,
               max(peaks, default=plan.prediction.peak_bytes), single, stall_timeout, fault, reference.final or None, peaks,
               reference.library, reference.noise_driven, gradients[3], gradients[1], sixteen_bit_tolerance(plan.precision, steps))


def _loss_scaled(graph, programs: tuple, values: dict, loss_scale: float) -> tuple[tuple, dict]:
    """The programs with their `loss_scale`, and `values` with the backward's sensitivity
    (``grad/<loss>``, ones: `autodiff.backward`) scaled by it."""
    sensitivity = f"grad/{graph.outputs[0]}"
    if sensitivity not in values:
        raise ConfigError(f"loss_scale {loss_scale:g}: the graph {graph.name} has no sensitivity {sensitivity} to scale "
                          f"(a loss scale needs a training graph)")
    ones = np.asarray(values[sensitivity])
    scaled = values | {sensitivity: np.asarray(ones * loss_scale, ones.dtype)}  # an array even when 0-d
    return tuple(replace(program, loss_scale=loss_scale) for program in programs), scaled


def _gradient_errors(reference, own: tuple[dict, ...]) -> tuple:
    """`tensor_errors` of autostrat's stand-alone gradients (``grad/<parameter>``) against the
    reference's, over every step; nothing to compare with the fallback reference."""
    errors = (0.0, 0.0, 0.0, "")
    for expected, outputs in zip(reference.gradients, own):
        expected = {f"grad/{name}": array for name, array in expected.items()}
        errors = _worst(errors, tensor_errors(outputs, expected, reference.noise_driven))
    return errors


def own_slices(program: Program, whole: dict) -> dict:
    """This rank's slices of the whole arrays in `whole`, where its program loads them."""
    ranges = {ins.tensor: ins.ranges for ins in program.instructions if isinstance(ins, Load)}
    return {name: array[tuple(slice(a, b) for a, b in ranges[name])] for name, array in whole.items()}


def _worst(errors: tuple, more: tuple) -> tuple:
    """The larger absolute error and tolerance, and the larger relative error with its tensor."""
    worse = more if more[1] > errors[1] or not errors[3] else errors
    return max(errors[0], more[0]), worse[1], max(errors[2], more[2]), worse[3]


def step_seconds(times: list[float]) -> float:
    """The seconds of one step as a run reports it: the median of the steps after the first
    (a warm-up: its first touches of every buffer and code path), the first alone when it is
    the only one.

    Example:
        >>> step_seconds([9.0, 1.0, 3.0, 2.0]), step_seconds([9.0])
        (2.0, 9.0)
    """
    return statistics.median(times[1:]) if len(times) > 1 else times[0] if times else 0.0


def job_step_seconds(backend, starts: list[float], ends: list[float]) -> float:
    """`step_seconds` of the job's steps: on rank 0, each step from the first rank's start to
    the last rank's end where every rank runs on this host (`time.perf_counter`, the host's
    monotonic clock, is one clock for them all), else each rank's own run, the slowest; on
    the other ranks their own. Each rank starts a step as it leaves a barrier of every rank
    (a rank's first collective would otherwise wait for the others' check of the step before);
    no barrier ends it (its wake-ups, milliseconds where ranks share cores, would be timed as
    the step's). Ranks sharing cores that never wait for one another each run their step in
    turn, within their own slices: the job's step is the whole turn, where one rank's is a
    fraction of it (8 ranks on 2 cores: a quarter).

    Example (rank 0 of two on this host; rank 1 starts and ends each step 0.5 s later):
        >>> class TwoRanks:
        ...     def gather_report(self, values):
        ...         return [values, values + [0, 0.5, 0.5, 0.5, 0.5]]
        >>> job_step_seconds(TwoRanks(), [0.0, 10.0], [1.0, 11.0])
        1.5
    """
    host = zlib.crc32(socket.gethostname().encode())
    gathered = backend.gather_report(np.array([host, *starts, *ends], np.float64))
    own = [end - start for start, end in zip(starts, ends)]
    if gathered is None:
        return step_seconds(own)
    count = len(starts)
    if len({float(vector[0]) for vector in gathered}) > 1:  # hosts' clocks differ: each rank's own step
        return max(step_seconds([e - s for s, e in zip(v[1:1 + count], v[1 + count:])]) for v in gathered)
    first = np.min([v[1:1 + count] for v in gathered], axis=0)
    last = np.max([v[1 + count:] for v in gathered], axis=0)
    return step_seconds([float(e - s) for s, e in zip(first, last)])


def run_steps(job: Job, backend, on_instruction=None, on_gather=None, log=None) -> list | None:
    """Run every batch of the job on this rank and compare with the single-device results
    (a training job carries its parameters and state from step to step and compares them too
    after the last step); rank 0 gets every rank's `report.rank_summary` (in rank order, with
    the rank's peak memory over all steps), the others None."""
    check_world(job.device_num, backend, f"the job {job.name!r}")
    program = job.programs[backend.rank]
    if isinstance(program, StageProgram):
        return _run_stage_steps(job, program, backend, on_instruction, on_gather, log)
    sums = np.zeros(len(program.communications()), np.int64)
    sent_to = np.zeros(job.device_num, np.int64)
    errors, peak = (0.0, 0.0, 0.0, ""), 0
    resident = {} if job.training else None
    starts, ends = [], []
    for batch, expected in zip(job.batches, job.expected):
        backend.barrier()  # every rank starts the step together (`job_step_seconds`)
        starts.append(time.perf_counter())
        result = execute(program, backend, job.values | batch, on_instruction, resident)
        ends.append(time.perf_counter())
        resident = result.updated if job.training else None
        sums += result.sent()
        sent_to += result.sent_to(job.device_num)
        peak = max(peak, result.peak_bytes)
        errors = _worst(errors, tensor_errors(result.outputs, expected, limit=job.tolerance))
    seconds = job_step_seconds(backend, starts, ends)
    if job.training:
        errors = _worst(errors, tensor_errors(resident, own_slices(program, job.final), job.pooled, job.tolerance))
    if on_gather is not None:
        on_gather()
    if log is not None:
        log(f"rank {backend.rank}: {len(job.batches)} step(s), sent {sums.tolist()} bytes, peak {peak} bytes, errors {errors}")
    return backend.gather_report(rank_summary(sums.tolist(), peak, job.worst_index(errors), seconds, sent_to.tolist()))


def _run_stage_steps(job: Job, program: StageProgram, backend, on_instruction, on_gather, log) -> list | None:
    """`run_steps` for a pipeline rank: the loss (the last stage's) and the final parameters
    and state of the stage are compared with the single-device run of the whole batch."""
    runner, resident, errors = StageRunner(program, backend, on_instruction), {}, (0.0, 0.0, 0.0, "")
    starts, ends = [], []
    for batch, expected in zip(job.batches, job.expected):
        backend.barrier()
        starts.append(time.perf_counter())
        losses, resident = runner.step(job.values, batch, resident)
        ends.append(time.perf_counter())
        outputs = {tensor: np.float32(np.mean(losses)) for tensor, _ in program.outputs}
        errors = _worst(errors, tensor_errors(outputs, {name: expected[name] for name in outputs}))
    seconds = job_step_seconds(backend, starts, ends)
    if resident:
        errors = _worst(errors, tensor_errors(resident, program.own_slices(job.final), job.pooled))
    if on_gather is not None:
        on_gather()
    if log is not None:
        log(f"rank {backend.rank}: {len(job.batches)} step(s), stage {program.stage}, sent {runner.sent.tolist()} bytes, "
            f"peak {runner.held.peak} bytes, errors {errors}")
    # Stages run different instructions: every rank's counts padded to the longest, so that
    # all summaries have one length (the report reads each rank's own first ones).
    longest = max(len(p.communications()) for p in job.programs)
    sent = runner.sent.tolist() + [0] * (longest - len(runner.sent))
    return backend.gather_report(rank_summary(sent, runner.held.peak, job.worst_index(errors), seconds, runner.sent_to.tolist()))
