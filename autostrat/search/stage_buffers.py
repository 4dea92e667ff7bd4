"""The buffers one rank of a pipeline stage holds over a step, and their peak: a pipeline plan's
predicted memory per device of every stage, from the plan (`buffers` does it for a plan without
stages; a run measures it apart, from the arrays its ranks hold: `runtime.held_memory`).

A stage's device runs the part of the device's step (`buffers.device_program`) whose ops the
stage runs, as `runtime.stage_program` lowers it (its docstring says why; this module follows
the same plan, not that code):

1. Loads: the parameters, constants and state the stage reads, once per step; the batch slices
   at the start of every micro-batch's forward.
2. Slots: every micro-batch's forward and backward ops, in the schedule's order
   (`stages.slot_order`: 1F1B holds up to ``stages - stage`` micro-batches, GPipe all), each
   micro-batch with buffers of its own; a key another stage writes is received before its first
   read on this one (in its writer's layout), a key another stage reads is sent after its last
   write. A micro-batch drops its loss after its forward; after its backward, the gradients the
   update reads are added into the step's sums (the first micro-batch's buffers become them).
3. The update slot, once: synchronisation, updates, writebacks; a parameter read on several
   stages is updated on the first and its next value received by the others.

Buffers are counted by `cost.live_bytes`'s rule: dropped after their last use in their slot.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from autostrat.autodiff import op_phase
from autostrat.cost.live_bytes import LiveBytes, release_after
from autostrat.search.buffers import DeviceProgram, Event, device_program
from autostrat.search.stages import slot_order

SLOTS = ("forward", "backward", "update")


@dataclass
class StageSteps:
    """One stage device's step: `loads` (key -> bytes) once per step, the events of each slot
    (`SLOTS`), the keys summed over the micro-batches, the loss keys and the next values."""

    loads: dict[str, int] = field(default_factory=dict)
    slots: dict[str, list[Event]] = field(default_factory=lambda: {slot: [] for slot in SLOTS})
    accumulated: set[str] = field(default_factory=set)
    outputs: list[str] = field(default_factory=list)
    updates: list[tuple[str, str]] = field(default_factory=list)


def stage_peaks(plan) -> tuple[int, ...]:
    """Per stage of the pipeline plan `plan`, the most bytes one of its devices holds at once
    over a step.

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
    """Per stage of the pipeline plan `plan`, what `buffers.peak_buffers` gives for a plan
    without stages: the (key, bytes) pairs one of its devices holds at its peak (a key of a
    micro-batch's buffer once per micro-batch held), and the most bytes of keys `counted`
    accepts held at once.

    Example: see `stage_peaks` (the pairs of stage s sum to its peak).
    """
    return tuple((tuple((key, size) for (_, key), size in replay.memory.at_peak), replay.memory.counted_peak)
                 for replay in _replays(plan, True, counted))


def _replays(plan, keep_peak: bool = False, counted=None) -> list:
    cut = _StageCut(plan, device_program(plan))
    pipeline, replays = plan.pipeline, []
    for stage in range(pipeline.stages):
        replay = _Replay(cut.steps(stage), keep_peak, None if counted is None else lambda key: counted(key[1]))
        replay.run(slot_order(stage, pipeline.stages, pipeline.micro_batches, pipeline.schedule))
        replays.append(replay)
    return replays


