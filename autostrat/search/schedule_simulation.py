"""The exact simulation of a pipeline schedule's instruction orders (`schedules`).

`simulate` runs the orders on per-stage F, B, W and per-boundary send times (`StageTimes`):
every device runs its order in turn, an instruction starting once the device is free and what
it waits for (`schedules.waits_for`) has finished, plus the send across a stage boundary
between two devices (between two chunks of one device it costs nothing). The step is when the
last instruction finishes (the longest path through the orders and their dependencies,
tested against one written apart). `check_orders` checks that a schedule's orders run every
instruction once where it belongs and never deadlock.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from autostrat.errors import ConfigError
from autostrat.search.schedules import Instruction, Schedule, waits_for


@dataclass(frozen=True)
class StageTimes:
    """Per model stage, one micro-batch's forward, backward and weight-gradient time
    (nanoseconds; `backward_ns` without the weight gradient), and per boundary between stages
    ``k`` and ``k + 1`` the send time of an activation (and of its gradient back)."""

    forward_ns: tuple[float, ...]
    backward_ns: tuple[float, ...]
    weight_ns: tuple[float, ...]
    send_ns: tuple[float, ...] = ()  # none given: zeros

    def __post_init__(self) -> None:
        stages = len(self.forward_ns)
        sends = len(self.send_ns) if self.send_ns else stages - 1
        if not stages or len(self.backward_ns) != stages or len(self.weight_ns) != stages or sends != stages - 1:
            raise ConfigError(f"stage times need one forward, backward and weight figure per stage and one send per "
                              f"boundary, got {stages}, {len(self.backward_ns)}, {len(self.weight_ns)} and {sends}")

    @classmethod
    def uniform(cls, stages: int, forward: float, backward: float, weight: float = 0, send: float = 0) -> StageTimes:
        """The same times on every stage and boundary.

        Example:
            >>> StageTimes.uniform(2, 1, 2, 1).weight_ns
            (1, 1)
        """
        return cls((forward,) * stages, (backward,) * stages, (weight,) * stages, (send,) * (stages - 1))

    def send(self, boundary: int) -> float:
        return self.send_ns[boundary] if self.send_ns else 0


@dataclass(frozen=True)
class ScheduleRun:
    """What `simulate` found: the step (makespan), per device its busy and idle time and the
    most micro-batch activations it held (per chunk: one micro-batch on one chunk is one),
    counted from a forward to its weight gradient (`peak_activations`; the backward where the
    backward is not split) and to its input gradient (`peak_until_backward`), and each
    instruction's finish time by ``(kind, micro_batch, stage)``."""

    step_ns: float
    busy_ns: tuple[float, ...]
    peak_activations: tuple[int, ...]
    peak_until_backward: tuple[int, ...]
    finish_ns: dict

    @property
    def idle_ns(self) -> tuple[float, ...]:
        return tuple(self.step_ns - busy for busy in self.busy_ns)

    @property
    def bubble(self) -> float:
        """The idle share of the devices' time over the step."""
        return 1 - sum(self.busy_ns) / (len(self.busy_ns) * self.step_ns) if self.step_ns else 0.0


def simulate(schedule: Schedule, times: StageTimes) -> ScheduleRun:
    """Runs `schedule`'s orders on `times`: every device its order in turn, each instruction
    starting once the device is free and what it waits for has arrived (module docstring).

    Example (1F1B on 2 stages, 2 micro-batches, F 1 and B 2: the step is (m + p - 1)(F + B)):
        >>> from autostrat.search.schedules import schedule_orders
        >>> simulate(schedule_orders("1f1b", 2, 2), StageTimes.uniform(2, 1, 2)).step_ns
        9
    """
    if len(times.forward_ns) != schedule.stages:
        raise ConfigError(f"{schedule.name} on {schedule.devices} device(s) x {schedule.chunks} chunk(s) needs times for "
                          f"{schedule.stages} stages, got {len(times.forward_ns)}")
    _check_instructions(schedule)
    finish, free, busy = {}, [0] * schedule.devices, [0] * schedule.devices
    position = [0] * schedule.devices
    progress = True
    while progress:
        progress = False
        for device, order in enumerate(schedule.orders):
            while position[device] < len(order):
                instruction = order[position[device]]
                stage = schedule.stage(device, instruction.chunk)
                ready = _ready(schedule, times, finish, instruction, stage)
                if ready is None:
                    break
                duration = _duration(schedule, times, instruction.kind, stage)
                free[device] = max(free[device], ready) + duration
                busy[device] += duration
                finish[(instruction.kind, instruction.micro_batch, stage)] = free[device]
                position[device] += 1
                progress = True
    _raise_deadlock(schedule, position)
    held = [_peak_held(order, schedule.split_backward) for order in schedule.orders]
    until_backward = [_peak_held(order, False) for order in schedule.orders]
    return ScheduleRun(max(free), tuple(busy), tuple(held), tuple(until_backward), finish)


