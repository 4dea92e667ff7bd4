"""Run one rank's program on a backend, and the single-device reference run.

The executor cuts and joins along tensor dims; the backend only moves and reduces buffers.
Collective instructions are carried out as `redistribution.simulate` defines them (chunk
order); a backend reduces in its ring's order (`wire`), the same on every backend, which may
differ from the simulation's group order in the last bits of a floating-point sum.

Memory: a rank drops every buffer after the last instruction that reads it (`release_schedule`),
except its graph outputs, the next values of its parameters and state, and the parameters and
constants nothing updates (a device keeps its weights from step to step); a graph input (the
batch) goes after its last use. Every result is held as a device holds it (`materialised`): in
a buffer of its own (a kernel's output that is a numpy view of its input is copied), except an
update op's new parameter and state, written into the old ones' buffers when read for the last
time there (`autodiff.UPDATE_OP_TYPES`). The rank's `RankResult.peak_bytes` is measured from
the arrays themselves (`held_memory`, which never reads the plan): the most the distinct
blocks behind its store, its carried slices and the running instruction's inputs and results
held at once. Temporaries inside a kernel or a collective are not the rank's. The plan predicts
it (`search.buffers.plan_peak`); tests check the two agree.

The assembling of split graph outputs for the check against one device (phase "output") is not
part of the plan, as its bytes are reported apart: its buffers are not counted. Where the run
and the solver's per-op model (`search.memory.peak_bytes`) differ: the model holds every tensor
in its producer's layout until its last consumer, while a run holds a redistributed copy in its
consumer's layout too, and may drop the original early when later consumers share the copy (a
copy exists only for some pairs of producer and consumer strategies, which a per-op model
cannot price).

A plan with buckets (`runtime.bucketing`) has its gradient synchronisation on the communication
stream (`stream.SyncStream`): `SyncStart` hands a bucket's steps to it, the executor progresses
it after every instruction, and `SyncWait` takes an edge's result from it into the store; what
the stream holds (the gradients it took, the results not yet waited for) is sampled with the
rank's memory.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np

from autostrat.autodiff import UPDATE_OP_TYPES
from autostrat.cost.live_bytes import release_after
from autostrat.errors import RuntimeBackendError
from autostrat.runtime.backend import Backend
from autostrat.runtime.held_memory import HeldBlocks, HeldMemory
from autostrat.runtime.kernels import run_kernel
from autostrat.runtime.instructions import Communicate, Compute, Load, Program, Recv, RingCompute, Send
from autostrat.runtime.ring import ring_compute
from autostrat.runtime.stream import SyncStart, SyncStream, SyncWait, communicate_steps
from autostrat.runtime.sixteen_bit import rounded, run_sixteen_bit


@dataclass(frozen=True)
class Traffic:
    """One collective instruction of one rank: what the plan predicted and what was sent, in
    all and (`peers`) as ``(dest, bytes)`` per destination rank, in rank order."""

    edge: str
    kind: str
    phase: str
    predicted: int
    sent: int
    peers: tuple[tuple[int, int], ...] = ()


@dataclass(frozen=True)
class RankResult:
    """A rank's whole outputs (by graph tensor name) and its traffic, in program order."""

    rank: int
    outputs: dict
    traffic: tuple[Traffic, ...]
    updated: dict = None  # training: the rank's slice of every updated parameter and state, by name
    peak_bytes: int = 0  # the most bytes the rank's buffers held at once (see the module docstring)

    def bytes(self, phase: str, measured: bool = True) -> int:
        return sum(t.sent if measured else t.predicted for t in self.traffic if t.phase == phase)

    def sent(self) -> np.ndarray:
        """The bytes sent by each communication instruction, as integers even when there are
        none (an empty list would make a float array, which an integer running sum rejects)."""
        return np.array([traffic.sent for traffic in self.traffic], np.int64)

    def sent_to(self, device_num: int) -> np.ndarray:
        """The bytes this rank sent each rank (index = destination) over the plan's phases
        (every phase but "output", which assembles results for the check)."""
        return peer_bytes(self.traffic, device_num)


def peer_bytes(traffic, device_num: int) -> np.ndarray:
    """The bytes sent to each rank by `traffic` (`Traffic` records), phase "output" left out.

    Example:
        >>> peer_bytes([Traffic("e", "AllGather", "forward", 8, 8, ((1, 8),))], 2).tolist()
        [0, 8]
    """
    sent = np.zeros(device_num, np.int64)
    for record in traffic:
        if record.phase != "output":
            for dest, size in record.peers:
                sent[dest] += size
    return sent


