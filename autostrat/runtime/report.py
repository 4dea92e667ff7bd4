"""The run report: per-rank bytes and peak memory predicted by the plan next to what was counted
while running, and the distance of the distributed result from the single-device one.

Each rank condenses its run into one vector (`rank_summary`): the bytes it sent each rank (as
counted at its send calls, phase "output" left out), the bytes it sent in every collective
instruction, both summed over steps, its peak memory (`executor.RankResult.peak_bytes`,
the largest over steps), then its largest absolute and relative output errors and its seconds
per step (`job.job_step_seconds`: rank 0's is the job's). Rank 0 gathers the vectors and formats them with the programs, which carry the
byte predictions, and the job, which carries the predicted peak.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from autostrat.tables import format_table
from autostrat.runtime.instructions import PHASES
from autostrat.runtime.stream import FusedAllReduce, SyncStart
from autostrat.runtime.reference import OWN_KERNELS, reference_line

# What each byte phase counts, in one line for the reports.
PHASE_LEGEND = ("forward/backward = the plan's redistributions; sync = gradient synchronisation; "
                "update = writing new parameters and state back to their layouts; pipeline = activations and their "
                "gradients sent between pipeline stages; output = assembling split or "
                "partial graph outputs (a training step's loss) on every rank for the check, not part of the plan")
STEP_TIMING = "the median step after the first, from the first rank's start to the last rank's end"  # `job.job_step_seconds`
MEASURED = "measured.json"  # rank 0 saves `RunCheck.measured` there, in the run directory
MEMORY_TOLERANCE = 0.05  # how far a rank's measured peak may be from the predicted one (issue #16)


@dataclass(frozen=True)
class RunCheck:
    """The result of one run, as rank 0 sees it."""

    text: str
    bytes_match: bool
    results_match: bool
    # Per phase the bytes each rank was predicted to send per step and sent, and each rank's
    # predicted and measured peak, and the bytes per step each rank sent each rank as counted at
    # its send calls (phase "output" left out): {"phases": {phase: {"predicted": [...], "measured":
    # [...]}}, "peak": {"predicted": [...], "measured": [...]}, "traffic": [[...] per rank]} (the
    # plan report draws them).
    measured: dict | None = None

    @property
    def ok(self) -> bool:
        return self.bytes_match and self.results_match


def rank_summary(traffic_sums: list[int], peak: int, errors: tuple[float, float, float], seconds: float,
                 sent_to: list[int]) -> np.ndarray:
    return np.array([*sent_to, *traffic_sums, peak, *errors, seconds], np.float64)


def _instruction_sent(summary: np.ndarray, device_num: int) -> np.ndarray:
    return summary[device_num:]  # a `rank_summary` starts with the bytes sent to each rank


def _peak(summary: np.ndarray) -> int:
    # A `rank_summary` ends with the peak, the errors (absolute, relative, tolerance, the worst
    # tensor's index in `Job.checked_names`: `Job.worst_index`) and the seconds.
    return int(summary[-6])


def memory_line(predicted: int | list[int], measured: list[int]) -> str:
    """The peak memory per device the plan predicted (one figure, or one per rank: a
    pipeline's stages differ) and each rank measured, in one line (ranks with the same peak
    grouped). Informative: a run is not failed on memory.

    Example:
        >>> memory_line(1000, [990, 990, 1080, 990])
        'peak memory per device (bytes): predicted 1000; measured (arrays held) rank 0-1 990, rank 2 1080, rank 3 990; measured/predicted 0.990..1.080: differs by more than 5 %'
        >>> memory_line([10, 10, 20, 20], [10, 10, 20, 20])
        'peak memory per device (bytes): predicted rank 0-1 10, rank 2-3 20; measured (arrays held) rank 0-1 10, rank 2-3 20; measured/predicted 1.000..1.000: equal'
    """
    per_rank = list(predicted) if isinstance(predicted, (list, tuple)) else [predicted] * len(measured)
    ratios = [value / expected if expected else float("inf") for value, expected in zip(measured, per_rank)]
    within = max(abs(ratio - 1) for ratio in ratios) <= MEMORY_TOLERANCE
    verdict = f"{'within' if within else 'differs by more than'} {MEMORY_TOLERANCE * 100:g} %"
    shown = _grouped(per_rank) if len(set(per_rank)) > 1 else str(per_rank[0])
    return (f"peak memory per device (bytes): predicted {shown}; measured (arrays held) {_grouped(measured)}; measured/predicted "
            f"{min(ratios):.3f}..{max(ratios):.3f}: {'equal' if list(measured) == per_rank else verdict}")


def _grouped(values: list[int]) -> str:
    return ", ".join(f"rank {_span(first, last)} {value}" for first, last, value in _runs(values))


def _runs(values: list[int]) -> list[tuple[int, int, int]]:
    """(first rank, last rank, value) of every run of ranks with the same value."""
    runs = []
    for rank, value in enumerate(values):
        if runs and runs[-1][2] == value:
            runs[-1] = (runs[-1][0], rank, value)
        else:
            runs.append((rank, rank, value))
    return runs


def _span(first: int, last: int) -> str:
    return str(first) if first == last else f"{first}-{last}"


def format_report(job, summaries: list[np.ndarray], backend: str) -> RunCheck:
    """The report rank 0 prints, from every rank's `rank_summary` (in rank order)."""
    steps = len(job.batches)
    kind = "training" if job.training else "forward"
    phases = [p for p in PHASES if any(c.phase == p for program in job.programs for c in program.communications())]
    phases = phases or ["forward"]
    rows, bytes_match = [], True
    peaks = {"predicted": list(_predicted_peaks(job)), "measured": [_peak(summary) for summary in summaries]}
    figures = {"phases": {phase: {"predicted": [], "measured": []} for phase in phases}, "peak": peaks,
               "traffic": [[value / steps for value in summary[: job.device_num]] for summary in summaries]}
    for rank, summary in enumerate(summaries):
        communications = job.programs[rank].communications()
        sent = _instruction_sent(summary, job.device_num)[: len(communications)]
        row = [str(rank)]
        for phase in phases:
            predicted = sum(c.predicted for c in communications if c.phase == phase)
            measured = sum(int(s) for s, c in zip(sent, communications) if c.phase == phase)
            bytes_match &= measured == predicted * steps
            row += [str(predicted), _per_step(measured, steps)]
            figures["phases"][phase]["predicted"].append(predicted)
            figures["phases"][phase]["measured"].append(measured / steps)
        rows.append(row + [str(peaks["predicted"][rank]), str(peaks["measured"][rank])])
    absolute = max(float(s[-5]) for s in summaries)
    worst = max(summaries, key=lambda s: float(s[-4]))
    relative, worst_name = float(worst[-4]), job.checked_names()[int(worst[-2])] if worst[-2] >= 0 else ""
    if job.gradient_error > relative:  # the launcher's check of autostrat's stand-alone gradients
        relative, worst_name = job.gradient_error, job.gradient_worst
    tolerance = max(float(s[-3]) for s in summaries)
    seconds = max(float(s[-1]) for s in summaries)
    results_match = relative <= tolerance
    headers = ["rank"] + [f"{phase} {what}" for phase in phases for what in ("predicted", "sent")]
    headers += ["peak predicted", "peak measured"]
    compared = ("every step's outputs and the final parameters and optimiser state, each tensor on its own scale; the "
                "stand-alone run's gradients" if job.training else "every step's outputs, each tensor on its own scale")
    if job.tolerance:  # a 16-bit run (`reference.sixteen_bit_tolerance`): no fp32 stand-alone gradients to compare
        compared = ("every step's outputs, the final 16-bit parameters, their fp32 main copies and the optimiser state, "
                    "each tensor on its own scale")
    lines = [
        f"{job.name} on {job.device_num} ranks ({backend}), {steps} {kind} step(s)",
        job.plan_table,
        "",
        f"bytes each rank sent per {kind} step: predicted by the plan / counted at the send call of every message,",
        "and peak bytes each rank held: predicted by the plan's memory model / measured on the rank's live buffers",
        f"({PHASE_LEGEND})",
        format_table(headers, rows),
        *_collective_lines(job, summaries),
        *_bucket_lines(job),
        f"bytes: {'measured = predicted on every rank' if bytes_match else 'MISMATCH between measured and predicted'}",
        memory_line(peaks["predicted"], peaks["measured"]),
        f"max difference from the single-device result ({compared}): {absolute:.3g} (relative {relative:.3g}, "
        f"limit {tolerance:g}): {'OK' if results_match else 'FAILED'}",
        reference_line(job.reference or OWN_KERNELS, worst_name, relative, tolerance) + _pooled_note(job),
        f"time per {kind} step: {seconds * 1e3:.2f} ms on {job.device_num} ranks ({STEP_TIMING}), "
        f"{job.single_seconds * 1e3:.2f} ms single device",
    ]
    return RunCheck("\n".join(lines), bytes_match, results_match, figures)


