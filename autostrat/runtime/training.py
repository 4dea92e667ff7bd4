"""Training steps: run a training plan's program step after step, carrying every rank's slices
of the parameters and optimiser state from one step to the next, and the same on one device.

A step reads a batch (whole arrays; each rank loads its slices) and the resident slices, runs
forward, backward, gradient synchronisation and the updates, and leaves the next values of
the parameters and state in the layouts they are loaded from. The loss is the graph's output,
assembled on every rank.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from autostrat.layout import assemble_tensor
from autostrat.runtime.backend import check_world
from autostrat.runtime.executor import execute, single_device_run
from autostrat.runtime.local import LocalCluster
from autostrat.runtime.program import kernel_attrs, lower_programs
from autostrat.runtime.instructions import PHASES
from autostrat.runtime.reference import reference_run


@dataclass(frozen=True)
class RankTraining:
    """One rank's run: the loss of every step, its final slices, per communication
    instruction the bytes it sent over all steps, and the peak of its live bytes over all steps."""

    rank: int
    losses: tuple[float, ...]
    slices: dict
    sent: tuple[int, ...]
    peak_bytes: int = 0


@dataclass(frozen=True)
class TrainingResult:
    """Losses per step, the final parameters and state (whole), per rank and phase the bytes
    per step the plan predicted and the backend counted, and the peak memory per device the plan
    predicted next to the peak each rank measured (`executor.RankResult.peak_bytes`); the
    comparisons are empty on one device."""

    losses: tuple[float, ...]
    parameters: dict
    predicted: tuple[dict, ...] = ()
    measured: tuple[dict, ...] = ()
    predicted_peak: int = 0
    measured_peaks: tuple[int, ...] = ()
    predicted_peaks: tuple[int, ...] = ()  # per rank, when ranks differ (a pipeline's stages)
    notes: tuple[str, ...] = ()  # more lines for the report (a pipeline's bubble)
    reference: str = ""  # a stand-alone reference's library (`train_reference`)
    pooled: tuple[str, ...] = ()  # its parameters compared on their kind's scale (`reference.Reference.noise_driven`)
    stage_timings: tuple[tuple[float, ...], ...] = ()  # a pipeline's, per rank: wall-clock bubble, CPU seconds of one F, B, W, CPU share, virtual-clock bubble

    @property
    def bytes_match(self) -> bool:
        return self.predicted == self.measured


def loss_value(array) -> float:
    """The loss of a step as one number (the mean, should the graph's output not be a scalar)."""
    return float(np.mean(np.asarray(array, np.float64)))


def train_rank(program, backend, values: dict, batches, on_instruction=None, on_step=None) -> RankTraining:
    """Run one training step per batch on this rank; `values` holds the initial parameters and
    state (whole) and the constants. `on_step(step, loss)` is called after each step.

    Example: see `train_locally`.
    """
    resident: dict = {}
    sums = np.zeros(len(program.communications()), np.int64)
    losses, peak = [], 0
    loss_name = program.outputs[0][0]
    for step, batch in enumerate(batches):
        result = execute(program, backend, values | batch, on_instruction, resident)
        resident = result.updated
        sums += result.sent()
        peak = max(peak, result.peak_bytes)
        losses.append(loss_value(result.outputs[loss_name]))
        if on_step is not None:
            on_step(step, losses[-1])
    return RankTraining(program.rank, tuple(losses), resident, tuple(int(s) for s in sums), peak)


def phase_bytes(program, sent: tuple[int, ...] | None = None, steps: int = 1) -> dict[str, int]:
    """Bytes per step by phase: the program's predictions, or what `sent` counted over `steps`."""
    totals = dict.fromkeys(PHASES, 0)
    for index, instruction in enumerate(program.communications()):
        totals[instruction.phase] += instruction.predicted if sent is None else sent[index] // max(steps, 1)
    return totals


def allgather_slices(backend, world: tuple[int, ...], mine: dict, slots: dict) -> list[dict]:
    """Every rank's slice of each tensor of `slots` (name -> (each rank's slice shape, None where
    a rank holds none; dtype)), on every rank of `world`, from this rank's `mine`: one AllGather
    of the slices' bytes, each tensor in the room of its largest slice, where an AllGather per
    tensor took a ring of messages each (113 of them for the GPT sample with Adam).

    Example (one rank):
        >>> from autostrat.runtime.local import LocalCluster
        >>> slots = {"w": ([(2,)], np.float32), "step": ([()], np.int64)}
        >>> mine = {"w": np.array([1.5, 2.5], np.float32), "step": np.array(3)}
        >>> LocalCluster(1).run(lambda backend: allgather_slices(backend, (0,), mine, slots))[0][0]
        {'w': array([1.5, 2.5], dtype=float32), 'step': array(3)}
    """
    rooms = {name: max((int(np.prod(shape)) * np.dtype(dtype).itemsize for shape in shapes if shape is not None), default=0)
             for name, (shapes, dtype) in slots.items()}
    starts = dict(zip(rooms, np.cumsum([0, *rooms.values()])[:-1].tolist()))
    buffer, position = np.zeros(sum(rooms.values()), np.uint8), world.index(backend.rank)
    for name, (shapes, dtype) in slots.items():
        if shapes[position] is not None:
            data = np.ascontiguousarray(mine[name], dtype).reshape(-1).view(np.uint8)
            buffer[starts[name]:starts[name] + data.size] = data
    slices: list[dict] = [{} for _ in world]
    for rank, received in enumerate(backend.allgather(buffer, world)):
        for name, (shapes, dtype) in slots.items():
            if shapes[rank] is not None:
                size = int(np.prod(shapes[rank])) * np.dtype(dtype).itemsize
                slices[rank][name] = received[starts[name]:starts[name] + size].copy().view(dtype).reshape(shapes[rank])
    return slices


def assemble_state(plan, slices_by_rank: list[dict]) -> dict:
    """The whole arrays of every updated tensor, from each rank's slices in its stored layout."""
    return {
        name: assemble_tensor([slices[name] for slices in slices_by_rank], plan.layouts[name])
        for name, _ in plan.graph.updates
    }


def train_locally(plan, values: dict, batches, on_step=None) -> TrainingResult:
    """Train `plan` (a training plan) on `batches` with every rank a `LocalCluster` thread.

    Example (the tutorial FFN with a loss, two Momentum steps on 8 ranks, against one device):
        >>> from autostrat.autodiff import Momentum
        >>> from autostrat.frontend.train import training_plan, synthetic_batches
        >>> from autostrat.models import FFN
        >>> from autostrat import set_auto_parallel_context, reset_auto_parallel_context
        >>> set_auto_parallel_context(parallel_mode="auto_parallel", device_num=8)
        >>> net = FFN(); _ = net.dense1.matmul.shard(((2, 1), (1, 4)))
        >>> plan, values, batches = training_plan(net, Momentum(0.01, 0.9), steps=2)
        >>> reset_auto_parallel_context()
        >>> run, alone = train_locally(plan, values, batches), train_single_device(reference_graph(plan), values, batches)
        >>> bool(np.allclose(run.losses, alone.losses, rtol=1e-5)), run.bytes_match
        (True, True)
    """
    if plan.pipeline is not None:
        from autostrat.runtime.pipeline import train_pipeline_locally
        return train_pipeline_locally(plan, values, batches, on_step)
    programs = lower_programs(plan)
    runs = LocalCluster(plan.device_num).run(
        lambda backend: train_rank(programs[backend.rank], backend, values, batches,
                                   on_step=on_step if backend.rank == 0 else None))
    steps = len(batches)
    return TrainingResult(
        runs[0].losses,
        assemble_state(plan, [run.slices for run in runs]),
        tuple(phase_bytes(program) for program in programs),
        tuple(phase_bytes(program, run.sent, steps) for program, run in zip(programs, runs)),
        plan.prediction.peak_bytes,
        tuple(run.peak_bytes for run in runs),
    )


def reference_graph(plan):
    """The graph the stand-alone run of `plan` runs, to compute what the ranks compute: the
    plan's own graph, or a pipeline's whole batch's (a pipeline plan's graph is one
    micro-batch's); with ``gradients_mean=False`` every update sums as many copies of its
    gradient as the plan has replicas of its parameter (`program.kernel_attrs`: the kernels the
    ranks run, with the same counts), as MindSpore sums a parameter's replicas' gradients.

    Example (the tutorial seed splits dense1.weight 4 ways: 2 of the 8 devices hold each slice):
        >>> from autostrat.autodiff import SGD
        >>> from autostrat.models import tutorial_plan
        >>> plan = tutorial_plan(optimizer=SGD(), gradients_mean=False)
        >>> reference_graph(plan).ops["optimizer/dense1.weight"].attrs
        (('gradients_mean', False), ('learning_rate', 0.01), ('replicas', 2))
    """
    graph = plan.graph if plan.pipeline is None else plan.pipeline.batch_graph
    ops = {name: replace(op, attrs=kernel_attrs(plan, op)) for name, op in graph.ops.items()}
    return graph if ops == graph.ops else replace(graph, ops=ops)


def train_single_device(graph, values: dict, batches, on_step=None) -> TrainingResult:
    """The same training graph step by step on one device with autostrat's own kernels (what
    a distributed run must equal bit for bit where it computes alike: recomputation, the
    fallback reference); `on_step(step, loss)` is called after each step."""
    loss = graph.outputs[0]
    report = None if on_step is None else lambda step, outputs: on_step(step, loss_value(outputs[loss]))
    outputs, final = single_device_run(graph, values, batches, report)
    return TrainingResult(tuple(loss_value(step[loss]) for step in outputs), final)


def train_reference(graph, values: dict, batches) -> TrainingResult:
    """The stand-alone reference of a training run, by JAX where installed
    (`reference.reference_run`), naming its library.

    Example (two SGD steps of the tutorial FFN):
        >>> from autostrat.autodiff import SGD
        >>> from autostrat.frontend.train import synthetic_batches
        >>> from autostrat.models import tutorial_plan
        >>> from autostrat.runtime.executor import graph_values
        >>> graph = reference_graph(tutorial_plan(optimizer=SGD()))
        >>> reference = train_reference(graph, graph_values(graph, {}), synthetic_batches(graph, 2))
        >>> len(reference.losses), reference.reference
        (2, 'JAX 0.10.2 on CPU')
    """
    reference = reference_run(graph, values, batches)
    losses = tuple(loss_value(step[graph.outputs[0]]) for step in reference.outputs)
    return TrainingResult(losses, reference.final, reference=reference.library, pooled=reference.noise_driven)


def train_collective(plan, backend, values: dict, batches, on_step=None, every_rank: bool = False) -> TrainingResult | None:
    """Train on this rank of any backend (MPI: one process per rank), then assemble the final
    parameters on every rank and gather the bytes per phase and the peak memory to rank 0,
    which gets the result (the other ranks None, or with `every_rank` their losses and final
    parameters without the bytes). The assembling is outside the counted program traffic."""
    if plan.pipeline is not None:
        from autostrat.runtime.pipeline import train_pipeline_collective
        return train_pipeline_collective(plan, backend, values, batches, on_step, every_rank)
    check_world(plan.device_num, backend)
    programs = lower_programs(plan)
    program = programs[backend.rank]
    run = train_rank(program, backend, values, batches, on_step=on_step if backend.rank == 0 else None)
    world = tuple(range(backend.device_num))
    backend.prepare(((world,),))
    slots = {name: ([np.shape(run.slices[name])] * len(world), np.asarray(run.slices[name]).dtype) for name, _ in plan.graph.updates}
    slices_by_rank = allgather_slices(backend, world, run.slices, slots)
    measured = phase_bytes(program, run.sent, len(batches))
    gathered = backend.gather_report(np.array([measured[phase] for phase in PHASES] + [run.peak_bytes], np.float64))
    if gathered is None:
        return TrainingResult(run.losses, assemble_state(plan, slices_by_rank)) if every_rank else None
    return TrainingResult(
        run.losses,
        assemble_state(plan, slices_by_rank),
        tuple(phase_bytes(p) for p in programs),
        tuple({phase: int(v) for phase, v in zip(PHASES, vector)} for vector in gathered),
        plan.prediction.peak_bytes,
        tuple(int(vector[len(PHASES)]) for vector in gathered),
    )