def check_orders(schedule: Schedule) -> None:
    """Raises unless every device's order runs each of its chunks' F and B (and W where the
    backward is split) of every micro-batch exactly once, and the orders never deadlock.

    Example (1F1B's first device running its first backward before any forward):
        >>> from autostrat.search.schedules import schedule_orders
        >>> schedule = schedule_orders("1f1b", 2, 2)
        >>> check_orders(schedule)
        >>> first = schedule.orders[0]
        >>> check_orders(Schedule("1f1b", 2, 2, 1, ((first[2],) + first[:2] + first[3:], schedule.orders[1])))
        Traceback (most recent call last):
        ...
        autostrat.errors.ConfigError: 1f1b deadlocks: device 0 waits at B(micro-batch 0, chunk 0) (its instruction 0) for B of micro-batch 0 on stage 1, which device 1 runs later; device 1 waits at F(micro-batch 0, chunk 0) (its instruction 0) for F of micro-batch 0 on stage 0, which device 0 runs later
    """
    simulate(schedule, StageTimes.uniform(schedule.stages, 0, 0, 0))


def _check_instructions(schedule: Schedule) -> None:
    """Raises naming the device and instruction of an order that runs one twice, one that is
    not the schedule's, or misses one."""
    kinds = "FBW" if schedule.split_backward else "FB"
    expected = Counter(Instruction(kind, micro_batch, chunk) for kind in kinds
                       for micro_batch in range(schedule.micro_batches) for chunk in range(schedule.chunks))
    if len(schedule.orders) != schedule.devices:
        raise ConfigError(f"{schedule.name} needs one order per device, {schedule.devices}, got {len(schedule.orders)}")
    for device, order in enumerate(schedule.orders):
        found = Counter(order)
        wrong = sorted((found - expected) + (expected - found))
        if wrong:
            what = "runs more than once" if found[wrong[0]] > 1 else ("is not one of its instructions" if
                                                                     not expected[wrong[0]] else "is missing")
            raise ConfigError(f"{schedule.name}'s order of device {device} must run each of F, B{', W' * (kinds == 'FBW')} "
                              f"of {schedule.micro_batches} micro-batch(es) on {schedule.chunks} chunk(s) once: "
                              f"{wrong[0]} {what}")


def _ready(schedule: Schedule, times: StageTimes, finish: dict, instruction: Instruction, stage: int) -> float | None:
    """When what `instruction` waits for has reached its device; None while it has not run."""
    needed = waits_for(instruction, stage, schedule.stages)
    if needed is None:
        return 0
    if needed not in finish:
        return None
    crossing = schedule.device(needed[2]) != schedule.device(stage)
    return finish[needed] + (times.send(min(stage, needed[2])) if crossing else 0)


def _duration(schedule: Schedule, times: StageTimes, kind: str, stage: int) -> float:
    if kind == "F":
        return times.forward_ns[stage]
    if kind == "W":
        return times.weight_ns[stage]
    return times.backward_ns[stage] + (0 if schedule.split_backward else times.weight_ns[stage])


def _raise_deadlock(schedule: Schedule, position: list[int]) -> None:
    """Raises naming the instructions that wait for each other in a cycle, if any did not run:
    from the first device left waiting, the device of what it waits for, which has not run
    that yet and so waits too, until a device comes back."""
    waiting = [device for device, order in enumerate(schedule.orders) if position[device] < len(order)]
    if not waiting:
        return
    device, seen, steps = waiting[0], [], []
    while device not in seen:
        seen.append(device)
        instruction = schedule.orders[device][position[device]]
        kind, micro_batch, stage = waits_for(instruction, schedule.stage(device, instruction.chunk), schedule.stages)
        other = schedule.device(stage)
        runner = "it runs" if other == device else f"device {other} runs"
        steps.append(f"device {device} waits at {instruction} (its instruction {position[device]}) for {kind} of "
                     f"micro-batch {micro_batch} on stage {stage}, which {runner} later")
        device = other
    raise ConfigError(f"{schedule.name} deadlocks: {'; '.join(steps[seen.index(device):])}")


def _peak_held(order: tuple[Instruction, ...], until_weight: bool) -> int:
    """The most micro-batch activations (per chunk) a device holds: one from each forward to its
    weight gradient (`until_weight`) or its backward."""
    held = peak = 0
    for instruction in order:
        if instruction.kind == "F":
            held += 1
            peak = max(peak, held)
        elif instruction.kind == ("W" if until_weight else "B"):
            held -= 1
    return peak
