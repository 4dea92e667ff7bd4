"""Pipeline schedules as instruction orders (`schedule_simulation` runs them).

A schedule gives every device of a pipeline its *order*: the instructions it runs one after
another, each ``(kind, micro_batch, chunk)``. Kinds: ``F`` (forward), ``B`` (backward; the
input gradient alone when the schedule splits the backward, else the whole of it) and ``W``
(the weight gradient, split schedules only). A device holds `chunks` model chunks; chunk ``c``
of device ``d`` is model stage `Schedule.stage` (``c * p + d``; zbv's V: ``d``, then
``2p - 1 - d``). Orders by schedule:

1. ``gpipe``: every forward, then every backward.
2. ``1f1b``: ``p - d - 1`` forwards, then one forward and one backward in turn, then the
   remaining backwards (Megatron's non-interleaved schedule).
3. ``interleaved_1f1b``: Megatron's with ``v`` chunks: micro-batches in groups of ``p``, each
   group through chunk 0, then chunk 1, ...; ``2 (p - d - 1) + (v - 1) p`` warm-up forwards,
   then one forward and one backward (chunks in reverse) in turn; ``m`` a multiple of ``p``
   (Megatron runs every forward first when ``m = p``, for its communication; here the same
   formula holds there too).
4. ``zero_bubble_h1`` (Qi et al., ICLR 2024): 1F1B's forwards and input gradients, each
   device ``d`` running micro-batch ``i``'s weight gradient ``d`` steps after its input gradient
   (after the backward of ``i + d``), so that it holds ``p`` micro-batches at most like 1F1B's
   first device, and the drain's waits are filled with the weight gradients held back.
5. ``zbv`` (ZB-V, the same paper, as its figure and PyTorch's ``ScheduleZBVZeroBubble`` order
   it): two chunks per device in a V, each micro-batch's forward down the devices on chunk 0
   and back up on chunk 1 (the last stage on device 0). Device ``d`` runs ``2 (p - d) - 1``
   chunk-0 forwards, ``d`` pairs of chunk-1 and chunk-0 forwards, ``p - d`` chunk-1 F, B, W;
   then in turn chunk 0's F, B, W and chunk 1's; then drains the input gradients with their
   weight gradients held back to fill the waits (`_zbv`). It holds at most ``2p`` micro-batch
   chunks, 1F1B's first device's ``p`` micro-batches of a device's layers (the paper's "1x").
   At equal times and ``m >= 2p`` its step is ``m (F + B + W) + (p - 1) F / 2`` (F a device's
   forward over both chunks), the least any order allows: the devices' start offsets, which
   no order avoids within one step (the paper's table lists ZB-V's bubble rate at equal times
   as 0). The order does not depend on the times. On unequal ones that bound is a lower bound
   (`benchmarks/schedules.py --times`): at p <= 8, m >= 2p and per-pass times drawn from
   0.3-3, the step is 1.01-1.05 of it on average, at most 1.12 where W + 2B >= 2F and
   W + 2F >= 2B (the condition Qi et al.'s later V schedules give for no steady bubble), 1.26
   at worst otherwise; at the 17 : 15 : 6 measured on the ranks 1.02 (a list schedule planned
   for equal times, before, took 1.18 there, slower than ZB-H1).

What an instruction waits for (`waits_for`): ``F(i, k)`` the forward of stage ``k - 1``,
``B(i, k)`` the backward of stage ``k + 1`` (the last stage's its own forward), ``W(i, k)`` the
backward ``B(i, k)``.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import NamedTuple

from autostrat.errors import ConfigError

SCHEDULE_ORDERS = ("1f1b", "gpipe", "interleaved_1f1b", "zbv", "zero_bubble_h1")
SPLIT_BACKWARD = frozenset({"zbv", "zero_bubble_h1"})  # the schedules running B and W apart


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
        """The model stage of `chunk` on `device` (Megatron's interleaving, or zbv's V)."""
        return _v_stage(self.devices, device, chunk) if self.name == "zbv" else chunk * self.devices + device

    def device(self, stage: int) -> int:
        """The device that runs model stage `stage`."""
        chunk, device = divmod(stage, self.devices)
        return self.devices - 1 - device if self.name == "zbv" and chunk else device


def waits_for(instruction: Instruction, stage: int, stages: int) -> tuple[str, int, int] | None:
    """What `instruction` on model `stage` of `stages` waits for, as (kind, micro-batch, stage);
    None for a first stage's forward.

    Example:
        >>> waits_for(Instruction("B", 3), 1, 4), waits_for(Instruction("B", 3), 3, 4), waits_for(Instruction("W", 3), 1, 4)
        (('B', 3, 2), ('F', 3, 3), ('B', 3, 1))
    """
    kind, micro_batch = instruction.kind, instruction.micro_batch
    if kind == "F":
        return None if stage == 0 else ("F", micro_batch, stage - 1)
    if kind == "W":
        return "B", micro_batch, stage
    return ("F", micro_batch, stage) if stage == stages - 1 else ("B", micro_batch, stage + 1)


@functools.lru_cache(maxsize=256)  # the search, the memory replay and every rank ask for the same few
def schedule_orders(name: str, devices: int, micro_batches: int, chunks: int | None = None) -> Schedule:
    """The orders of schedule `name` on `devices` devices for `micro_batches` micro-batches,
    `chunks` model chunks per device (interleaved: any, default 2; zbv: 2; else 1).

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
    build = {"gpipe": _gpipe, "1f1b": _one_f_one_b, "interleaved_1f1b": _interleaved, "zbv": _zbv,
             "zero_bubble_h1": _zero_bubble_h1}[name]
    orders = tuple(tuple(build(device, devices, micro_batches, chunks)) for device in range(devices))
    return Schedule(name, devices, micro_batches, chunks, orders)