def _bucket_lines(job) -> list[str]:
    """A line saying how the gradient synchronisation ran, when it ran in buckets (`runtime.stream`)."""
    starts = [i for i in getattr(job.programs[0], "instructions", ()) if isinstance(i, SyncStart)]  # a stage program has none
    if not starts:
        return []
    steps = [step for start in starts for step in start.steps]
    fused = [step for step in steps if isinstance(step, FusedAllReduce)]
    joined = f" ({sum(len(step.steps) for step in fused)} gradients fused into {len(fused)} AllReduce(s))" if fused else ""
    return [f"gradient synchronisation: {len(steps)} step(s) in {len(starts)} bucket(s) on the communication stream{joined}, "
            f"begun as each bucket's gradients were final and progressed between the backward's kernels"]


def _pooled_note(job) -> str:
    if not job.pooled:
        return ""
    return f" ({', '.join(job.pooled)}: zero exact gradient, compared on the scale of their kind)"


def _predicted_peaks(job) -> tuple[int, ...]:
    return job.predicted_peaks or (job.predicted_peak,) * job.device_num


def _per_step(measured: int, steps: int) -> str:
    return str(measured // steps) if measured % steps == 0 else f"{measured / steps:.1f}"


def _collective_lines(job, summaries) -> list[str]:
    """One line per collective instruction: rank 0's kind and the distinct per-rank bytes."""
    steps = len(job.batches)
    lines = ["collectives (bytes per rank per step):"]
    groups: dict[tuple, list[int]] = {}  # the ranks running the same instructions (a pipeline: one stage's)
    for rank, program in enumerate(job.programs):
        groups.setdefault(tuple((c.edge, c.kind, c.phase) for c in program.communications()), []).append(rank)
    for ranks in groups.values():
        if len(groups) > 1:
            lines.append(f" ranks {_span(ranks[0], ranks[-1]) if ranks == list(range(ranks[0], ranks[-1] + 1)) else ranks}:")
        for index, step in enumerate(job.programs[ranks[0]].communications()):
            sent = sorted({int(_instruction_sent(summaries[rank], job.device_num)[index]) // steps for rank in ranks})
            predicted = sorted({job.programs[rank].communications()[index].predicted for rank in ranks})
            lines.append(f"  {step.edge}: {step.kind} ({step.phase}) sent {_values(sent)}, predicted {_values(predicted)}")
    return lines if len(lines) > 1 else ["collectives: none"]


def _values(values: list[int]) -> str:
    return str(values[0]) if len(values) == 1 else "/".join(map(str, values))
