"""Pipeline training: every rank runs its `stage_program.StageProgram` step after step.

A step splits every graph input of the batch along dim 0 into the micro-batches, runs the
forward, backward and weight-gradient slots of the rank's chunks in the schedule's order
(`StageProgram.order`, from `search.schedules`), each micro-batch with its own buffers (which
the rank's chunks share), adds each gradient the update reads into the step's sum in place
once the micro-batch has used it for the last time (Megatron's main gradients), and runs the
update once. The loss's sensitivity is ``1 / micro_batches``
(Megatron divides the loss by the number of micro-batches the same way), so the summed
gradients of a mean loss are the whole batch's, and the step's loss is the mean of the
micro-batches' losses: the stand-alone run of the whole batch is the reference.

Measured per rank: the bytes every instruction sent (a `Send` in phase "pipeline"), the peak
of the arrays it holds (`runtime.held_memory`: every micro-batch's buffers, the summed
gradients, the weights; the plan predicts it per stage, `Pipeline.peak_bytes`), and the
bubble twice: on the wall clock, the share of the micro-batch slots' time the rank spent in its
receives (waiting for another stage, and on a machine with fewer cores than ranks for a core
too), and on the virtual clock (`runtime.pipeline_clock`: the CPU seconds the passes ran,
composed along the messages the ranks exchanged, as on dedicated cores).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from autostrat.cost.live_bytes import last_touches, release_after
from autostrat.errors import ConfigError
from autostrat.layout import assemble_tensor
from autostrat.runtime.backend import check_world
from autostrat.runtime.executor import communicate, counted, load_slice, materialised, peer_bytes, touched, traffic_of
from autostrat.runtime.held_memory import HeldMemory
from autostrat.runtime.kernels import run_kernel
from autostrat.runtime.local import LocalCluster
from autostrat.runtime.pipeline_clock import NONE, PassClock, virtual_bubbles
from autostrat.runtime.instructions import PHASES, Communicate, Compute, Load, Recv, Send
from autostrat.runtime.training import TrainingResult, allgather_slices, phase_bytes
from autostrat.runtime.stage_program import SLOTS, StageProgram, lower_stage_programs

SLOT_OF = {"F": "forward", "B": "backward", "W": "weight"}  # a schedule's instruction kinds -> the slots they run


@dataclass(frozen=True)
class StageRun:
    """One rank's run: the loss of every step (its stage computes it: the last), its final
    slices, the bytes per step by phase it sent, its peak live bytes, its wall-clock bubble, the
    CPU seconds its thread spent on one F, B and W of a chunk on average (its receives and its
    memory samples left out), those CPU seconds over the parts' wall seconds without them (below 1 where
    the machine's cores are shared: a busy rank then waits for a core too, and a woken one for
    its turn), and its passes' trace for the virtual clock (`PassClock.trace`)."""

    rank: int
    losses: tuple[float, ...]
    slices: dict
    measured: dict
    peak_bytes: int
    bubble: float
    part_seconds: tuple[float, float, float] = (0.0, 0.0, 0.0)
    cpu_share: float = 1.0
    trace: np.ndarray | None = None


def micro_batches_of(batch: dict, inputs: tuple[str, ...], count: int) -> list[dict]:
    """`batch`'s graph `inputs` cut along dim 0 into `count` equal micro-batches.

    Example:
        >>> [b["x"].tolist() for b in micro_batches_of({"x": np.arange(4)}, ("x",), 2)]
        [[0, 1], [2, 3]]
    """
    pieces = [{} for _ in range(count)]
    for name in inputs:
        array = np.asarray(batch[name])
        if array.ndim == 0 or array.shape[0] % count:
            raise ConfigError(f"pipeline: input {name} of shape {list(array.shape)} cannot be cut into {count} "
                              f"micro-batches along dim 0")
        for index, piece in enumerate(np.split(array, count)):
            pieces[index][name] = piece
    return pieces