class _StageCut:
    """Cuts the device's step into stage steps; what every stage shares is worked out once."""

    def __init__(self, plan, program: DeviceProgram):
        self.plan, self.pipeline, self.program = plan, plan.pipeline, program
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

    def _stages_of(self, owner: str):
        return range(self.pipeline.stages) if owner in self.pipeline.shared else (self.pipeline.op_stages[owner],)

    def _broadcasts(self) -> dict[str, tuple[int, set[int]]]:
        """Parameter read on several stages -> (the stage updating it, the others reading it)."""
        graph, readers = self.plan.graph, {}
        for event in self.program.events:
            for key in event.reads if event.owner is not None else ():
                if key in graph.tensors and graph.tensors[key].kind == "parameter":
                    readers.setdefault(key, set()).update(self._stages_of(event.owner))
        found = {}
        for parameter, value in graph.updates:
            updater = self.writer.get(value)
            if updater is not None and readers.get(parameter, set()) - {updater}:
                found[parameter] = (updater, readers[parameter] - {updater})
        return found

    def steps(self, stage: int) -> StageSteps:
        steps = StageSteps()
        received: set[str] = set()
        for index, event in enumerate(self.program.events):
            if event.owner is None or stage not in self._stages_of(event.owner):
                continue
            slot = steps.slots[op_phase(event.owner)]
            for key in event.reads:
                if (key, stage) in self.received and key not in received:  # its first reader on this stage
                    received.add(key)
                    slot.append(Event((), {key: self.sizes[key]}))
            slot.append(event)
            for key in event.writes:
                if self.last_write[key] == index:
                    slot += [Event((key,), {}) for _ in self.receivers.get((stage, key), ())]
        self._updates(steps, stage)
        self._loads(steps, stage)
        return steps

    def _updates(self, steps: StageSteps, stage: int) -> None:
        """The stage's next values; a parameter another stage updates arrives at the end of the step."""
        values = dict(self.plan.graph.updates)
        for parameter, key in self.program.updates:
            updater = self.writer.get(values[parameter])
            if updater is None or updater == stage:
                steps.updates.append((parameter, key))
            updater, readers = self.broadcasts.get(parameter, (None, ()))
            if updater == stage:
                steps.slots["update"] += [Event((key,), {}) for _ in readers]
            elif stage in readers:
                steps.slots["update"].append(Event((), {key: self.sizes[key]}))
                steps.updates.append((parameter, key))

    def _loads(self, steps: StageSteps, stage: int) -> None:
        graph = self.plan.graph
        read = {key for events in steps.slots.values() for event in events for key in event.reads}
        batch = []
        for event in (event for event in self.program.events if event.owner is None):
            [(key, size)] = event.writes.items()
            if key in read and key in graph.tensors and graph.tensors[key].kind == "input":  # not a main copy
                batch.append(event)
            elif key in read:
                steps.loads[key] = size
        steps.slots["forward"][:0] = batch
        micro = {key for slot in ("forward", "backward") for event in steps.slots[slot] for key in event.writes}
        steps.accumulated = micro & {key for event in steps.slots["update"] for key in event.reads}
        steps.outputs = [key for tensor, key in self.program.outputs
                         if self.pipeline.op_stages.get(graph.tensors[tensor].producer) == stage]


class _Replay:
    """The live bytes of a stage device's buffers: the step's own (space "") and each
    micro-batch's (space: its index)."""

    def __init__(self, steps: StageSteps, keep_peak: bool = False, counted=None):
        self.steps, self.memory = steps, LiveBytes(keep_peak, counted)
        micro = steps.slots["forward"] + steps.slots["backward"]
        self.micro_release = release_after((event.touched for event in micro), steps.accumulated | set(steps.outputs))
        updated = {key for _, key in steps.updates}
        weights = set(steps.loads) - {name for name, _ in steps.updates}
        self.update_release = release_after((event.touched for event in steps.slots["update"]), updated | weights)

    def run(self, order) -> int:
        steps, shared, stores = self.steps, dict(self.steps.loads), {}
        self.memory.write({("", key): size for key, size in shared.items()})
        forward = len(steps.slots["forward"])
        for slot, index in order:
            store = stores.setdefault(index, {})
            offset = 0 if slot == "forward" else forward
            for position, event in enumerate(steps.slots[slot]):
                self._event(event, store, index, self.micro_release[offset + position])
            if slot == "forward":
                for key in steps.outputs:  # the loss leaves with the micro-batch's forward
                    store.pop(key)
                    self.memory.release(((index, key),))
            else:
                self._accumulate(stores.pop(index), shared, index)
        for event, released in zip(steps.slots["update"], self.update_release):
            self._event(event, shared, "", released)
        return self.memory.peak

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

    def _accumulate(self, store: dict, shared: dict, index: int) -> None:
        """A micro-batch's gradients the update reads: added into the step's sums, or, the
        first micro-batch's, become them (the buffer changes hands)."""
        for key in sorted(self.steps.accumulated & set(store)):
            if key not in shared:
                shared[key] = store[key]
                self.memory.write({("", key): store[key]}, (((index, key), ("", key)),), ((index, key),))
            self.memory.release(((index, key),))
