"""Lower a pipeline plan (`search.pipeline`) to one stage program per rank.

Rank ``r`` is device ``l = r % group`` of stage ``s = r // group``. Its program is device
``l``'s program of the stage plan (`program.lower_programs`: every op, on one group's devices)
cut to the ops stage ``s`` runs, its groups moved to the stage's ranks, in three slots:

- `forward` and `backward`: what one micro-batch runs (the batch slices loaded first, every
  forward op with the redistributions into it, then every backward op), run once per
  micro-batch in the schedule's order (`schedule_slots`);
- `update`: once per step, on the gradients summed over the micro-batches (`accumulated`):
  gradient synchronisation, updates, writebacks.

A store key one stage writes and another reads is sent between the same device of both
stages (`Send` right after its last write, `Recv` right before its first read), in the
writer's layout: the reader's own redistribution then gives its op the layout it wants. A
parameter read on several stages (tied embeddings) is updated on the first and its next value
sent to the others at the end of the step. Sends carry a tag per key, so a pair of stages
never confuses two keys, and arrive in order per tag, so micro-batches never mix.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from autostrat.autodiff import op_phase
from autostrat.cost import dtype_size
from autostrat.errors import RuntimeBackendError
from autostrat.layout.layout import Layout
from autostrat.runtime.program import Communicate, Compute, Load, Recv, Send, lower_programs

SLOTS = ("forward", "backward", "update")
SCHEDULES = ("1f1b", "gpipe")  # as `search.stages.SCHEDULES` (the runtime does not import the search)
MAX_TAG = 32767  # the smallest tag upper bound MPI guarantees


@dataclass(frozen=True)
class StageProgram:
    """What one rank of a pipeline runs per step (see the module docstring)."""

    rank: int
    device_num: int
    stage: int
    stages: int
    micro_batches: int
    schedule: str
    partitions: tuple
    loads: tuple[Load, ...]  # parameters and constants, once per step
    forward: tuple
    backward: tuple
    update: tuple
    inputs: tuple[str, ...]  # graph inputs: every micro-batch loads its own slice
    accumulated: tuple[str, ...]  # keys summed over the micro-batches for the update slot
    outputs: tuple[tuple[str, str], ...]  # (graph output, key): the loss, on the last stage
    updates: tuple[tuple[str, str], ...]  # (parameter or state, key of its next value)

    def slots(self) -> tuple[tuple[str, int], ...]:
        return schedule_slots(self.stage, self.stages, self.micro_batches, self.schedule)

    def communications(self) -> tuple:
        """Every instruction that sends, slot by slot, each predicting what it sends per step
        (a micro-batch's slots run once per micro-batch)."""
        found = []
        for slot in SLOTS:
            times = 1 if slot == "update" else self.micro_batches
            found += [replace(i, predicted=i.predicted * times) for i in getattr(self, slot) if isinstance(i, (Communicate, Send))]
        return tuple(found)

    def own_slices(self, whole: dict) -> dict:
        """This rank's slices of the whole arrays in `whole` that its program loads."""
        ranges = {load.tensor: load.ranges for load in self.loads}
        return {name: array[tuple(slice(a, b) for a, b in ranges[name])] for name, array in whole.items() if name in ranges}


def schedule_slots(stage: int, stages: int, micro_batches: int, schedule: str) -> tuple[tuple[str, int], ...]:
    """The order stage `stage` runs its micro-batches' forward and backward slots in.

    1F1B (Megatron's non-interleaved schedule): ``stages - stage - 1`` forwards to fill the
    pipeline, then one forward and one backward in turn, then the remaining backwards; GPipe:
    every forward, then every backward.

    Example (the first of 2 stages, 3 micro-batches):
        >>> schedule_slots(0, 2, 3, "1f1b")
        (('forward', 0), ('forward', 1), ('backward', 0), ('forward', 2), ('backward', 1), ('backward', 2))
        >>> schedule_slots(1, 2, 2, "gpipe")
        (('forward', 0), ('forward', 1), ('backward', 0), ('backward', 1))
    """
    if schedule == "gpipe":
        return tuple(("forward", i) for i in range(micro_batches)) + tuple(("backward", i) for i in range(micro_batches))
    warmup = min(stages - stage - 1, micro_batches)
    slots = [("forward", i) for i in range(warmup)]
    for i in range(micro_batches - warmup):
        slots += [("forward", warmup + i), ("backward", i)]
    return tuple(slots + [("backward", i) for i in range(micro_batches - warmup, micro_batches)])


def lower_stage_programs(plan) -> tuple[StageProgram, ...]:
    """One `StageProgram` per rank of the pipeline plan `plan` (``plan.pipeline`` set).

    Example (a 2-block stack, 2 stages of 2 devices: stage 0 sends the activation on and
    receives its gradient back):
        >>> from autostrat.autodiff import SGD, build_training
        >>> from autostrat.frontend import trace
        >>> from autostrat.models import TransformerStack
        >>> from autostrat.search import SearchOptions
        >>> from autostrat.search.pipeline import plan_pipeline
        >>> net = TransformerStack(layers=2, hidden=16, heads=2, seq=4, batch=4)
        >>> plan = plan_pipeline(build_training(trace(net, *net.example_inputs()), SGD()), 4, 2, 2, SearchOptions())
        >>> program = lower_stage_programs(plan)[1]  # stage 0, device 1
        >>> [(type(i).__name__, i.key) for i in program.forward + program.backward if isinstance(i, (Send, Recv))]
        [('Send', 'blocks.0.residual2:0'), ('Recv', 'grad/blocks.0.residual2:0')]
    """
    pipeline = plan.pipeline
    local = lower_programs(plan)
    owners = _owners(plan.graph, local[0].instructions)
    cutter = _Cutter(plan, local[0], owners)
    return tuple(cutter.program(local[rank % pipeline.group_size], rank) for rank in range(pipeline.device_num))


def _owners(graph, instructions) -> list[str | None]:
    """Per instruction, the op it belongs to: an op's input redistributions and kernel are its;
    the trailing ones (assembling the loss, writing updates back) the op producing what they
    read; a load none."""
    owners: list[str | None] = [None] * len(instructions)
    pending: list[int] = []
    for index, instruction in enumerate(instructions):
        if isinstance(instruction, Compute):
            for waiting in pending + [index]:
                owners[waiting] = instruction.op
            pending = []
        elif isinstance(instruction, Communicate):
            pending.append(index)
    for index in pending:  # a multi-step redistribution reads its own result after the first step
        source = instructions[index].source
        owners[index] = graph.tensors[source].producer if source in graph.tensors else owners[index - 1]
    return owners


def _reads(instruction) -> tuple[str, ...]:
    if isinstance(instruction, Compute):
        return instruction.inputs
    if isinstance(instruction, Send):
        return (instruction.key,)
    return (instruction.source,) if isinstance(instruction, Communicate) else ()


def _writes(instruction) -> tuple[str, ...]:
    if isinstance(instruction, Compute):
        return instruction.outputs
    if isinstance(instruction, Recv):
        return (instruction.key,)
    return (instruction.target,) if isinstance(instruction, Communicate) else ()


class _Cutter:
    """Cuts device programs into stage programs; what all ranks share is worked out once."""

    def __init__(self, plan, template, owners):
        self.plan, self.pipeline, self.owners = plan, plan.pipeline, owners
        self.template = template
        self.slot_of = [None if owner is None else op_phase(owner) for owner in owners]
        self.writer: dict[str, int] = {}  # key -> the stage writing it (keys every stage writes: absent)
        self.last_write: dict[str, int] = {}  # key -> index of its last write
        for index, (instruction, owner) in enumerate(zip(template.instructions, owners)):
            for key in _writes(instruction):
                self.last_write[key] = index
                if owner not in self.pipeline.shared:
                    self.writer[key] = self.pipeline.op_stages[owner]
        self.transfers = self._transfers()
        self.outgoing: dict[tuple[int, str], list] = {}  # (writing stage, key) -> [(reading stage, tag)]
        for (key, reader), (writer, _, tag) in self.transfers.items():
            self.outgoing.setdefault((writer, key), []).append((reader, tag))
        self.broadcasts = self._broadcasts(len(self.transfers))
        self.layouts = self._key_layouts()
        group = self.pipeline.group_size
        self.partitions = tuple(tuple(tuple(member + s * group for member in g) for s in range(self.pipeline.stages) for g in partition)
                                for partition in template.partitions)  # the same on every rank

    def _stages_of(self, owner: str) -> range | tuple[int]:
        return range(self.pipeline.stages) if owner in self.pipeline.shared else (self.pipeline.op_stages[owner],)

    def _transfers(self) -> dict[tuple[str, int], tuple[int, str, int]]:
        """(key, reading stage) -> (writing stage, reading slot, tag), first read first."""
        found: dict = {}
        for index, (instruction, owner) in enumerate(zip(self.template.instructions, self.owners)):
            for key in _reads(instruction):
                writer = self.writer.get(key)
                for stage in self._stages_of(owner) if owner is not None and writer is not None else ():
                    if stage != writer and (key, stage) not in found:
                        self._check_slots(key, self.slot_of[self.last_write[key]], self.slot_of[index])
                        found[(key, stage)] = (writer, self.slot_of[index], len(found) % MAX_TAG)
        return found

    def _check_slots(self, key: str, written: str, read: str) -> None:
        if written == "update" or (read == "update") != (written == "update") or (written, read) == ("backward", "forward"):
            raise RuntimeBackendError(f"pipeline: {key} is written in the {written} of one stage and read in the {read} of "
                                      f"another; stages exchange a micro-batch's activations and gradients only")

    def _broadcasts(self, first_tag: int) -> dict[str, tuple[int, tuple[int, ...], int]]:
        """Parameter read on several stages -> (updating stage, other stages loading it, tag)."""
        loaders: dict[str, set[int]] = {}
        for index, instruction in enumerate(self.template.instructions):
            for key in _reads(instruction):
                owner = self.owners[index]
                if owner is not None and self.plan.graph.tensors.get(key) is not None and self.plan.graph.tensors[key].kind == "parameter":
                    loaders.setdefault(key, set()).update(self._stages_of(owner))
        found = {}
        for parameter, value in self.plan.graph.updates:
            updater = self.writer.get(value)
            others = tuple(sorted(loaders.get(parameter, set()) - {updater}))
            if updater is not None and others:
                found[parameter] = (updater, others, (first_tag + len(found)) % MAX_TAG)
        return found

    def _key_layouts(self) -> dict[str, Layout]:
        """The layout of every key a redistribution writes (a graph tensor's is the plan's)."""
        layouts = {}
        for edge in self.plan.redistributions:
            layouts[f"{edge.tensor}>{edge.consumer}[{edge.input_index}]"] = edge.plan.dst
        for writeback in self.plan.writebacks:
            layouts[f"{writeback.value}>{writeback.parameter}"] = writeback.plan.dst
        return layouts

    def _piece(self, key: str, device: int) -> tuple[tuple[int, ...], str]:
        """Shape and dtype of `device`'s piece of store key `key` (a tensor or a redistribution's result)."""
        layout = self.plan.layouts.get(key) or self.layouts[key]
        return tuple(b - a for a, b in layout.slice_range(device)), self.plan.graph.tensors[key.split(">")[0]].dtype

    def _recv(self, key: str, stage: int, tag: int, device: int) -> Recv:
        return Recv(key, stage * self.pipeline.group_size + device, tag, *self._piece(key, device))

    def _send(self, key: str, stage: int, tag: int, device: int) -> Send:
        shape, dtype = self._piece(key, device)
        return Send(key, stage * self.pipeline.group_size + device, tag, math.prod(shape) * dtype_size(dtype), f"{key} -> stage {stage}")

    def program(self, device_program, rank: int) -> StageProgram:
        group = self.pipeline.group_size
        stage, device = divmod(rank, group)
        slots: dict[str, list] = {slot: [] for slot in SLOTS}
        received: set[str] = set()
        for index, (instruction, owner) in enumerate(zip(device_program.instructions, self.owners)):
            if owner is None or stage not in self._stages_of(owner):
                continue
            slot = slots[self.slot_of[index]]
            for key in _reads(instruction):
                incoming = self.transfers.get((key, stage))
                if incoming is not None and key not in received:  # its first reader: the slot _transfers found
                    received.add(key)
                    slot.append(self._recv(key, incoming[0], incoming[2], device))
            slot.append(_moved(instruction, stage * group))
            for key in _writes(instruction):
                if self.last_write[key] == index:
                    slot += [self._send(key, reader, tag, device) for reader, tag in self.outgoing.get((stage, key), ())]
        updates = self._updates(device_program, stage, device, slots["update"])
        return self._assemble(device_program, rank, stage, slots, updates)

    def _updates(self, device_program, stage: int, device: int, update_slot: list) -> tuple[tuple[str, str], ...]:
        """The stage's (parameter, next value key) pairs; a parameter another stage updates
        arrives at the end of the step (the update slot sends or receives it)."""
        updates, values = [], dict(self.plan.graph.updates)
        for parameter, key in device_program.updates:
            updater = self.writer.get(values[parameter])
            shared = updater is None
            if shared or updater == stage:
                updates.append((parameter, key))
            broadcast = self.broadcasts.get(parameter)
            if broadcast is None:
                continue
            _, readers, tag = broadcast
            if updater == stage:
                update_slot += [self._send(key, reader, tag, device) for reader in readers]
            elif stage in readers:
                update_slot.append(self._recv(key, updater, tag, device))
                updates.append((parameter, key))
        return tuple(updates)

    def _assemble(self, device_program, rank: int, stage: int, slots: dict, updates) -> StageProgram:
        read = {key for slot in slots.values() for i in slot for key in _reads(i)}
        inputs = set(device_program.inputs)
        loads = [_moved(i, 0) for i in device_program.instructions if isinstance(i, Load) and i.tensor in read]
        batch = tuple(i for i in loads if i.tensor in inputs)
        written_per_micro = {key for slot in ("forward", "backward") for i in slots[slot] for key in _writes(i)}
        read_in_update = {key for i in slots["update"] for key in _reads(i)}
        outputs = tuple((tensor, key) for tensor, key in device_program.outputs
                        if self.pipeline.op_stages.get(self.plan.graph.tensors[tensor].producer) == stage)
        return StageProgram(
            rank, self.pipeline.device_num, stage, self.pipeline.stages, self.pipeline.micro_batches, self.pipeline.schedule,
            self.partitions, tuple(i for i in loads if i.tensor not in inputs), batch + tuple(slots["forward"]),
            tuple(slots["backward"]), tuple(slots["update"]), tuple(i.tensor for i in batch),
            tuple(sorted(written_per_micro & read_in_update)), outputs, updates)


def _moved(instruction, offset: int):
    """`instruction` with its ranks moved from the stage's devices to the stage's ranks."""
    if not isinstance(instruction, Communicate) or not offset:
        return instruction
    peers = tuple(peer + offset for peer in instruction.peers)
    return replace(instruction, group=tuple(member + offset for member in instruction.group), peers=peers)