class StageRunner:
    """Runs a stage program's steps on one rank, keeping its measurements; `on_instruction(index,
    instruction)` before each instruction (index: the instructions run so far), as `execute` calls
    it: a rank's watchdog sees the stage make progress."""

    def __init__(self, program: StageProgram, backend, on_instruction=None):
        self.program, self.backend, self.on_instruction, self.ran = program, backend, on_instruction, 0
        backend.prepare(program.partitions)
        outputs = {key for _, key in program.outputs}
        self.micro_release = [release_after((touched(i) for slot in SLOTS for i in chunk.instructions(slot)),
                                            set(chunk.accumulated) | outputs | set(chunk.passed)) for chunk in program.chunks]
        self.micro_sums = [last_touches((touched(i) for slot in SLOTS for i in chunk.instructions(slot)), set(chunk.accumulated))
                           for chunk in program.chunks]  # per instruction, the gradients added into the sums after it
        updated = {key for _, key in program.updates}
        weights = {i.tensor for i in program.loads} - {name for name, _ in program.updates}
        self.update_release = release_after((touched(i) for i in program.update), updated | weights)
        self.sent = np.zeros(len(program.communications()), np.int64)  # per communication instruction, all steps
        self.sent_to = np.zeros(program.device_num, np.int64)  # per destination rank, all steps (`executor.peer_bytes`)
        self.position = {}  # (chunk, slot, index in the slot) -> index among the communications
        for chunk, part in enumerate(program.chunks):
            for slot in SLOTS:
                for index, instruction in enumerate(part.instructions(slot)):
                    if isinstance(instruction, (Communicate, Send)):
                        self.position[(chunk, slot, index)] = len(self.position)
        for index, instruction in enumerate(program.update):
            if isinstance(instruction, (Communicate, Send)):
                self.position[(None, "update", index)] = len(self.position)
        self.last = "weight" if any(i.kind == "W" for i in program.order()) else "backward"
        self.held, self.stores, self.resident = HeldMemory(), {}, {}  # a run's measurement: the arrays themselves
        self.restart_timing()

    def restart_timing(self) -> None:
        """Forget the timings of the steps run so far (`train_stage`: a warm-up step's)."""
        self.waited = self.busy = 0.0
        self.measuring = 0.0  # wall seconds of the passes' memory samples (`_sample`), not their compute
        self.part_busy = dict.fromkeys(SLOT_OF, 0.0)  # per instruction kind, wall seconds run (waits, samples left out)
        self.part_cpu = dict.fromkeys(SLOT_OF, 0.0)  # per instruction kind, the thread's CPU seconds (the same left out)
        self.parts = dict.fromkeys(SLOT_OF, 0)  # per instruction kind, how many ran
        self.clock = PassClock()

    def cpu_share(self) -> float:
        """The thread's CPU seconds in the instructions over their wall seconds, receives and memory samples left out."""
        busy = sum(self.part_busy.values())
        return sum(self.part_cpu.values()) / busy if busy else 1.0

    def part_seconds(self) -> tuple[float, float, float]:
        """The mean CPU seconds of one F, B and W (0 for a kind that never ran)."""
        return tuple(self.part_cpu[kind] / self.parts[kind] if self.parts[kind] else 0.0 for kind in SLOT_OF)

    def step(self, values: dict, batch: dict, resident: dict) -> tuple[list[float], dict]:
        program = self.program
        self.resident = resident
        shared = {i.tensor: load_slice(i, values, resident) for i in program.loads}
        self.shared = shared
        micro_values = micro_batches_of(batch, program.inputs, program.micro_batches)
        self.stores = {}
        losses = [0.0] * program.micro_batches
        started = time.perf_counter()
        waited = self.waited
        for instruction in program.order():
            began, left_out = time.perf_counter(), self.waited + self.measuring
            self.clock.begin()
            self._part(instruction, values | micro_values[instruction.micro_batch], losses)
            self.part_cpu[instruction.kind] += self.clock.end()
            self.part_busy[instruction.kind] += time.perf_counter() - began - (self.waited + self.measuring - left_out)
            self.parts[instruction.kind] += 1
        self.busy += time.perf_counter() - started - (self.waited - waited)
        self.clock.close_step()
        for position, (instruction, released) in enumerate(zip(program.update, self.update_release)):
            self._run(instruction, shared, shared, values, released, (None, "update", position))
        self.backend.complete_sends()
        return losses, {name: shared.pop(key) for name, key in program.updates}

    def _part(self, instruction, values: dict, losses: list) -> None:
        """Run one instruction of the schedule: a slot of one chunk on one micro-batch."""
        chunk, index = self.program.chunks[instruction.chunk], instruction.micro_batch
        slot = SLOT_OF[instruction.kind]
        store = self.stores.setdefault(index, {})
        offset = sum(len(chunk.instructions(before)) for before in SLOTS[:SLOTS.index(slot)])
        release, sums = self.micro_release[instruction.chunk], self.micro_sums[instruction.chunk]
        for position, step in enumerate(chunk.instructions(slot)):
            self._run(step, store, self.shared, values, release[offset + position], (instruction.chunk, slot, position))
            self._accumulate(sums[offset + position], store, self.shared)
        if slot == "forward":
            for _, key in self.program.outputs:
                if key in store:
                    losses[index] = float(np.mean(np.asarray(store.pop(key), np.float64)))
        elif slot == self.last and not store:
            del self.stores[index]

    @staticmethod
    def _accumulate(keys, store: dict, shared: dict) -> None:
        """Add the micro-batch's gradients `keys` (what the update reads), each just computed for
        the last time, into the step's sums: in place, as Megatron adds a parameter's gradient
        into its main gradient, so the micro-batch never holds its gradients next to the sums."""
        for key in keys:
            piece = store.pop(key)
            if key in shared:
                np.add(shared[key], piece, out=shared[key])  # the rank's own sum (a received piece is a copy)
            else:
                shared[key] = piece  # the micro-batch's buffer becomes the sum's

    def _run(self, instruction, store: dict, shared: dict, values: dict, released, where) -> None:
        def read(key: str):
            return store[key] if key in store else shared[key]

        if self.on_instruction is not None:
            self.on_instruction(self.ran, instruction)
        self.ran += 1
        if isinstance(instruction, Load):
            written = {instruction.tensor: load_slice(instruction, values, None)}
        elif isinstance(instruction, Compute):
            written = dict(zip(instruction.outputs, run_kernel(instruction.op_type, [read(key) for key in instruction.inputs],
                                                               dict(instruction.attrs), instruction.context)))
        elif isinstance(instruction, Recv):
            began = time.perf_counter()
            self.clock.waiting(instruction.source, instruction.tag)
            written = {instruction.key: self.backend.recv(instruction.shape, instruction.dtype, instruction.source, instruction.tag)}
            self.clock.received()
            self.waited += time.perf_counter() - began
        else:
            before = len(self.backend.sent)
            if isinstance(instruction, Send):
                self.clock.sending(instruction.dest, instruction.tag)
                self.backend.send(read(instruction.key), instruction.dest, instruction.tag)
                written = {}
            else:
                written = {instruction.target: communicate(instruction, self.backend, read(instruction.source))}
            traffic = traffic_of(instruction, self.backend.sent[before:])
            self.sent[self.position[where]] += traffic.sent
            self.sent_to += peer_bytes((traffic,), len(self.sent_to))
        written = materialised(instruction, written, store, released)
        self._sample(instruction, written, [read(key) for key in touched(instruction) if key not in written])
        store.update(written)
        for key in released:
            store.pop(key, None)

    def _sample(self, instruction, written: dict, inputs: list) -> None:
        """Measure what the rank holds now: its weights and sums, every micro-batch's buffers,
        the slices it has yet to load, this instruction's inputs and its counted results.

        The pass's clock stops meanwhile: the sample visits every array the rank holds, after
        every instruction, so its seconds grow with the micro-batches in flight, and they are
        the measurement's, not the pass's compute (GPipe on 4 MPI ranks: 24 % of a rank's pass
        CPU seconds, a forward's 1.4 ms with one micro-batch held to 3.0 with eight)."""
        began = time.perf_counter()
        self.clock.pause()
        results = written.values() if counted(instruction) else ()
        self.held.sample(self.shared.values(), *(store.values() for store in self.stores.values()), results, inputs,
                         self.resident.values())
        self.clock.resume()
        self.measuring += time.perf_counter() - began


