"""Pipeline schedules as instruction orders, and their exact simulation.

A schedule gives every device of a pipeline its *order*: the instructions it runs one after
another, each ``(kind, micro_batch, chunk)``. Kinds: ``F`` (forward), ``B`` (backward; the
input gradient alone when the schedule splits the backward, else the whole of it) and ``W``
(the weight gradient, split schedules only). A device holds `chunks` model chunks; chunk ``c``
of device ``d`` is model stage ``c * p + d`` (`Schedule.stage`). Orders by schedule:

1. ``gpipe``: every forward, then every backward.
2. ``1f1b``: ``p - d - 1`` forwards, then one forward and one backward in turn, then the
   remaining backwards (`stages.slot_order`, Megatron's non-interleaved schedule).
3. ``interleaved_1f1b``: Megatron's with ``v`` chunks: micro-batches in groups of ``p``, each
   group through chunk 0, then chunk 1, ...; ``2 (p - d - 1) + (v - 1) p`` warm-up forwards,
   then one forward and one backward (chunks in reverse) in turn; ``m`` a multiple of ``p``
   (Megatron runs every forward first when ``m = p``, for its communication; here the same
   formula holds there too).
4. ``zero_bubble_h1`` (Qi et al., ICLR 2024): 1F1B's forwards and input gradients, each
   device ``d`` running micro-batch ``i``'s weight gradient ``d`` steps after its input gradient
   (after the backward of ``i + d``), so that it holds ``p`` micro-batches at most like 1F1B's
   first device, and the drain's waits are filled with the weight gradients held back.

`simulate` runs the orders on per-stage F, B, W and per-boundary send times (`StageTimes`):
every device runs its order in turn, an instruction starting once the device is free and what
it needs has finished: ``F(i, k)`` the forward of stage ``k - 1`` plus the send, ``B(i, k)``
the backward of stage ``k + 1`` plus the send (the last stage's its own forward), ``W(i, k)``
the backward ``B(i, k)``. A send between two chunks of one device costs nothing.
`check_orders` checks that a schedule's orders run every instruction once where it belongs
and never deadlock.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import NamedTuple

from autostrat.errors import ConfigError

SCHEDULE_ORDERS = ("1f1b", "gpipe", "interleaved_1f1b", "zero_bubble_h1")
SPLIT_BACKWARD = frozenset({"zero_bubble_h1"})  # the schedules running B and W apart


class Instruction(NamedTuple):
    """One step of a device's order: `kind` F, B or W of `micro_batch` on the device's `chunk`."""

    kind: str
    micro_batch: int
    chunk: int = 0

    def __str__(self) -> str:
        return f"{self.kind}(micro-batch {self.micro_batch}, chunk {self.chunk})"


@dataclass(frozen=True)
class Schedule:
    """The orders of a pipeline schedule: per device, its instructions in the order it runs them.

    Example (1F1B's last device runs each micro-batch's forward then its backward):
        >>> [str(i) for i in schedule_orders("1f1b", 2, 2).orders[1]]
        ['F(micro-batch 0, chunk 0)', 'B(micro-batch 0, chunk 0)', 'F(micro-batch 1, chunk 0)', 'B(micro-batch 1, chunk 0)']
    """

    name: str
    devices: int
    micro_batches: int
    chunks: int
    orders: tuple[tuple[Instruction, ...], ...]

    @property
    def stages(self) -> int:
        return self.devices * self.chunks

    @property
    def split_backward(self) -> bool:
        return self.name in SPLIT_BACKWARD

    def stage(self, device: int, chunk: int) -> int:
        """The model stage of `chunk` on `device` (Megatron's interleaving)."""
        return chunk * self.devices + device


def schedule_orders(name: str, devices: int, micro_batches: int, chunks: int | None = None) -> Schedule:
    """The orders of schedule `name` on `devices` devices for `micro_batches` micro-batches,
    `chunks` model chunks per device (interleaved: any, default 2; else 1).

    Example (ZB-H1's last of 2 devices runs micro-batch 0's weight gradient after the input
    gradient of micro-batch 1):
        >>> " ".join(f"{i.kind}{i.micro_batch}" for i in schedule_orders("zero_bubble_h1", 2, 3).orders[1])
        'F0 B0 F1 B1 W0 F2 B2 W1 W2'
    """
    if name not in SCHEDULE_ORDERS:
        raise ConfigError(f"pipeline schedule must be one of {', '.join(SCHEDULE_ORDERS)}, got {name!r}")
    if devices < 1 or micro_batches < 1:
        raise ConfigError(f"a pipeline schedule needs at least one device and one micro-batch, got {devices} "
                          f"device(s) and {micro_batches} micro-batch(es)")
    chunks = _chunks(name, chunks)
    if name == "interleaved_1f1b" and micro_batches % devices:
        raise ConfigError(f"interleaved_1f1b runs micro-batches in groups of the {devices} devices: micro_batches must "
                          f"be a multiple of {devices}, got {micro_batches}")
    build = {"gpipe": _gpipe, "1f1b": _one_f_one_b, "interleaved_1f1b": _interleaved,
             "zero_bubble_h1": _zero_bubble_h1}[name]
    orders = tuple(tuple(build(device, devices, micro_batches, chunks)) for device in range(devices))
    return Schedule(name, devices, micro_batches, chunks, orders)


def _chunks(name: str, chunks: int | None) -> int:
    """The chunks per device of schedule `name`, checked against what it allows."""
    allowed = {"interleaved_1f1b": None}.get(name, 1)
    if chunks is None:
        return 2 if allowed is None else allowed
    if (allowed is None and chunks < 1) or (allowed is not None and chunks != allowed):
        expected = "a positive number of" if allowed is None else f"{allowed}"
        raise ConfigError(f"{name} runs {expected} model chunk(s) per device, got {chunks}")
    return chunks


def _gpipe(device: int, devices: int, micro_batches: int, chunks: int) -> list[Instruction]:
    return ([Instruction("F", i) for i in range(micro_batches)]
            + [Instruction("B", i) for i in range(micro_batches)])


def _one_f_one_b(device: int, devices: int, micro_batches: int, chunks: int) -> list[Instruction]:
    warmup = min(devices - device - 1, micro_batches)
    order = [Instruction("F", i) for i in range(warmup)]
    for i in range(micro_batches - warmup):
        order += [Instruction("F", warmup + i), Instruction("B", i)]
    return order + [Instruction("B", i) for i in range(micro_batches - warmup, micro_batches)]


def _interleaved(device: int, devices: int, micro_batches: int, chunks: int) -> list[Instruction]:
    """Megatron's interleaved 1F1B: the ``k``-th forward (backward) of a device is micro-batch
    ``group * p + k % p`` of group ``k // (p v)`` on chunk ``(k % (p v)) // p`` (its reverse)."""
    total, per_group = micro_batches * chunks, devices * chunks

    def virtual(kind: str, k: int) -> Instruction:
        group, within = divmod(k, per_group)
        chunk = within // devices
        return Instruction(kind, group * devices + within % devices, chunk if kind == "F" else chunks - 1 - chunk)

    warmup = min(2 * (devices - device - 1) + (chunks - 1) * devices, total)
    order = [virtual("F", k) for k in range(warmup)]
    for k in range(total - warmup):
        order += [virtual("F", warmup + k), virtual("B", k)]
    return order + [virtual("B", k) for k in range(total - warmup, total)]


def _zero_bubble_h1(device: int, devices: int, micro_batches: int, chunks: int) -> list[Instruction]:
    """1F1B's order with each backward followed by the weight gradient `device` backwards
    before it (none yet at first), the ones left at the end."""
    order, weights = [], 0
    for instruction in _one_f_one_b(device, devices, micro_batches, chunks):
        order.append(instruction)
        if instruction.kind == "B" and instruction.micro_batch >= device:
            order.append(Instruction("W", weights))
            weights += 1
    return order + [Instruction("W", i) for i in range(weights, micro_batches)]




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
    starting once the device is free and what it needs has finished (module docstring).

    Example (1F1B on 2 stages, 2 micro-batches, F 1 and B 2: the step is (m + p - 1)(F + B)):
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


def _needs(schedule: Schedule, instruction: Instruction, stage: int) -> tuple[tuple, int] | None:
    """(what `instruction` on `stage` waits for as ``(kind, micro_batch, stage)``, the boundary
    whose send it waits for too, or -1); None for a first stage's forward."""
    kind, micro_batch = instruction.kind, instruction.micro_batch
    if kind == "F":
        return None if stage == 0 else (("F", micro_batch, stage - 1), stage - 1)
    if kind == "W":
        return ("B", micro_batch, stage), -1
    if stage == schedule.stages - 1:
        return ("F", micro_batch, stage), -1
    return ("B", micro_batch, stage + 1), stage


def _ready(schedule: Schedule, times: StageTimes, finish: dict, instruction: Instruction, stage: int) -> float | None:
    """When what `instruction` needs has arrived on its device; None while it has not run."""
    needs = _needs(schedule, instruction, stage)
    if needs is None:
        return 0
    (kind, micro_batch, other), boundary = needs
    if (kind, micro_batch, other) not in finish:
        return None
    crossing = boundary >= 0 and _device(schedule, other) != _device(schedule, stage)
    return finish[(kind, micro_batch, other)] + (times.send(boundary) if crossing else 0)


def _device(schedule: Schedule, stage: int) -> int:
    return stage % schedule.devices


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
        (kind, micro_batch, stage), _ = _needs(schedule, instruction, schedule.stage(device, instruction.chunk))
        other = _device(schedule, stage)
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