def traffic_of(instruction, messages) -> Traffic:
    """The `Traffic` of one communication instruction from the `wire.Message`s it sent."""
    peers: dict[int, int] = {}
    for message in messages:
        peers[message.dest] = peers.get(message.dest, 0) + message.bytes
    return Traffic(instruction.edge, instruction.kind, instruction.phase, instruction.predicted,
                   sum(peers.values()), tuple(sorted(peers.items())))


def execute(program: Program, backend: Backend, values: dict, on_instruction=None, resident: dict | None = None) -> RankResult:
    """Run `program` with the whole arrays of its graph inputs, parameters and constants in
    `values`; every rank takes its own slices. `resident` gives tensors already as this rank's
    slices (a training run's parameters and optimiser state after the first step); `execute`
    takes them out of `resident` as it loads them, so that a slice is dropped after its last use.
    `on_instruction(index, instruction)` is called before each instruction (the MPI runtime's
    watchdog and fault injection use it).

    Example (two local ranks running the tutorial FFN):
        >>> from autostrat import nn, parallelize, set_auto_parallel_context, reset_auto_parallel_context
        >>> from autostrat.models import FFN
        >>> from autostrat.runtime.local import LocalCluster
        >>> from autostrat.runtime.program import lower_programs
        >>> set_auto_parallel_context(parallel_mode="auto_parallel", device_num=2)
        >>> net = FFN(); _ = net.dense1.matmul.shard(((2, 1), (1, 1)))
        >>> plan = parallelize(net, nn.Tensor(shape=(64, 64))); reset_auto_parallel_context()
        >>> values = graph_values(plan.graph, {"x": np.ones((64, 64), np.float32)})
        >>> programs = lower_programs(plan)
        >>> results = LocalCluster(2).run(lambda backend: execute(programs[backend.rank], backend, values))
        >>> expected = run_single_device(plan.graph, values)
        >>> bool(np.allclose(results[1].outputs["dense2.bias_add:0"], expected["dense2.bias_add:0"]))
        True
    """
    backend.prepare(program.partitions)
    store: dict[str, np.ndarray] = {}
    traffic, stream = [], SyncStream(backend, traffic_of)
    memory, held = HeldMemory(), _HeldStore(store, resident)
    backend.background = stream.progress_idle  # a blocking wait moves the stream on (`mpi.settle`)
    try:
        for index, (instruction, released) in enumerate(zip(program.instructions, release_schedule(program))):
            if on_instruction is not None:
                on_instruction(index, instruction)
            carried = resident.get(instruction.tensor) if isinstance(instruction, Load) and resident else None
            inputs, written = run_instruction(instruction, program, backend, store, (values, resident), traffic, stream)
            if carried is not None:
                held.blocks.remove(carried)  # in the store from now on, if its load keeps it
            written = materialised(instruction, written, store, released, held.ids)
            if not counted(instruction):
                held.uncount(written)
            memory.note(held.blocks.bytes_with([a for key, a in written.items() if key not in held.uncounted], inputs, stream.held()))
            for key, array in written.items():
                held.write(key, array)
            for key in released:
                held.drop(key)
            if stream.busy:
                stream.progress()  # between kernels: the stream's messages that arrived let it go on
    finally:
        backend.background = None
    outputs = {tensor: store[key] for tensor, key in program.outputs}
    updated = {name: store[key] for name, key in program.updates}
    return RankResult(program.rank, outputs, tuple(traffic), updated, memory.peak)


class _HeldStore:
    """`execute`'s store and what the rank holds between instructions, kept as the store
    changes (a walk of every array after each instruction took a third of a small training
    step): the blocks of the store's counted arrays and of the carried slices not yet loaded
    (`blocks`), the ids of the store's arrays (`ids`, for `materialised`), and the keys whose
    results are not the plan's memory (`uncounted`, see `counted`)."""

    def __init__(self, store: dict, resident: dict | None):
        self.store, self.blocks, self.ids, self.uncounted = store, HeldBlocks(), Counter(), set()
        for array in (resident or {}).values():
            self.blocks.add(array)

    def uncount(self, keys) -> None:
        for key in keys:
            if key not in self.uncounted and key in self.store:
                self.blocks.remove(self.store[key])
            self.uncounted.add(key)

    def write(self, key: str, array) -> None:
        if key in self.store:
            self.drop(key)
        self.store[key] = array
        self.ids[id(array)] += 1
        if key not in self.uncounted:
            self.blocks.add(array)

    def drop(self, key: str) -> None:
        array = self.store.pop(key)
        self.ids[id(array)] -= 1
        if key not in self.uncounted:
            self.blocks.remove(array)