def stage_peaks_per_rank(plan) -> tuple[int, ...]:
    """Per rank of the pipeline plan `plan`, its device group's predicted peak
    (`Pipeline.peak_bytes`, from the plan: every device of a group holds slices of equal sizes)."""
    pipeline = plan.pipeline
    return tuple(pipeline.peak_bytes[rank // pipeline.group_size] for rank in range(pipeline.device_num))


def train_stage(program: StageProgram, backend, values: dict, batches, on_step=None, share_loss: int | None = None) -> StageRun:
    """Run one training step per batch on this rank; `on_step(step, loss)` after each step
    (on the rank computing the loss, or on rank 0 with `share_loss`, that rank, which sends
    every step's loss there). Of several steps the first warms up (its buffers allocated and its
    kernels called for the first time: a GPipe step's passes ran 35 % longer on 4 MPI ranks):
    the timings are the steps' after it."""
    runner, resident, losses = StageRunner(program, backend), {}, []
    for step, batch in enumerate(batches):
        micro_losses, resident = runner.step(values, batch, resident)
        if step == 0 and len(batches) > 1:
            runner.restart_timing()
        loss = float(np.mean(micro_losses))
        if share_loss is not None:  # the run report's loss, not the plan's traffic: uncounted
            gathered = backend.gather_report(np.array([loss]))
            loss = float(gathered[share_loss][0]) if gathered is not None else loss
        losses.append(loss)
        if on_step is not None:
            on_step(step, loss)
    measured = phase_bytes(program, tuple(runner.sent), len(batches))
    wall = runner.busy + runner.waited
    return StageRun(program.rank, tuple(losses), resident, measured, runner.held.peak, runner.waited / wall if wall else 0.0,
                    runner.part_seconds(), runner.cpu_share(), runner.clock.trace())


def pipeline_values(plan, values: dict) -> dict:
    """`values` (the whole batch's graph's: parameters and state) with the micro-batch graph's
    own constants (a mean's divisor counts a micro-batch) and the loss's sensitivity
    ``1 / micro_batches`` (see the module docstring)."""
    graph = plan.graph
    constants = {name: np.asarray(tensor.asnumpy()) for name, tensor in graph.values.items() if graph.tensors[name].kind == "constant"}
    seed = f"grad/{graph.outputs[0]}"
    ones = constants[seed]
    return values | constants | {seed: np.asarray(ones / plan.pipeline.micro_batches, ones.dtype)}


def holder_stage(plan, name: str) -> int:
    """The device group whose ranks hold the final value of updated tensor `name` (its update's)."""
    producer = plan.graph.tensors[dict(plan.graph.updates)[name]].producer
    return plan.pipeline.device_of(plan.pipeline.op_stages.get(producer, 0))


def loss_rank(plan) -> int:
    """The rank whose losses a pipeline run reports: the last device of the last stage's group."""
    pipeline = plan.pipeline
    return (pipeline.device_of(pipeline.stages - 1) + 1) * pipeline.group_size - 1


def train_pipeline_locally(plan, values: dict, batches, on_step=None):
    """Train the pipeline plan `plan` with every rank a `LocalCluster` thread (see
    `training.train_locally`, which calls it for a pipeline plan)."""
    programs = lower_stage_programs(plan)
    values = pipeline_values(plan, values)
    last = loss_rank(plan)
    runs = LocalCluster(plan.pipeline.device_num).run(
        lambda backend: train_stage(programs[backend.rank], backend, values, batches, on_step if backend.rank == last else None))
    return _result(plan, programs, runs, runs[last].losses, [run.slices for run in runs])


def train_pipeline_collective(plan, backend, values: dict, batches, on_step=None, every_rank: bool = False):
    """`train_pipeline_locally` on this rank of any backend (see `training.train_collective`)."""
    check_world(plan.pipeline.device_num, backend)
    programs = lower_stage_programs(plan)
    program = programs[backend.rank]
    run = train_stage(program, backend, pipeline_values(plan, values), batches, on_step if backend.rank == 0 else None,
                      share_loss=loss_rank(plan))
    slices = _gathered_slices(plan, backend, run.slices)
    trace = np.full((max(trace_rows(p, len(batches)) for p in programs), 4), NONE)  # equal shapes for the gather
    trace[:len(run.trace)] = run.trace
    vector = [run.measured[phase] for phase in PHASES] + [run.peak_bytes, run.bubble, *run.part_seconds, run.cpu_share]
    gathered = backend.gather_report(np.concatenate([np.array(vector, np.float64), trace.ravel()]))
    if gathered is None:
        return _result(plan, programs, None, run.losses, slices) if every_rank else None
    count = len(PHASES)
    runs = [StageRun(rank, (), {}, {p: int(v) for p, v in zip(PHASES, row)}, int(row[count]), float(row[count + 1]),
                     tuple(float(v) for v in row[count + 2:count + 5]), float(row[count + 5]), row[count + 6:].reshape(-1, 4))
            for rank, row in enumerate(gathered)]
    return _result(plan, programs, runs, run.losses, slices)


def trace_rows(program: StageProgram, steps: int) -> int:
    """The rows of a rank's `PassClock` trace over `steps` steps at most: one per stage-to-stage
    message of its passes, one per step's end."""
    messages = sum(isinstance(i, (Send, Recv)) for part in program.order()
                   for i in program.chunks[part.chunk].instructions(SLOT_OF[part.kind]))
    return steps * (messages + 1)


def _gathered_slices(plan, backend, mine: dict) -> list[dict]:
    """Every rank's slice of every updated tensor, on every rank (the ranks of other stages
    than a tensor's holder send none of it)."""
    world = tuple(range(backend.device_num))
    backend.prepare(((world,),))
    group, slots = plan.pipeline.group_size, {}
    for name, _ in plan.graph.updates:
        layout, holder = plan.layouts[name], holder_stage(plan, name)
        shapes = [tuple(b - a for a, b in layout.slice_range(rank % group)) if rank // group == holder else None for rank in world]
        slots[name] = (shapes, plan.graph.tensors[name].dtype)
    return allgather_slices(backend, world, mine, slots)


def _result(plan, programs, runs, losses, slices_by_rank):
    group = plan.pipeline.group_size
    parameters = {}
    for name, _ in plan.graph.updates:
        first = holder_stage(plan, name) * group
        parameters[name] = assemble_tensor([slices_by_rank[rank][name] for rank in range(first, first + group)], plan.layouts[name])
    if runs is None:
        return TrainingResult(losses, parameters)
    split, peaks = plan.pipeline.split, stage_peaks_per_rank(plan)
    virtual = virtual_bubbles([run.trace for run in runs])
    lines = (
        plan.pipeline.summary().splitlines()[0],  # the stages (which cells run where), micro-batches and schedule
        f"pipeline bubble: predicted {split.bubble:.1%}, measured {np.mean(virtual):.1%} on the virtual clock (the passes' "
        f"CPU seconds composed along the messages, as on dedicated cores; the median step, per segment), {np.mean([run.bubble for run in runs]):.1%} "
        f"on the wall clock (the share of the micro-batch slots a rank waits in its receives), means over ranks",
        f"the stage split's memory model (weights, state and gradients, activations of the micro-batches in flight) "
        f"per device group: {', '.join(f'{p:,}' for p in split.peak_bytes)} bytes",
    )
    return TrainingResult(losses, parameters, tuple(phase_bytes(p) for p in programs), tuple(run.measured for run in runs),
                          max(peaks), tuple(run.peak_bytes for run in runs), peaks, lines,
                          stage_timings=tuple((run.bubble, *run.part_seconds, run.cpu_share, bubble)
                                              for run, bubble in zip(runs, virtual)))
