"""Gradient synchronisation in buckets, lowered: a program's "sync" steps moved onto the
communication stream (`runtime.stream`), which runs them while the rest of the backward does.

The plan says which edges share a bucket, in the order the stream runs them
(`search.prediction.sync_buckets`, as its prediction schedules them); a bucket starts after the
instruction writing its last gradient, and each edge is waited for where its steps stood, just
before the update reading it, so the program reads as the blocking one with the sends begun early.
Edges the plan fuses (`search.fusion`: a `Fusion` in the bucket) run as one `FusedAllReduce`,
waited for where the first of them stood.
"""

from __future__ import annotations

from dataclasses import dataclass

from autostrat.errors import RuntimeBackendError
from autostrat.runtime.program import member_bytes
from autostrat.runtime.instructions import Communicate, Compute, Load
from autostrat.runtime.stream import FusedAllReduce, SyncStart, SyncWait
from autostrat.search.fusion import sync_collectives
from autostrat.search.prediction import sync_buckets


@dataclass(frozen=True)
class Fusion:
    """Edges of a bucket (their `labels`, each one AllReduce step) run as one `FusedAllReduce`
    of `algorithm`, in which this rank sends `predicted` bytes."""

    labels: tuple[str, ...]
    algorithm: str
    predicted: int


def plan_buckets(plan, rank: int, label) -> list[list]:
    """The buckets of `plan` (`search.prediction.sync_buckets`) as `bucketed` takes them for
    `rank`: per collective (`search.fusion.sync_collectives`) its edge's `label`, or the `Fusion`
    of its edges with what this rank sends in it."""
    buckets = []
    for bucket in sync_buckets(plan):
        entries = []
        for collective in sync_collectives(plan, bucket):
            if not collective.fused:
                entries.append(label(collective.edges[0]))
                continue
            group = next(g for g in collective.step.groups if rank in g)
            predicted = member_bytes("AllReduce", collective.algorithm, collective.local_bytes, group, rank, collective.itemsize)
            entries.append(Fusion(tuple(label(edge) for edge in collective.edges), collective.algorithm, predicted))
        buckets.append(entries)
    return buckets


def bucketed(instructions: list, buckets: list[list]) -> list:
    """`instructions` with the steps of the edges in `buckets` (each a list, in the order the
    stream runs them, of edge labels and `Fusion`s) run on the communication stream: a
    `SyncStart` per bucket after the instruction writing its last gradient, a `SyncWait` per
    edge (or fusion, at its first edge) in place of its steps.

    Example (two gradients, each AllReduced before its update; one bucket started after both):
        >>> def step(grad):
        ...     return Communicate("AllReduce", grad, grad + "'", (0, 1), (), (), "sum", (0, 0), 4, grad, "sync")
        >>> ops = [Compute(name, "Neg", (), (name + ":0",), (), None) for name in ("a", "b")]
        >>> program = ops + [step("a:0"), step("b:0")]
        >>> [type(i).__name__ for i in bucketed(program, [["a:0", "b:0"]])]
        ['Compute', 'Compute', 'SyncStart', 'SyncWait', 'SyncWait']
        >>> [type(i).__name__ for i in bucketed(program, [[Fusion(("a:0", "b:0"), "ring", 4)]])]
        ['Compute', 'Compute', 'SyncStart', 'SyncWait']
    """
    entries = [entry for bucket in buckets for entry in bucket]
    steps: dict[str, list[Communicate]] = {label: [] for entry in entries for label in _labels(entry)}
    for instruction in instructions:
        if isinstance(instruction, Communicate) and instruction.edge in steps:
            steps[instruction.edge].append(instruction)
    position = {id(instruction): index for index, instruction in enumerate(instructions)}
    runs, waits = {}, {}  # per entry its stream steps; the instruction (its first) that a wait replaces
    for entry in entries:
        firsts = [steps[label][0] for label in _labels(entry)]
        if isinstance(entry, Fusion):
            assert all(len(steps[label]) == 1 for label in entry.labels), f"{entry}: a fused edge is one AllReduce"
            runs[entry] = (FusedAllReduce(tuple(firsts), entry.algorithm, entry.predicted),)
        else:
            runs[entry] = tuple(steps[entry])
        waits[id(min(firsts, key=lambda step: position[id(step)]))] = SyncWait(runs[entry])
    starts = _starts(instructions, buckets, steps, runs, position)
    lowered = list(starts.get(-1, ()))
    for index, instruction in enumerate(instructions):
        if isinstance(instruction, Communicate) and instruction.edge in steps:
            lowered += [waits[id(instruction)]] if id(instruction) in waits else []
            continue
        lowered.append(instruction)
        lowered.extend(starts.get(index, ()))
    return lowered


def _labels(entry) -> tuple[str, ...]:
    return entry.labels if isinstance(entry, Fusion) else (entry,)


def _starts(instructions: list, buckets: list, steps: dict, runs: dict, position: dict) -> dict[int, list[SyncStart]]:
    """Per instruction index, the `SyncStart`s placed after it (-1: before the first): each
    bucket's after the instruction writing its last gradient."""
    written = {key: index for index, instruction in enumerate(instructions) for key in _writes(instruction)}
    starts: dict[int, list[SyncStart]] = {}
    for bucket in buckets:
        labels = [label for entry in bucket for label in _labels(entry)]
        ready = max(written.get(steps[label][0].source, -1) for label in labels)
        late = [label for label in labels if position[id(steps[label][0])] < ready]
        if late:  # an update between the backward's kernels (graphs put them after: `autodiff.build_training`)
            raise RuntimeBackendError(f"edge {late[0]}: its update runs before the last gradient of its bucket is made; "
                                      f"buckets need every update after the backward")
        starts.setdefault(ready, []).append(SyncStart(tuple(step for entry in bucket for step in runs[entry])))
    return starts


def _writes(instruction) -> tuple[str, ...]:
    if isinstance(instruction, Load):
        return (instruction.tensor,)
    return instruction.outputs if isinstance(instruction, Compute) else ()
