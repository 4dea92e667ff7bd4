"""Gradient synchronisation in buckets, lowered: a program's "sync" steps moved onto the
communication stream (`runtime.stream`), which runs them while the rest of the backward does.

The plan says which edges share a bucket, in the order the stream runs them
(`search.prediction.sync_buckets`, as its prediction schedules them); a bucket starts after the
instruction writing its last gradient, and each edge is waited for where its steps stood, just
before the update reading it, so the program reads as the blocking one with the sends begun early.
"""

from __future__ import annotations

from autostrat.errors import RuntimeBackendError
from autostrat.runtime.program import Communicate, Compute, Load
from autostrat.runtime.stream import SyncStart, SyncWait


def bucketed(instructions: list, buckets: list[list[str]]) -> list:
    """`instructions` with the steps of the edges labelled in `buckets` (each a list of edge
    labels, in the order the stream runs them) run on the communication stream: a `SyncStart`
    per bucket after the instruction writing its last gradient, a `SyncWait` per edge in place
    of its steps.

    Example (two gradients, each AllReduced before its update; one bucket started after both):
        >>> def step(grad):
        ...     return Communicate("AllReduce", grad, grad + "'", (0, 1), (), (), "sum", (0, 0), 4, grad, "sync")
        >>> ops = [Compute(name, "Neg", (), (name + ":0",), (), None) for name in ("a", "b")]
        >>> program = ops + [step("a:0"), step("b:0")]
        >>> [type(i).__name__ for i in bucketed(program, [["a:0", "b:0"]])]
        ['Compute', 'Compute', 'SyncStart', 'SyncWait', 'SyncWait']
    """
    steps: dict[str, list[Communicate]] = {label: [] for bucket in buckets for label in bucket}
    for instruction in instructions:
        if isinstance(instruction, Communicate) and instruction.edge in steps:
            steps[instruction.edge].append(instruction)
    written = {key: index for index, instruction in enumerate(instructions) for key in _writes(instruction)}
    starts: dict[int, list[SyncStart]] = {}
    position = {id(instruction): index for index, instruction in enumerate(instructions)}
    for bucket in buckets:
        ready = max(written.get(steps[label][0].source, -1) for label in bucket)
        late = [label for label in bucket if position[id(steps[label][0])] < ready]
        if late:  # an update between the backward's kernels (graphs put them after: `autodiff.build_training`)
            raise RuntimeBackendError(f"edge {late[0]}: its update runs before the last gradient of its bucket is made; "
                                      f"buckets need every update after the backward")
        starts.setdefault(ready, []).append(SyncStart(tuple(step for label in bucket for step in steps[label])))
    lowered = list(starts.get(-1, ()))
    for index, instruction in enumerate(instructions):
        if isinstance(instruction, Communicate) and instruction.edge in steps:
            if instruction is steps[instruction.edge][0]:
                lowered.append(SyncWait(tuple(steps[instruction.edge])))
            continue
        lowered.append(instruction)
        lowered.extend(starts.get(index, ()))
    return lowered


def _writes(instruction) -> tuple[str, ...]:
    if isinstance(instruction, Load):
        return (instruction.tensor,)
    return instruction.outputs if isinstance(instruction, Compute) else ()