def run_instruction(instruction, program: Program, backend: Backend, store: dict, loaded: tuple, traffic: list,
                    stream: SyncStream) -> tuple[list, dict]:
    """(the inputs it read, the results it wrote) of one instruction of `execute`; `loaded`:
    (`values`, `resident`); the traffic of what it sent (or waited for) appended to `traffic`."""
    if isinstance(instruction, Load):
        return [], {instruction.tensor: load_slice(instruction, *loaded)}
    if isinstance(instruction, SyncStart):  # the stream takes the bucket's gradients
        stream.start(instruction.steps, store)
        return [], {}
    if isinstance(instruction, SyncWait):
        written, records = stream.wait(instruction.steps)
        traffic.extend(records)
        return [], written
    if isinstance(instruction, RingCompute):  # a kernel that sends: its messages are its traffic
        before, inputs = len(backend.sent), [store[key] for key in instruction.inputs]
        written = dict(zip(instruction.outputs, ring_compute(instruction, inputs, backend)))
        traffic.append(traffic_of(instruction, backend.sent[before:]))
        return inputs, written
    if isinstance(instruction, Compute):
        inputs = [store[key] for key in instruction.inputs]
        return inputs, dict(zip(instruction.outputs, compute(instruction, inputs, store, program.loss_scale)))
    before, inputs = len(backend.sent), [store[instruction.source]]
    written = {instruction.target: communicate(instruction, backend, inputs[0])}
    traffic.append(traffic_of(instruction, backend.sent[before:]))
    return inputs, written


def compute(instruction: Compute, inputs: list, store: dict, loss_scale: float = 1.0) -> tuple[np.ndarray, ...]:
    """The results of one op's kernel on the rank's slices (a 16-bit run's: `sixteen_bit`)."""
    if instruction.dtypes:
        return run_sixteen_bit(instruction, inputs, store, loss_scale)
    return run_kernel(instruction.op_type, inputs, dict(instruction.attrs), instruction.context)


def counted(instruction) -> bool:
    """Whether the instruction's results are the plan's memory: not when it assembles graph
    outputs for the check (phase "output", not part of the plan, as its bytes are reported apart)."""
    return not (isinstance(instruction, Communicate) and instruction.phase == "output")


def counted_bytes(instruction, written: dict) -> dict[str, int]:
    """The bytes of the instruction's results that count (see `counted`)."""
    return {key: array.nbytes if counted(instruction) else 0 for key, array in written.items()}


def materialised(instruction, written: dict, store: dict, released, stored: Counter | None = None) -> dict:
    """The results as a device holds them: every result in a buffer of its own (a numpy view of
    an input, or an input itself, is copied), except a result written over an input read for the
    last time here (`written_over`), which takes that input's buffer. `stored`: the ids of the
    store's arrays, where the caller keeps them (else found from `store`)."""
    stored = Counter(id(array) for array in store.values()) if stored is None else stored
    own = {}
    for key, array in written.items():
        array = np.asarray(array)
        own[key] = array if array.flags.owndata and not stored[id(array)] else array.copy()
    for source, target in written_over(instruction):
        old, new = store.get(source), own[target]
        if source in released and old is not None and old.shape == new.shape and old.dtype == new.dtype and old.flags.owndata:
            np.copyto(old, new)
            own[target] = old
    return own


def written_over(instruction) -> tuple[tuple[str, str], ...]:
    """The (input, result) pairs whose buffer a result may take (see the module docstring):
    an update's next parameter and state over the old ones. (An AllReduce's sum takes a buffer
    of its own: other ranks may still read the operand, and numpy cannot reduce in place.)"""
    if isinstance(instruction, Compute) and instruction.op_type in UPDATE_OP_TYPES:
        return tuple(zip(instruction.inputs, instruction.outputs))
    return ()


def release_schedule(program: Program) -> tuple[tuple[str, ...], ...]:
    """Per instruction, the store keys no later instruction reads: dropped once it has run.
    Graph outputs (in the plan's layout and assembled), updated values and the weights nothing
    updates are never dropped; a buffer nothing reads (an unused kernel output) goes right
    after the instruction that writes it.

    Example (rank 0 of the tutorial FFN drops its slice of the input after the first matmul,
    and keeps the weights):
        >>> from autostrat import nn, parallelize, set_auto_parallel_context, reset_auto_parallel_context
        >>> from autostrat.models import FFN
        >>> from autostrat.runtime.program import lower_programs
        >>> set_auto_parallel_context(parallel_mode="auto_parallel", device_num=2)
        >>> net = FFN(); _ = net.dense1.matmul.shard(((2, 1), (1, 1)))
        >>> program = lower_programs(parallelize(net, nn.Tensor(shape=(64, 64))))[0]
        >>> reset_auto_parallel_context()
        >>> [i.op for i, released in zip(program.instructions, release_schedule(program)) if "x" in released]
        ['dense1.matmul']
        >>> any("dense1.weight" in released for released in release_schedule(program))
        False
    """
    kept = {key for output in program.outputs for key in output} | {key for _, key in program.updates} | _weights(program)
    return release_after((touched(instruction) for instruction in program.instructions), kept)