def _chunks(name: str, chunks: int | None) -> int:
    """The chunks per device of schedule `name`, checked against what it allows."""
    allowed = {"interleaved_1f1b": None, "zbv": 2}.get(name, 1)
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


def _v_stage(devices: int, device: int, chunk: int) -> int:
    return 2 * devices - 1 - device if chunk else device


def _zbv(device: int, devices: int, micro_batches: int, chunks: int) -> list[Instruction]:
    """ZB-V's order (Qi et al.'s handcrafted V) of `device` ``d`` of ``p``, written for at least
    ``2p`` micro-batches and cut to the real ones (a cut order runs its instructions in the same
    relative order, so it cannot deadlock where the whole one does not)."""
    p, d, total = devices, device, max(micro_batches, 2 * devices)
    order, passes = [], _VPasses()
    order += [passes.next("F", 0) for _ in range(2 * (p - d) - 1)]  # chunk 0 fills the V's descent
    for _ in range(d):
        order += [passes.next("F", 1), passes.next("F", 0)]
    for _ in range(p - d):  # the turn: chunk 1's micro-batches reach the loss
        order += [passes.next("F", 1), passes.next("B", 1), passes.next("W", 1)]
    while passes.forward[0] < total or passes.forward[1] < passes.forward[0]:  # steady: no bubble at equal times
        order += [passes.next("F", 0)] if passes.forward[0] < total else []
        order += [passes.next("B", 0), passes.next("W", 0), passes.next("F", 1), passes.next("B", 1), passes.next("W", 1)]
    for _ in range(d):  # the drain: input gradients first, their weight gradients held back
        order += [passes.next("B", 0), passes.next("B", 1)]
    for _ in range(p - d):
        order += [passes.next("B", 0), passes.next("W", 0)]
    order += [passes.next("W", 1) for _ in range(passes.backward[1] - passes.weight[1])]
    order += [passes.next("W", 0) for _ in range(passes.backward[0] - passes.weight[0])]
    return [instruction for instruction in order if instruction.micro_batch < micro_batches]


@dataclass
class _VPasses:
    """Per kind and chunk, the next micro-batch of `_zbv`'s order (each kind runs them in turn)."""

    forward: list = field(default_factory=lambda: [0, 0])
    backward: list = field(default_factory=lambda: [0, 0])
    weight: list = field(default_factory=lambda: [0, 0])

    def next(self, kind: str, chunk: int) -> Instruction:
        counter = {"F": self.forward, "B": self.backward, "W": self.weight}[kind]
        counter[chunk] += 1
        return Instruction(kind, counter[chunk] - 1, chunk)
