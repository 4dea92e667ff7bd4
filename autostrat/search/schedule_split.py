"""The stage split priced by its schedule: a split of the model's units into the model stages of
a pipeline schedule (`schedules.Schedule`), its step time simulated from the schedule's orders
and its memory replayed from them.

Prices of a split (`priced_split`), per model stage from its units' `stages.UnitCosts`:

- F, B and W (`stage_times`): the units' forward, input-gradient and weight-gradient
  nanoseconds of one micro-batch (`stages.unit_costs` classifies backward ops by the runtime's
  B/W rule: `stages.weight_ops`), a send of the stage's output counted in its F and of its input's
  gradient in its B when the next (previous) stage is on another device group (the ranks block
  on a send; two chunks of one device group pass nothing). Schedules that do not split the
  backward run B and W as one.
- The step and bubble: `schedule_simulation.simulate` of the orders on those times. Every
  per-micro-batch cost (its compute and communication) is paid once per micro-batch by
  construction: the orders run each micro-batch's F, B and W.
- Memory per device group (`group_peaks`): its chunks' parameters and optimiser state, plus the
  most it holds at any moment of its order: per chunk the activations of the micro-batches in
  flight (from a forward to its backward; where the backward is split, from B to W only what
  the W ops read, `UnitCosts.weight_held_bytes`), the gradient sums once the chunk's first backward made them, the gradients the
  instruction freeing a micro-batch's activations writes while the activations of the units it
  has yet to reach live (`_overlap`, unit by unit: all of them in the first micro-batch, whose
  gradients become the sums; a unit's largest in a later one, which adds each into its sum as it
  is made, as the runtime and Megatron do; where the backward is split, W's walk op by op,
  `_weight_overlap`: what its ops still read freed after their last reader, as the runtime
  frees it), and, where a backward starts, the first activation gradient it writes. Under
  recompute, the unit a backward walks also holds what its recompute copies made
  (`UnitCosts.recomputed_bytes`: left out, 1F1B's last stage was 9.1 % under its measured peak).

`split_stages` finds the split with the least simulated step whose model fits the budget:
every split when there are at most `EXHAUSTIVE_SPLITS` (so exact: tested against brute force),
else the split with the least slowest stage (`stages.min_max_split`, by dynamic programming),
then boundaries moved one unit at a time while the simulated step falls.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

from autostrat.errors import ConfigError, InfeasibleError
from autostrat.search.schedule_simulation import StageTimes, simulate
from autostrat.search.schedules import Schedule, schedule_orders
from autostrat.search.stages import StageSplit, UnitCosts, min_max_split

EXHAUSTIVE_SPLITS = 2048  # splits priced one by one (each a simulation) before the DP and descent take over
DESCENT_ROUNDS = 64  # passes over the boundaries moving each one unit (a pass that improves nothing ends it)


def stage_times(costs: UnitCosts, bounds: tuple[tuple[int, int], ...], schedule: Schedule) -> StageTimes:
    """Per model stage of `bounds` (``[first, end)`` unit ranges, one per stage of `schedule`),
    one micro-batch's F, B and W nanoseconds, sends included (module docstring).

    Example (2 stages on 2 devices, send 5: stage 0's forward sends on, stage 1's backward back):
        >>> from autostrat.search.schedules import schedule_orders
        >>> costs = UnitCosts((30, 30), (1, 1), (1, 1), 5, forward_ns=(10, 10), weight_gradient_ns=(5, 5))
        >>> stage_times(costs, ((0, 1), (1, 2)), schedule_orders("1f1b", 2, 2))
        StageTimes(forward_ns=(15, 10), backward_ns=(15, 20), weight_ns=(5, 5), send_ns=(0,))
    """
    stages, forward, backward, weight = len(bounds), [], [], []
    for stage, (first, end) in enumerate(bounds):
        on = stage < stages - 1 and schedule.device(stage + 1) != schedule.device(stage)
        back = stage > 0 and schedule.device(stage - 1) != schedule.device(stage)
        f, w = sum(costs.forward_ns[first:end]), sum(costs.weight_gradient_ns[first:end])
        forward.append(f + costs.send_ns * on)
        backward.append(sum(costs.time_ns[first:end]) - f - w + costs.send_ns * back)
        weight.append(w)
    return StageTimes(tuple(forward), tuple(backward), tuple(weight), (0,) * (stages - 1))


def group_peaks(costs: UnitCosts, bounds: tuple[tuple[int, int], ...], schedule: Schedule) -> tuple[int, ...]:
    """Per device group of `schedule`, the most bytes one of its devices holds by the split's
    memory model (module docstring), replaying the group's order.

    Example (1F1B's first of 2 stages holds 2 micro-batches, the last 1; 10 bytes each, weights 1):
        >>> from autostrat.search.schedules import schedule_orders
        >>> group_peaks(UnitCosts((1, 1), (10, 10), (1, 1)), ((0, 1), (1, 2)), schedule_orders("1f1b", 2, 4))
        (21, 11)
    """
    return tuple(_group_peak(costs, bounds, schedule, device) for device in range(schedule.devices))


def _group_peak(costs: UnitCosts, bounds, schedule: Schedule, device: int) -> int:
    """One device group's peak by the split's model (`group_peaks`)."""
    stages = [schedule.stage(device, chunk) for chunk in range(schedule.chunks)]
    split = schedule.split_backward
    parts = [_ChunkBytes.of(costs, *bounds[stage], costs.send_bytes * (stage > 0), split) for stage in stages]
    kept, waiting, sums, peak = [0] * schedule.chunks, [0] * schedule.chunks, [0] * schedule.chunks, 0
    for instruction in schedule.orders[device]:
        chunk, kind = instruction.chunk, instruction.kind
        part = parts[chunk]
        if kind == "F":
            kept[chunk] += 1
            extra = part.first  # a backward may start now, all of these held
        elif kind == "B" and split:  # its activations while it runs, what W needs kept after it
            kept[chunk], waiting[chunk] = kept[chunk] - 1, waiting[chunk] + 1
            extra = part.input_gradient - part.weight_held
        elif kind == ("W" if split else "B"):
            # What it reads and the gradients it writes (`_overlap`): the first micro-batch's
            # gradients become the sums, a later one's are added into them as they are made.
            if split:
                waiting[chunk] -= 1
            else:
                kept[chunk] -= 1
            extra = part.summed if sums[chunk] else part.overlap - part.gradients
            sums[chunk] = 1
        else:
            continue
        held = sum(k * p.activations + w * p.weight_held + s * p.gradients for k, w, s, p in zip(kept, waiting, sums, parts))
        peak = max(peak, held + extra)
    weights = sum(sum(costs.weight_bytes[first:end]) for first, end in (bounds[stage] for stage in stages))
    return weights + peak


@dataclass(frozen=True)
class _ChunkBytes:
    """One model stage's bytes per micro-batch in the split's model: its activations (with the
    input it received), what it keeps from B to W, its gradients, the first activation gradient
    its backward writes, the most the instruction writing its gradients holds (`_overlap`:
    before and once the sums exist), and the most its B holds where the backward is split."""

    activations: int
    weight_held: int
    gradients: int
    first: int
    overlap: int
    summed: int
    input_gradient: int

    @classmethod
    def of(cls, costs: UnitCosts, first: int, end: int, received: int, split: bool) -> _ChunkBytes:
        kept = costs.weight_held_bytes if split else costs.activation_bytes  # what the gradients' writer reads
        # B walking back: the units it has not reached hold all theirs, the one it walks what it recomputed
        walk = max(received + sum(costs.activation_bytes[first:unit + 1]) + sum(kept[unit + 1:end]) + costs.transient_bytes[unit]
                   + costs.recomputed_bytes[unit] for unit in range(first, end))
        if split:  # W frees what it reads op by op (`UnitCosts.weight_walk_bytes`); B has freed the received input
            overlap = _weight_overlap(costs, first, end, costs.weight_walk_bytes, with_later_gradients=True)
            summed = _weight_overlap(costs, first, end, costs.weight_walk_summed_bytes, with_later_gradients=False)
        else:
            overlap, summed = _overlap(costs, first, end, received), _overlap(costs, first, end, received, summed=True)
        return cls(sum(costs.activation_bytes[first:end]) + received, sum(kept[first:end]), sum(costs.gradient_bytes[first:end]),
                   costs.transient_bytes[end - 1], overlap, summed, walk)


def _overlap(costs: UnitCosts, first: int, end: int, received: int, summed: bool = False) -> int:
    """The most a stage of units ``[first, end)`` holds of one micro-batch while its backward
    (where it is not split) writes its gradients: walking its units back from the last, unit
    ``u`` still holds its activations and those of the units before it, and the stage's
    received input, when the gradients of ``u`` and of the units after it are written; once the
    step's sums exist (`summed`), each gradient is added into its sum as it is made, and only
    one of unit ``u``'s at a time, at most its largest, is held beside them, with the activation
    gradient its backward passes on (`UnitCosts.transient_bytes`); under recompute, unit ``u``'s
    recomputed activations beside them (`UnitCosts.recomputed_bytes`).

    Example (the last unit's big gradient is written while both units' activations live; once
    summed, its largest part, 20, and an activation gradient of 3 are held beside them):
        >>> costs = UnitCosts((1, 1), (10, 10), (1, 1), gradient_bytes=(1, 30), transient_bytes=(3, 3),
        ...                   largest_gradient_bytes=(1, 20))
        >>> _overlap(costs, 0, 2, 0), _overlap(costs, 0, 2, 0, summed=True)
        (50, 43)
    """
    kept, again = costs.activation_bytes, costs.recomputed_bytes
    if summed:
        return max(received + sum(kept[first:unit + 1]) + again[unit] + costs.largest_gradient_bytes[unit]
                   + costs.transient_bytes[unit] for unit in range(first, end))
    return max(received + sum(kept[first:unit + 1]) + again[unit] + sum(costs.gradient_bytes[unit:end])
               for unit in range(first, end))


def _weight_overlap(costs: UnitCosts, first: int, end: int, walks: tuple[int, ...], with_later_gradients: bool) -> int:
    """The most a stage of units ``[first, end)`` holds of one micro-batch while its W runs:
    walking its units back from the last, unit ``u``'s own walk (`walks`: what its W ops still
    read beside the gradients they write) beside all that the W of the units before it reads
    (`UnitCosts.weight_held_bytes`) and, in the first micro-batch (`with_later_gradients`),
    the gradients of the units after it, which became the sums.

    Example (unit 1's walk peaks at 25 beside unit 0's 10 held; in the first micro-batch unit
    0's walk, 12, also has unit 1's gradients, 30, beside it):
        >>> costs = UnitCosts((1, 1), (10, 10), (1, 1), gradient_bytes=(2, 30), weight_walk_bytes=(12, 25))
        >>> _weight_overlap(costs, 0, 2, costs.weight_walk_bytes, True), _weight_overlap(costs, 0, 2, costs.weight_walk_bytes, False)
        (42, 35)
    """
    later = costs.gradient_bytes if with_later_gradients else (0,) * len(costs.gradient_bytes)
    return max(sum(costs.weight_held_bytes[first:unit]) + walks[unit] + sum(later[unit + 1:end]) for unit in range(first, end))


def priced_split(costs: UnitCosts, bounds: tuple[tuple[int, int], ...], schedule: Schedule) -> StageSplit:
    """The `StageSplit` of the given bounds run in `schedule`'s orders: slots, simulated step and
    bubble, and the model's peak per device group.

    Example (one heavy unit, then two: 1F1B on 2 stages, 4 micro-batches):
        >>> from autostrat.search.schedules import schedule_orders
        >>> split = priced_split(UnitCosts((30, 10, 10), (1, 1, 1), (5, 1, 1)), ((0, 1), (1, 3)), schedule_orders("1f1b", 2, 4))
        >>> split.slot_ns, split.step_time_ns
        ((30, 20), 140)
    """
    times = stage_times(costs, bounds, schedule)
    run = simulate(schedule, times)
    slots = tuple(round(f + b + w) for f, b, w in zip(times.forward_ns, times.backward_ns, times.weight_ns))
    weights = tuple(sum(costs.weight_bytes[first:end]) for first, end in bounds)
    return StageSplit(bounds, slots, group_peaks(costs, bounds, schedule), schedule.micro_batches, weights,
                      round(run.step_ns), run.bubble)


def split_stages(costs: UnitCosts, schedule: Schedule, budget: int | None = None, allowed: int | None = None,
                 excluded: frozenset = frozenset()) -> StageSplit:
    """The split of the units into `schedule`'s model stages (contiguous, non-empty) with the
    least simulated step whose every device group's model fits `allowed` bytes (default
    `budget`) and none of whose stages, as ``(stage, first, end)``, is `excluded` (a caller
    checking exact peaks against `budget` allows more and excludes the stages found over:
    `pipeline.plan_pipeline`); among equally fast splits, the first in order of boundaries.

    Example (four equal layers after a heavy embedding: the embedding's stage takes one layer):
        >>> from autostrat.search.schedules import schedule_orders
        >>> costs = UnitCosts((30, 10, 10, 10, 10), (1, 1, 1, 1, 1), (5, 1, 1, 1, 1))
        >>> split = split_stages(costs, schedule_orders("1f1b", 2, 4))
        >>> split.bounds, split.slot_ns, split.step_time_ns
        (((0, 1), (1, 5)), (30, 40), 190)
    """
    units, stages = len(costs.time_ns), schedule.stages
    if not 1 <= stages <= units:
        raise ConfigError(f"{stages} pipeline stages cannot split {units} layer unit(s): each stage needs one at least")
    allowed = budget if allowed is None else allowed

    def misfit(split: StageSplit) -> tuple[int, int]:
        """(bytes the largest group is over `allowed`, excluded stages): (0, 0) when it fits."""
        over = 0 if allowed is None else max(0, max(split.peak_bytes) - allowed)
        return over, sum((stage, *bound) in excluded for stage, bound in enumerate(split.bounds))

    if math.comb(units - 1, stages - 1) <= EXHAUSTIVE_SPLITS:
        found = _best_of_every_split(costs, schedule, misfit)
    else:
        found = _descended(costs, schedule, misfit, allowed)
    if found is None:
        over = f" (the model allows {allowed:,})" if allowed != budget else ""
        raise InfeasibleError(f"no split into {stages} pipeline stages fits max_device_memory = {budget:,} bytes per "
                              f"device: {_least_peak(costs, schedule)}{over}")
    return found


def _least_peak(costs: UnitCosts, schedule: Schedule) -> str:
    """What the split's memory model gives at least: over every split, or over the splits with
    the least largest stage weights (the DP) when there are too many."""
    units, stages = len(costs.time_ns), schedule.stages
    if math.comb(units - 1, stages - 1) <= EXHAUSTIVE_SPLITS:
        least = min(max(group_peaks(costs, _bounds(ends), schedule)) for ends in _every_split(units, stages))
        return f"the least stage peak the split's memory model gives any split is {least:,} bytes"
    ends = min_max_split(units, stages, lambda stage, first, end: sum(costs.weight_bytes[first:end]))[1]
    return (f"the split with the least weights on its largest stage peaks at "
            f"{max(group_peaks(costs, _bounds(ends), schedule)):,} bytes by the split's memory model")


def _every_split(units: int, stages: int):
    for cuts in itertools.combinations(range(1, units), stages - 1):
        yield cuts + (units,)


def _bounds(ends: tuple[int, ...]) -> tuple[tuple[int, int], ...]:
    return tuple(zip((0,) + ends[:-1], ends))


def _best_of_every_split(costs: UnitCosts, schedule: Schedule, misfit) -> StageSplit | None:
    best = None
    for ends in _every_split(len(costs.time_ns), schedule.stages):
        split = priced_split(costs, _bounds(ends), schedule)
        if misfit(split) == (0, 0) and (best is None or split.step_time_ns < best.step_time_ns):
            best = split
    return best


def _descended(costs: UnitCosts, schedule: Schedule, misfit, allowed: int | None) -> StageSplit | None:
    """The least-slowest-slot split (each stage's weights within its share of the budget:
    `allowed` over the chunks of a group), then each boundary moved one unit either way while
    the split gets nearer to fitting (`misfit`) or, fitting, faster; None when it never fits."""
    units, stages = len(costs.time_ns), schedule.stages
    share = None if allowed is None else allowed // schedule.chunks

    def slot(stage: int, first: int, end: int) -> int | None:  # the DP's memory: the stage's weights
        return None if share is not None and sum(costs.weight_bytes[first:end]) > share else sum(costs.time_ns[first:end])

    start = min_max_split(units, stages, slot)
    if start is None:
        return None
    best = priced_split(costs, _bounds(start[1]), schedule)
    best_key = (misfit(best), best.step_time_ns)
    for _ in range(DESCENT_ROUNDS):
        improved = False
        for boundary, move in itertools.product(range(stages - 1), (-1, 1)):
            ends = [end for _, end in best.bounds]
            ends[boundary] += move
            if not all(a < b for a, b in zip((0, *ends), ends)):
                continue
            split = priced_split(costs, _bounds(tuple(ends)), schedule)
            key = (misfit(split), split.step_time_ns)
            if key < best_key:
                best, best_key, improved = split, key, True
        if not improved:
            break
    return best if best_key[0] == (0, 0) else None


AUTO = "auto"  # `pipeline_schedule: auto`: the search chooses the schedule and its virtual stages
MAX_CHUNKS = 8  # interleaved_1f1b's virtual stages per device group tried by `schedule_candidates`


@dataclass(frozen=True)
class ScheduleChoice:
    """A schedule with its model chunks per device group, micro-batches and best split."""

    schedule: str
    chunks: int
    micro_batches: int
    split: StageSplit


def schedule_candidates(devices: int, units: int, micro_batches: int, chunks: int | None = None) -> tuple[tuple[str, int], ...]:
    """The (schedule, chunks) pairs `pipeline_schedule: auto` tries on `devices` device groups,
    `units` units and `micro_batches`: 1F1B, GPipe and ZB-H1; zbv when every one of its
    ``2 p`` stages gets a unit; interleaved 1F1B with 2 to `MAX_CHUNKS` chunks (or the given
    `chunks`, `pipeline_interleave_num`) when its stages get a unit each and the micro-batches
    come in groups of the devices.

    Example:
        >>> schedule_candidates(2, 5, 4)
        (('1f1b', 1), ('gpipe', 1), ('zero_bubble_h1', 1), ('zbv', 2), ('interleaved_1f1b', 2))
    """
    found = [("1f1b", 1), ("gpipe", 1), ("zero_bubble_h1", 1)]
    if devices > 1 and 2 * devices <= units:
        found.append(("zbv", 2))
    if devices > 1 and micro_batches % devices == 0:
        tried = range(2, MAX_CHUNKS + 1) if chunks is None else (chunks,)
        found += [("interleaved_1f1b", v) for v in tried if devices * v <= units]
    return tuple(found)


def choose_schedule(costs_of, devices: int, micro_batch_counts, budget: int | None = None, allowed: int | None = None,
                    chunks: int | None = None) -> tuple[ScheduleChoice, ...]:
    """Every (schedule, chunks, micro-batches) of `schedule_candidates` for each of
    `micro_batch_counts` with a split that fits, fastest simulated step first (ties: the
    candidates' order, fewer micro-batches first); `costs_of(m)` gives the `UnitCosts` of one
    of `m` micro-batches (its work shrinks with `m`; its weights do not).

    Example (four equal units on 2 device groups, 4 micro-batches: zbv's V fills the bubble):
        >>> costs = UnitCosts((9,) * 4, (1,) * 4, (1,) * 4, forward_ns=(3,) * 4, weight_gradient_ns=(3,) * 4)
        >>> best = choose_schedule(lambda m: costs, 2, (4,))[0]
        >>> best.schedule, best.chunks, best.split.step_time_ns
        ('zbv', 2, 75)
    """
    choices = []
    for order, micro_batches in enumerate(sorted(micro_batch_counts)):
        costs = costs_of(micro_batches)
        for rank, (name, count) in enumerate(schedule_candidates(devices, len(costs.time_ns), micro_batches, chunks)):
            try:
                split = split_stages(costs, schedule_orders(name, devices, micro_batches, count), budget, allowed)
            except InfeasibleError:
                continue
            choices.append(((split.step_time_ns, order, rank), ScheduleChoice(name, count, micro_batches, split)))
    return tuple(choice for _, choice in sorted(choices, key=lambda pair: pair[0]))