def _weights(program: Program) -> set[str]:
    """The parameters and constants nothing updates: a device keeps them from step to step."""
    updated = {name for name, _ in program.updates}
    loaded = {i.tensor for i in program.instructions if isinstance(i, Load)}
    return loaded - set(program.inputs) - updated


def touched(instruction) -> tuple[str, ...]:
    """The store keys an instruction reads or writes."""
    if isinstance(instruction, Load):
        return (instruction.tensor,)
    if isinstance(instruction, Compute):
        return instruction.inputs + instruction.outputs
    if isinstance(instruction, (Send, Recv)):
        return (instruction.key,)
    if isinstance(instruction, SyncStart):
        return instruction.reads()
    if isinstance(instruction, SyncWait):
        return instruction.writes()
    return (instruction.source, instruction.target)


def load_slice(instruction: Load, values: dict, resident: dict | None) -> np.ndarray:
    expected = tuple(b - a for a, b in instruction.ranges)
    if resident is not None and instruction.tensor in resident:
        piece = resident.pop(instruction.tensor)  # the store holds it from now on, and drops it after its last use
        if piece.shape != expected:  # the update's layout drifted from the parameter's
            raise RuntimeBackendError(f"{instruction.tensor}: the carried slice has shape {list(piece.shape)}, "
                                      f"the program loads {list(expected)}")
        return piece
    whole = np.asarray(values[instruction.of or instruction.tensor])
    piece = whole[tuple(slice(a, b) for a, b in instruction.ranges)]
    if instruction.via:  # a main copy starts as its 16-bit parameter's value (`instructions.Load`)
        piece = rounded(piece, instruction.via)
    return np.array(rounded(piece, instruction.dtype), order="C")  # a scalar stays 0-d


def communicate(step: Communicate, backend: Backend, piece: np.ndarray) -> np.ndarray:
    """The rank's piece after one redistribution step (`stream.communicate_steps`, blocking)."""
    return backend.drive(communicate_steps(step, backend, piece))


def graph_values(graph, inputs: dict) -> dict:
    """The whole arrays a run needs: `inputs` by graph input name, plus every parameter and
    constant of the graph (made from its initializer on first use)."""
    values = {name: np.asarray(array) for name, array in inputs.items()}
    for name, tensor in graph.values.items():
        values[name] = np.asarray(tensor.asnumpy())
    return values


def single_device_step(graph, values: dict, keep: tuple[str, ...] = ()) -> tuple[dict, dict]:
    """One pass of the graph on whole tensors, op by op, with autostrat's kernels (the fallback
    reference, `runtime.reference`): its outputs (and the tensors named in `keep`), and the
    next value of every tensor it updates (a training graph)."""
    store = dict(values)
    for op in graph.ops.values():
        outputs = run_kernel(op.op_type, [store[name] for name in op.inputs], op.attr_dict, None)
        store.update(zip(op.outputs, outputs))
    return {name: store[name] for name in graph.outputs + keep}, {name: store[value] for name, value in graph.updates}


def run_single_device(graph, values: dict) -> dict:
    """The graph's outputs computed on whole tensors (see `single_device_step`)."""
    return single_device_step(graph, values)[0]


def single_device_run(graph, values: dict, batches, on_step=None, keep: tuple[str, ...] = ()) -> tuple[tuple[dict, ...], dict]:
    """Every batch's outputs (and `keep`'s tensors) on one device, the updated tensors carried
    from step to step, and their whole values after the last step (empty for a graph that
    updates nothing); `on_step(step, outputs)` is called after each step."""
    values, outputs = dict(values), []
    for step, batch in enumerate(batches):
        step_outputs, updated = single_device_step(graph, values | batch, keep)
        values.update(updated)
        outputs.append(step_outputs)
        if on_step is not None:
            on_step(step, step_outputs)
    return tuple(outputs), {name: values[name] for name, _ in graph.updates}


__all__ = ["RankResult", "Traffic", "communicate", "execute", "graph_values", "release_schedule", "run_single_device",
           "single_device_run", "single_device_step"]
