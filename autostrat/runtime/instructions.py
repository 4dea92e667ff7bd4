"""A rank's program as data: its instructions (`Load`, `Compute`, `RingCompute`, `Communicate`,
`Send`, `Recv`) and the `Program` holding them, in the order the rank runs them. `runtime.program`
lowers a plan to them; the executor runs them; the job file stores them (`runtime.job_schema`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from autostrat.layout import SliceContext
from autostrat.runtime.stream import SyncWait


PHASES = ("forward", "backward", "sync", "update", "gather", "pipeline", "output")
LOCAL_KINDS = ("PartialCreate", "Slice")  # `Communicate` kinds that send nothing


@dataclass(frozen=True)
class Load:
    """Take the rank's slice of a graph input, parameter or constant (no communication), held
    in `dtype` ("": as given). A 16-bit run's fp32 main copy of parameter `of` is first made
    from its whole value rounded through `via` (the 16-bit model's parameter, as Megatron-LM
    copies its main parameters from the 16-bit ones); later steps carry it."""

    tensor: str
    ranges: tuple[tuple[int, int], ...]
    dtype: str = ""
    of: str = ""
    via: str = ""


@dataclass(frozen=True)
class Compute:
    """Run one op's kernel on the rank's slices (store keys in, store keys out). In a 16-bit
    run the kernel computes in float32 and its outputs are rounded to `dtypes` (as tensor cores
    accumulate in fp32); an update reads and rewrites the fp32 main copy ``main[0]`` in place
    of its 16-bit parameter, whose next value is that copy rounded, and under fp16 first copies
    its fp16 gradient into the fp32 main gradient ``main[1]`` (`runtime.sixteen_bit`)."""

    op: str
    op_type: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    attrs: tuple[tuple[str, Any], ...]
    context: SliceContext
    dtypes: tuple[str, ...] = ()
    main: tuple[str, ...] = ()


@dataclass(frozen=True)
class RingCompute(Compute):
    """A ring strategy's op (`runtime.ring`): its kernel passes blocks around `group` (the
    rank's ring, members in block order) in `wire_dtype` ("": as held), `predicted` bytes in
    `phase` by the plan (`cost.ring`); reported as communication labelled `edge`."""

    kind: ClassVar[str] = "Ring"
    group: tuple[int, ...] = ()
    wire_dtype: str = ""
    predicted: int = 0
    edge: str = ""
    phase: str = "forward"


@dataclass(frozen=True)
class Communicate:
    """One redistribution step on this rank: read `source`, write `target`.

    `group` is the rank's communication group, members in the order of their chunks in the
    step's dim. `chunks` is, per member, the chunk of the split dim that member ends with
    (AllToAll, ReduceScatter), or ``(parts, own chunk)`` for a Slice, or ``(position,)`` for a
    PartialCreate (the member at position 0 keeps its piece of a sum, the others zero theirs). `peers` is ``(send to,
    receive from)`` of a Sendrecv (a collective permute). `predicted` is what the plan says this
    rank sends.
    """

    kind: str
    source: str
    target: str
    group: tuple[int, ...]
    dims: tuple[int, ...]
    chunks: tuple[int, ...]
    reduce_op: str
    peers: tuple[int, int]
    predicted: int
    edge: str
    phase: str = "forward"
    algorithm: str = "ring"  # the plan step's (`cost.algorithms`): the backend runs exactly this one


@dataclass(frozen=True)
class Send:
    """Post the rank's piece `key` to rank `dest` (a pipeline stage's to another stage's same
    device; `runtime.stage_program`)."""

    kind: ClassVar[str] = "Send"  # as a `Communicate`'s kind, in reports
    key: str
    dest: int
    tag: int
    predicted: int
    edge: str
    phase: str = "pipeline"


@dataclass(frozen=True)
class Recv:
    """Wait for piece `key` from rank `source`."""

    key: str
    source: int
    tag: int
    shape: tuple[int, ...]
    dtype: str


@dataclass(frozen=True)
class Program:
    """What one rank runs. `partitions` lists every set of rank groups the program
    communicates over, identically on all ranks, so communicators are made once, in one order.
    A 16-bit run's `loss_scale` divides every update's gradient (its backward started from the
    sensitivity fed scaled by it: `job.make_job`)."""

    rank: int
    device_num: int
    partitions: tuple[tuple[tuple[int, ...], ...], ...]
    instructions: tuple
    inputs: tuple[str, ...]
    outputs: tuple[tuple[str, str], ...]
    updates: tuple[tuple[str, str], ...] = ()
    loss_scale: float = 1.0

    def communications(self) -> tuple[Communicate | RingCompute, ...]:
        """Every communication instruction in program order (a stream's steps at their wait)."""
        found = []
        for instruction in self.instructions:
            if isinstance(instruction, (Communicate, RingCompute)):
                found.append(instruction)
            elif isinstance(instruction, SyncWait):
                found.extend(instruction.steps)
        return tuple(found)
