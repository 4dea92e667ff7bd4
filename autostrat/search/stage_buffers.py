"""The buffers one rank of a pipeline's device group holds over a step, and their peak: a
pipeline plan's predicted memory per device of every device group, from the plan (`buffers`
does it for a plan without stages; a run measures it apart, from the arrays its ranks hold:
`runtime.held_memory`).

A device group runs the model stages `Pipeline.device_of` gives it (its chunks); each stage
runs the part of the device's step (`buffers.device_program`) whose ops the stage runs, as
`runtime.stage_program` lowers it (its docstring says why; this module follows the same plan,
not that code):

1. Loads: the parameters, constants and state the device's stages read, once per step; the
   batch slices at the start of a micro-batch's forward on a stage that reads them.
2. Slots: every micro-batch's forward (F), backward (B) and, where the schedule splits the
   backward, weight-gradient (W) part of each stage, in the schedule's order
   (`Pipeline.orders`); each micro-batch has buffers of its own, shared by the device's
   stages. A key another device's stage writes is received before its first read on this one
   (in its writer's layout), a key another device's stage reads is sent after its last write;
   a key another stage of the same device reads stays in the micro-batch's buffers until its
   reader has read it for the last time. W is the backward's part no activation gradient needs
   (`weight_part`). A micro-batch drops its loss after its forward; each gradient the update
   reads is added into the step's sum in place right after its last use in the micro-batch
   (the first micro-batch's buffer becomes the sum), as Megatron adds a parameter's gradient
   into its main gradient once computed: at most a few of a micro-batch's gradients exist
   next to the sums, never all of them.
   A partial tensor a stage of another device reads is resolved before it is sent, where it
   is written (`crossings.crossed`).
3. The update slot, once: every stage's synchronisation, updates, writebacks (an op every
   stage runs, once per device); a parameter read on several devices is updated on one and
   its next value received by the others, the receives last.

Buffers are counted by `cost.live_bytes`'s rule: dropped after their last use in their slot.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

from autostrat.autodiff import op_phase
from autostrat.autodiff.weight_gradients import input_gradient_part
from autostrat.cost.live_bytes import LiveBytes, last_touches, release_after
from autostrat.search.buffers import DeviceProgram, Event, device_program
from autostrat.search.crossings import crossed

SLOTS = ("forward", "backward", "weight", "update")
PARTS = {"F": "forward", "B": "backward", "W": "weight"}  # a schedule's instruction kinds -> the slots they run


@dataclass
class StageSteps:
    """One stage's step on a device: `loads` (key -> bytes) once per step, the events of each
    slot (`SLOTS`), the keys summed over the micro-batches, the loss keys, the next values and
    the keys it writes that another stage of its device reads (`passed`)."""

    loads: dict[str, int] = field(default_factory=dict)
    slots: dict[str, list[Event]] = field(default_factory=lambda: {slot: [] for slot in SLOTS})
    accumulated: set[str] = field(default_factory=set)
    outputs: list[str] = field(default_factory=list)
    updates: list[tuple[str, str]] = field(default_factory=list)
    passed: set[str] = field(default_factory=set)
    receives: list[Event] = field(default_factory=list)  # next values another device sends, at the end of the step


def weight_part(graph, backward: list[Event]) -> list[bool]:
    """Per event of a stage's backward, whether it is W: no activation gradient needs it, by the
    rule the runtime shares (`autodiff.weight_gradients`); a send is B when it sends what B wrote."""
    weight = [not b for b in input_gradient_part(graph, backward, lambda e: e.op, lambda e: e.writes, lambda e: e.reads)]
    written_by_b = {key for event, w in zip(backward, weight) if not w for key in event.writes}
    for index, event in enumerate(backward):
        if not event.writes and any(key in written_by_b for key in event.reads):
            weight[index] = False
    return weight


def stage_peaks(plan) -> tuple[int, ...]:
    """Per device group of the pipeline plan `plan`, the most bytes one of its devices holds
    at once over a step.

    Example (a 2-block stack on 2 stages of 2 devices, 2 micro-batches: the first stage holds
    two micro-batches' activations, the last one):
        >>> from autostrat.autodiff import SGD, build_training
        >>> from autostrat.frontend import trace
        >>> from autostrat.models import TransformerStack
        >>> from autostrat.search import SearchOptions
        >>> from autostrat.search.pipeline import plan_pipeline
        >>> net = TransformerStack(layers=2, hidden=16, heads=2, seq=4, batch=4)
        >>> plan = plan_pipeline(build_training(trace(net, *net.example_inputs()), SGD()), 4, 2, 2, SearchOptions())
        >>> stage_peaks(plan) == plan.pipeline.peak_bytes, len(stage_peaks(plan))
        (True, 2)
    """
    return tuple(replay.memory.peak for replay in _replays(plan))


def stage_peak_buffers(plan, counted=None) -> tuple[tuple[tuple[tuple[str, int], ...], int], ...]:
    """Per device group of the pipeline plan `plan`, what `buffers.peak_buffers` gives for a plan
    without stages: the (key, bytes) pairs one of its devices holds at its peak, sorted (a key of a
    micro-batch's buffer once per micro-batch held), and the most bytes of keys `counted`
    accepts held at once.

    Example: see `stage_peaks` (the pairs of stage s sum to its peak).
    """
    return tuple((tuple(sorted((key, size) for (_, key), size in replay.memory.at_peak)), replay.memory.counted_peak)
                 for replay in _replays(plan, True, counted))


def _replays(plan, keep_peak: bool = False, counted=None) -> list:
    cut = _StageCut(plan, crossed(plan, device_program(plan)))
    pipeline, orders, replays = plan.pipeline, plan.pipeline.orders, []
    for device in range(pipeline.devices):
        chunks = tuple(cut.steps(orders.stage(device, chunk), chunk == 0) for chunk in range(pipeline.chunks))
        replay = _Replay(chunks, keep_peak, None if counted is None else lambda key: counted(key[1]))
        replay.run(orders.orders[device])
        replays.append(replay)
    return replays


class _StageCut:
    """Cuts the device's step into stage steps; what every stage shares is worked out once."""

    def __init__(self, plan, program: DeviceProgram):
        self.plan, self.pipeline, self.program = plan, plan.pipeline, program
        self.split = plan.pipeline.orders.split_backward
        self.writer: dict[str, int] = {}  # key -> the stage writing it (keys every stage writes, or loads: absent)
        self.last_write: dict[str, int] = {}  # key -> index of the event writing it last
        for index, event in enumerate(program.events):
            for key in event.writes if event.owner is not None else ():
                self.last_write[key] = index
                if event.owner not in self.pipeline.shared:
                    self.writer[key] = self.pipeline.op_stages[event.owner]
        self.receivers: dict[tuple[int, str], list[int]] = {}  # (writing stage, key) -> the stages reading it
        self.received: set[tuple[str, int]] = set()  # (key, reading stage)
        for event in program.events:
            for key in event.reads if event.owner is not None else ():
                writer = self.writer.get(key)
                for stage in self._stages_of(event.owner) if writer is not None else ():
                    if stage != writer and (key, stage) not in self.received:
                        self.received.add((key, stage))
                        self.receivers.setdefault((writer, key), []).append(stage)
        self.sizes = {key: size for event in program.events for key, size in event.writes.items()}
        self.broadcasts = self._broadcasts()
        self.runs: dict[int | None, list[int]] = {}  # stage (None: every stage) -> its events' indices, in order
        for index, event in enumerate(program.events):
            if event.owner is not None:
                self.runs.setdefault(None if event.owner in self.pipeline.shared else self.pipeline.op_stages[event.owner], []).append(index)
        self.values, self.load_events = dict(plan.graph.updates), [event for event in program.events if event.owner is None]

    def _stages_of(self, owner: str):
        return range(self.pipeline.stages) if owner in self.pipeline.shared else (self.pipeline.op_stages[owner],)

    def _local(self, stage: int, other: int) -> bool:
        return self.pipeline.device_of(stage) == self.pipeline.device_of(other)

    def _broadcasts(self) -> dict[str, tuple[int, dict[int, int]]]:
        """Parameter read on several devices -> (the stage updating it, per other device the
        first of its stages reading it, which receives it)."""
        graph, readers = self.plan.graph, {}
        for event in self.program.events:
            for key in event.reads if event.owner is not None else ():
                if key in graph.tensors and graph.tensors[key].kind == "parameter":
                    readers.setdefault(key, set()).update(self._stages_of(event.owner))
        found = {}
        for parameter, value in graph.updates:
            updater = self.writer.get(value)
            others: dict[int, int] = {}
            for stage in sorted(readers.get(parameter, set())) if updater is not None else ():
                if not self._local(stage, updater):
                    others.setdefault(self.pipeline.device_of(stage), stage)
            if others:
                found[parameter] = (updater, others)
        return found

    def steps(self, stage: int, first_chunk: bool) -> StageSteps:
        """Stage `stage`'s steps on its device; the ops every stage runs go with the device's
        `first_chunk` only."""
        steps = StageSteps()
        received: set[str] = set()
        for index in heapq.merge(self.runs.get(stage, ()), self.runs.get(None, ()) if first_chunk else ()):
            event = self.program.events[index]
            slot = steps.slots[op_phase(event.owner)]
            for key in event.reads:
                if (key, stage) in self.received and key not in received:  # its first reader on this stage
                    received.add(key)
                    if not self._local(self.writer[key], stage):
                        slot.append(Event((), {key: self.sizes[key]}))
            slot.append(event)
            for key in event.writes:
                if self.last_write[key] == index:
                    readers = self.receivers.get((stage, key), ())
                    slot += [Event((key,), {}) for reader in readers if not self._local(reader, stage)]
                    steps.passed.update(key for reader in readers if self._local(reader, stage))
        if self.split:
            backward, weight = steps.slots["backward"], weight_part(self.plan.graph, steps.slots["backward"])
            steps.slots["backward"] = [event for event, w in zip(backward, weight) if not w]
            steps.slots["weight"] = [event for event, w in zip(backward, weight) if w]
        self._updates(steps, stage, first_chunk)
        self._loads(steps, stage)
        return steps

    def _updates(self, steps: StageSteps, stage: int, first_chunk: bool) -> None:
        """The stage's next values; a parameter another device updates arrives at the end of
        the step (`StageSteps.receives`)."""
        for parameter, key in self.program.updates:
            updater = self.writer.get(self.values[parameter])
            if (updater is None and first_chunk) or updater == stage:
                steps.updates.append((parameter, key))
            updater, others = self.broadcasts.get(parameter, (None, {}))
            if updater == stage:
                steps.slots["update"] += [Event((key,), {}) for _ in others]
            elif others.get(self.pipeline.device_of(stage)) == stage:
                steps.receives.append(Event((), {key: self.sizes[key]}))
                steps.updates.append((parameter, key))

    def _loads(self, steps: StageSteps, stage: int) -> None:
        graph = self.plan.graph
        read = {key for events in steps.slots.values() for event in events for key in event.reads}
        batch = []
        for event in self.load_events:
            [(key, size)] = event.writes.items()
            if key in read and key in graph.tensors and graph.tensors[key].kind == "input":  # not a main copy
                batch.append(event)
            elif key in read:
                steps.loads[key] = size
        steps.slots["forward"][:0] = batch
        micro = {key for slot in ("forward", "backward", "weight") for event in steps.slots[slot] for key in event.writes}
        steps.accumulated = micro & {key for event in steps.slots["update"] for key in event.reads}
        steps.outputs = [key for tensor, key in self.program.outputs
                         if self.pipeline.op_stages.get(graph.tensors[tensor].producer) == stage]


class _Replay:
    """The live bytes of a device's buffers: the step's own (space "") and each micro-batch's
    (space: its index), which the device's stages share."""

    def __init__(self, chunks: tuple[StageSteps, ...], keep_peak: bool = False, counted=None):
        self.chunks, self.memory = chunks, LiveBytes(keep_peak, counted)
        self.summaries: dict[tuple, tuple] = {}  # an instruction's signature -> what its events did (`_slot`)
        self.micro_release, self.micro_sums = [], []  # per chunk and micro-batch event: keys dropped, summed after it
        for steps in chunks:
            micro = steps.slots["forward"] + steps.slots["backward"] + steps.slots["weight"]
            kept = steps.accumulated | set(steps.outputs) | steps.passed
            self.micro_release.append(release_after((event.touched for event in micro), kept))
            self.micro_sums.append(last_touches((event.touched for event in micro), steps.accumulated))
        self.loads = {key: size for steps in chunks for key, size in steps.loads.items()}
        self.update = [event for steps in chunks for event in steps.slots["update"]]
        self.update += [event for steps in chunks for event in steps.receives]
        updated = {key for steps in chunks for _, key in steps.updates}
        weights = set(self.loads) - {name for steps in chunks for name, _ in steps.updates}
        self.update_release = release_after((event.touched for event in self.update), updated | weights)

    def run(self, order) -> int:
        shared, stores = dict(self.loads), {}
        self.memory.write({("", key): size for key, size in shared.items()})
        for instruction in order:
            store = stores.setdefault(instruction.micro_batch, {})
            if not self._repeated(instruction, store, shared):
                self._slot(instruction, store, shared)
        for event, released in zip(self.update, self.update_release):
            self._event(event, shared, "", released)
        return self.memory.peak

    def _slot(self, instruction, store: dict, shared: dict) -> None:
        """Run one instruction's events, and keep what they did to the bytes held (`_repeated`)."""
        steps, slot, index = self.chunks[instruction.chunk], PARTS[instruction.kind], instruction.micro_batch
        signature, memory = self._signature(instruction, store, shared), self.memory
        live, counted, before = memory.live, memory.counted_live, set(shared)
        memory.mark()
        offset = {"forward": 0, "backward": len(steps.slots["forward"]),
                  "weight": len(steps.slots["forward"]) + len(steps.slots["backward"])}[slot]
        for position, event in enumerate(steps.slots[slot]):
            self._event(event, store, index, self.micro_release[instruction.chunk][offset + position])
            self._accumulate(self.micro_sums[instruction.chunk][offset + position], store, shared, index)
        if slot == "forward":
            for key in steps.outputs:  # the loss leaves with the micro-batch's forward
                store.pop(key)
                memory.release(((index, key),))
        self.summaries[signature] = (memory.since - live, memory.live - live, memory.counted_since - counted,
                                     memory.counted_live - counted, dict(store), {key: shared[key] for key in set(shared) - before})

    def _signature(self, instruction, store: dict, shared: dict) -> tuple:
        """What an instruction's events depend on: its chunk and kind, the keys its micro-batch
        holds, and which of the chunk's sums exist (each key's size is fixed)."""
        accumulated = self.chunks[instruction.chunk].accumulated
        return instruction.chunk, instruction.kind, frozenset(store), frozenset(key for key in accumulated if key in shared)

    def _repeated(self, instruction, store: dict, shared: dict) -> bool:
        """Apply what an instruction of the same signature did before (a steady pipeline repeats
        a few instructions hundreds of times), unless it raises the peak while `keep_peak` must
        note what is held then; False when its events must run."""
        summary, memory = self.summaries.get(self._signature(instruction, store, shared)), self.memory
        if summary is None:
            return False
        most, change, counted_most, counted_change, held, made = summary
        if memory.keep_peak and memory.live + most > memory.peak:
            return False
        memory.peak, memory.counted_peak = max(memory.peak, memory.live + most), max(memory.counted_peak, memory.counted_live + counted_most)
        index = instruction.micro_batch
        for key in store:
            del memory.sizes[(index, key)]
        store.clear()
        store.update(held)
        memory.sizes.update({(index, key): size for key, size in held.items()} | {("", key): size for key, size in made.items()})
        shared.update(made)
        memory.live, memory.counted_live = memory.live + change, memory.counted_live + counted_change
        return True

    def _event(self, event: Event, store: dict, space, released) -> None:
        def named(key: str):
            return (space, key) if key in store or space == "" else ("", key)

        over = tuple((named(source), (space, target)) for source, target in event.over)
        dropped = tuple((space, key) for key in released if key in store or key in event.writes)
        self.memory.write({(space, key): size for key, size in event.writes.items()}, over, dropped)
        store.update(event.writes)
        self.memory.release(dropped)
        for key in released:
            store.pop(key, None)

    def _accumulate(self, keys, store: dict, shared: dict, index: int) -> None:
        """A stage's gradients `keys` of a micro-batch the update reads, each just computed for
        the last time: added into the step's sums in place, or, the first micro-batch's, become
        them (the buffer changes hands)."""
        for key in keys:
            size = store.pop(key)
            if key not in shared:
                shared[key] = size
                self.memory.write({("", key): size}, (((index, key), ("", key)),), ((index, key),))
            self.memory.release(((index, key),))
