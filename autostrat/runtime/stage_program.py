"""Lower a pipeline plan (`search.pipeline`) to one stage program per rank.

Rank ``r`` is device ``l = r % group`` of device group ``g = r // group``, which runs the
model stages `Pipeline.device_of` gives it (its chunks: one, or several with virtual stages).
For each of them, its program is device ``l``'s program of the stage plan
(`program.lower_programs`: every op, on one group's devices) cut to the ops the stage runs, its
groups moved to the device group's ranks (`ChunkProgram`), in the slots:

- `forward`, `backward` and `weight`: what one micro-batch runs (the batch slices loaded
  first, every forward op with the redistributions into it, then every backward op), run once
  per micro-batch in the schedule's order (`search.schedules`, the instructions F, B and W).
  Where the schedule splits the backward, `weight` is its part no activation gradient needs
  (`weight_part`: the weight gradients), else empty;
- `update`: once per step, every chunk's, on the gradients summed over the micro-batches
  (`accumulated`): gradient synchronisation, updates, writebacks.

A store key one stage writes and a stage of another device group reads is sent between the
same device of both groups (`Send` right after its last write, `Recv` right before its first
read), in the writer's layout: the reader's own redistribution then gives its op the layout it
wants. A key another stage of the same device reads stays in the micro-batch's buffers, which
the device's stages share (`ChunkProgram.passed`). A parameter read on several device groups
(tied embeddings) is updated on one and its next value sent to the others at the end of the
step (received after every chunk's update). Sends carry a tag per key, so a pair of stages
never confuses two keys, and arrive in order per tag, so micro-batches never mix (every
schedule runs a stage's micro-batches in order, per kind).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from autostrat.autodiff import op_phase
from autostrat.autodiff.weight_gradients import input_gradient_part
from autostrat.cost import dtype_size
from autostrat.errors import RuntimeBackendError
from autostrat.layout.layout import Layout
from autostrat.runtime.program import lower_programs
from autostrat.runtime.instructions import Communicate, Compute, Load, Recv, RingCompute, Send
from autostrat.runtime.stage_crossings import cross_stages
from autostrat.runtime.stage_waits import refuse_waits_forever
from autostrat.search.schedules import SCHEDULE_ORDERS, Instruction, schedule_orders

SLOTS = ("forward", "backward", "weight")  # a micro-batch's; the update runs once per step
SCHEDULES = SCHEDULE_ORDERS
MAX_TAG = 32767  # the smallest tag upper bound MPI guarantees


@dataclass(frozen=True)
class ChunkProgram:
    """What one model stage of a rank runs per micro-batch (see the module docstring)."""

    stage: int
    forward: tuple
    backward: tuple
    weight: tuple
    accumulated: tuple[str, ...]  # keys summed over the micro-batches for the update slot
    passed: tuple[str, ...] = ()  # keys it writes that another stage of its device reads

    def instructions(self, slot: str) -> tuple:
        return getattr(self, slot)


@dataclass(frozen=True)
class StageProgram:
    """What one rank of a pipeline runs per step (see the module docstring); `stage` is its
    device group (the model stage it runs when it runs one)."""

    rank: int
    device_num: int
    stage: int
    stages: int
    micro_batches: int
    schedule: str
    partitions: tuple
    loads: tuple[Load, ...]  # parameters and constants, once per step
    chunks: tuple[ChunkProgram, ...]
    update: tuple
    inputs: tuple[str, ...]  # graph inputs: every micro-batch loads its own slice
    outputs: tuple[tuple[str, str], ...]  # (graph output, key): the loss, on the last stage
    updates: tuple[tuple[str, str], ...]  # (parameter or state, key of its next value)

    def order(self) -> tuple[Instruction, ...]:
        """The instructions (F, B, W of a micro-batch on a chunk) this rank runs, in order."""
        devices = self.stages // len(self.chunks)
        return schedule_orders(self.schedule, devices, self.micro_batches, len(self.chunks)).orders[self.stage]

    def communications(self) -> tuple:
        """Every instruction that sends, chunk by chunk and slot by slot, each predicting what
        it sends per step (a micro-batch's slots run once per micro-batch)."""
        found = []
        for chunk in self.chunks:
            for slot in SLOTS:
                found += [replace(i, predicted=i.predicted * self.micro_batches) for i in chunk.instructions(slot)
                          if isinstance(i, (Communicate, Send))]
        return tuple(found + [i for i in self.update if isinstance(i, (Communicate, Send))])

    def own_slices(self, whole: dict) -> dict:
        """This rank's slices of the whole arrays in `whole` that its program loads."""
        ranges = {load.tensor: load.ranges for load in self.loads}
        return {name: array[tuple(slice(a, b) for a, b in ranges[name])] for name, array in whole.items() if name in ranges}


def weight_part(graph, backward) -> tuple[bool, ...]:
    """Per instruction of a stage's backward, whether it is W (the weight gradient: what no
    activation gradient needs), by the rule the models share (`autodiff.weight_gradients`); a
    send is B when B wrote what it sends.

    Example (a bias gradient reads the received gradient before the matmul's input gradient does):
        >>> from types import SimpleNamespace
        >>> graph = SimpleNamespace(tensors={"h": SimpleNamespace(kind="output"), "x": SimpleNamespace(kind="output")})
        >>> backward = [Recv("grad/h", 1, 0, (2,), "float32"), Compute("db", "ReduceSum", ("grad/h",), ("grad/b",), (), None),
        ...             Compute("dx", "MatMul", ("grad/h", "w"), ("grad/x",), (), None),
        ...             Compute("dw", "MatMul", ("x", "grad/h"), ("grad/w",), (), None)]
        >>> weight_part(graph, backward)
        (False, True, False, True)
    """
    op_of = lambda instruction: instruction.op if isinstance(instruction, Compute) else ""  # noqa: E731
    weight = [not b for b in input_gradient_part(graph, backward, op_of, _writes, _reads)]
    written = {key for instruction, w in zip(backward, weight) if not w for key in _writes(instruction)}
    for index, instruction in enumerate(backward):
        if isinstance(instruction, Send) and instruction.key in written:
            weight[index] = False
    return tuple(weight)


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
        >>> [chunk] = lower_stage_programs(plan)[1].chunks  # stage 0, device 1
        >>> [(type(i).__name__, i.key) for i in chunk.forward + chunk.backward if isinstance(i, (Send, Recv))]
        [('Send', 'blocks.0.residual2:0'), ('Recv', 'grad/blocks.0.residual2:0')]
    """
    pipeline = plan.pipeline
    local = lower_programs(plan)
    rings = [i.op for i in local[0].instructions if isinstance(i, RingCompute)]
    if rings:  # its micro-batch buffers and per-instruction traffic do not know an op that sends
        raise RuntimeBackendError(f"op {rings[0]}: a ring strategy (ring attention) does not run inside a pipeline stage yet; "
                                  "expected another strategy for it in a pipeline plan")
    local, owners = cross_stages(plan, local, _owners(plan.graph, local[0].instructions))
    cutter = _Cutter(plan, local[0], owners)
    programs = tuple(cutter.program(local[rank % pipeline.group_size], rank) for rank in range(pipeline.device_num))
    refuse_waits_forever(plan, programs)  # before the first step, not at a rank's timeout
    return programs


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
        self.partitions = tuple(tuple(tuple(member + s * group for member in g) for s in range(self.pipeline.devices) for g in partition)
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

    def _broadcasts(self, first_tag: int) -> dict[str, tuple[int, dict[int, int], int]]:
        """Parameter read on several device groups -> (updating stage, per other group the first
        of its stages reading it, which receives it, tag)."""
        loaders: dict[str, set[int]] = {}
        for index, instruction in enumerate(self.template.instructions):
            for key in _reads(instruction):
                owner = self.owners[index]
                if owner is not None and self.plan.graph.tensors.get(key) is not None and self.plan.graph.tensors[key].kind == "parameter":
                    loaders.setdefault(key, set()).update(self._stages_of(owner))
        found = {}
        for parameter, value in self.plan.graph.updates:
            updater, others = self.writer.get(value), {}
            for stage in sorted(loaders.get(parameter, set())) if updater is not None else ():
                if not self._local(stage, updater):
                    others.setdefault(self.pipeline.device_of(stage), stage)
            if others:
                found[parameter] = (updater, others, (first_tag + len(found)) % MAX_TAG)
        return found

    def _local(self, stage: int, other: int) -> bool:
        return self.pipeline.device_of(stage) == self.pipeline.device_of(other)

    def _key_layouts(self) -> dict[str, Layout]:
        """The layout of every key a redistribution writes (a graph tensor's is the plan's)."""
        layouts = {}
        for edge in self.plan.redistributions:
            layouts[f"{edge.tensor}>{edge.consumer}[{edge.input_index}]"] = edge.plan.dst
        for writeback in self.plan.writebacks:
            layouts[f"{writeback.value}>{writeback.parameter}"] = writeback.plan.dst
        for crossing in self.pipeline.crossings:
            layouts[crossing.key] = crossing.layout
        return layouts

    def _piece(self, key: str, device: int) -> tuple[tuple[int, ...], str]:
        """Shape and dtype of `device`'s piece of store key `key` (a tensor or a redistribution's result)."""
        layout = self.plan.layouts.get(key) or self.layouts[key]
        return tuple(b - a for a, b in layout.slice_range(device)), self.plan.graph.tensors[key.split(">")[0]].dtype

    def _recv(self, key: str, stage: int, tag: int, device: int) -> Recv:
        return Recv(key, self.pipeline.device_of(stage) * self.pipeline.group_size + device, tag, *self._piece(key, device))

    def _send(self, key: str, stage: int, tag: int, device: int) -> Send:
        shape, dtype = self._piece(key, device)
        return Send(key, self.pipeline.device_of(stage) * self.pipeline.group_size + device, tag,
                    math.prod(shape) * dtype_size(dtype), f"{key} -> stage {stage}")

    def program(self, device_program, rank: int) -> StageProgram:
        position, device = divmod(rank, self.pipeline.group_size)
        orders, chunks, update, receives, updates = self.pipeline.orders, [], [], [], []
        for chunk in range(self.pipeline.chunks):
            stage = orders.stage(position, chunk)
            slots, passed = self._slots(device_program, stage, device, chunk == 0)
            if orders.split_backward:
                weight = weight_part(self.plan.graph, slots["backward"])
                slots["weight"] = [i for i, w in zip(slots["backward"], weight) if w]
                slots["backward"] = [i for i, w in zip(slots["backward"], weight) if not w]
            updates += self._updates(device_program, stage, device, chunk == 0, slots["update"], receives)
            update += slots["update"]
            chunks.append((stage, slots, passed))
        return self._assemble(device_program, rank, position, chunks, tuple(update + receives), tuple(dict.fromkeys(updates)))

    def _slots(self, device_program, stage: int, device: int, first_chunk: bool) -> tuple[dict, tuple[str, ...]]:
        """Stage `stage`'s instructions on `device` by slot, and the keys it passes to another
        stage of its device; the ops every stage runs go with the device's `first_chunk` only."""
        group = self.pipeline.group_size
        slots: dict[str, list] = {slot: [] for slot in (*SLOTS, "update")}
        received, passed = set(), []
        for index, (instruction, owner) in enumerate(zip(device_program.instructions, self.owners)):
            if owner is None or stage not in self._stages_of(owner) or (owner in self.pipeline.shared and not first_chunk):
                continue
            slot = slots[self.slot_of[index]]
            for key in _reads(instruction):
                incoming = self.transfers.get((key, stage))
                if incoming is not None and key not in received:  # its first reader: the slot _transfers found
                    received.add(key)
                    if not self._local(incoming[0], stage):
                        slot.append(self._recv(key, incoming[0], incoming[2], device))
            slot.append(_moved(instruction, self.pipeline.device_of(stage) * group))
            for key in _writes(instruction):
                if self.last_write[key] == index:
                    readers = self.outgoing.get((stage, key), ())
                    slot += [self._send(key, reader, tag, device) for reader, tag in readers if not self._local(reader, stage)]
                    passed += [key for reader, _ in readers if self._local(reader, stage)]
        return slots, tuple(dict.fromkeys(passed))

    def _updates(self, device_program, stage: int, device: int, first_chunk: bool, update_slot: list,
                 receives: list) -> list[tuple[str, str]]:
        """The stage's (parameter, next value key) pairs; a parameter another device group
        updates arrives at the end of the step (sent from the update slot, into `receives`)."""
        updates, values = [], dict(self.plan.graph.updates)
        for parameter, key in device_program.updates:
            updater = self.writer.get(values[parameter])
            if (updater is None and first_chunk) or updater == stage:
                updates.append((parameter, key))
            updater, others, tag = self.broadcasts.get(parameter, (None, {}, 0))
            if updater == stage:
                update_slot += [self._send(key, reader, tag, device) for reader in others.values()]
            elif others.get(self.pipeline.device_of(stage)) == stage:
                receives.append(self._recv(key, updater, tag, device))
                updates.append((parameter, key))
        return updates

    def _assemble(self, device_program, rank: int, position: int, chunks: list, update: tuple, updates) -> StageProgram:
        read = {key for _, slots, _ in chunks for slot in slots.values() for i in slot for key in _reads(i)}
        read |= {key for i in update for key in _reads(i)}
        inputs = set(device_program.inputs)
        loads = [_moved(i, 0) for i in device_program.instructions if isinstance(i, Load) and i.tensor in read]
        read_in_update = {key for i in update for key in _reads(i)}
        programs = []
        for stage, slots, passed in chunks:
            stage_reads = {key for slot in slots.values() for i in slot for key in _reads(i)}
            batch = tuple(i for i in loads if i.tensor in inputs and i.tensor in stage_reads)
            written = {key for slot in SLOTS for i in slots[slot] for key in _writes(i)}
            programs.append(ChunkProgram(stage, batch + tuple(slots["forward"]), tuple(slots["backward"]), tuple(slots["weight"]),
                                         tuple(sorted(written & read_in_update)), passed))
        stages = {stage for stage, _, _ in chunks}
        outputs = tuple((tensor, key) for tensor, key in device_program.outputs
                        if self.pipeline.op_stages.get(self.plan.graph.tensors[tensor].producer) in stages)
        return StageProgram(
            rank, self.pipeline.device_num, position, self.pipeline.stages, self.pipeline.micro_batches, self.pipeline.schedule,
            self.partitions, tuple(i for i in loads if i.tensor not in inputs), tuple(programs), update,
            tuple(i.tensor for i in loads if i.tensor in inputs), outputs, updates)


def _moved(instruction, offset: int):
    """`instruction` with its ranks moved from the stage's devices to the stage's ranks."""
    if not isinstance(instruction, Communicate) or not offset:
        return instruction
    peers = tuple(peer + offset for peer in instruction.peers)
    return replace(instruction, group=tuple(member + offset for member in instruction.group), peers=peers)
