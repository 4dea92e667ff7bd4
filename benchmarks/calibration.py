"""Calibration of the MPI backend on this machine: its collectives, kernels and host costs.

`measure_rank` is what every rank of a calibration run does at once (all ranks busy, as in a
plan's step, so that ranks sharing cores share them here too), each figure timed through the
executor (`runtime.executor.execute`) as a plan's instructions run:

- kernels: chains of Compute instructions, an Add of one element, of 256 Ki elements (bytes
  read and written) and 128 x 128 MatMuls (FLOP/s; orthogonal factors, so that no value turns
  subnormal along the chain);
- the executor's own time per instruction in a training step of realistic size (gpt_train
  on one device, its kernels' time taken out: `instruction_overhead`);
- collectives: chains of AllReduce and AllToAll instructions (ring) of one, 4 Ki and 64 Ki
  elements per member, their messages and bytes as the wire counts them; and an AllReduce of
  one element after a MatMul of about a millisecond, against the MatMul alone (where ranks
  share cores, each reaches the collective at its turn on a core).

Every figure is a mean over many, after a warm-up, not a median or a minimum: a step meets the
waits for a partner that lost its core (to another rank or another job) as often as the mean
does; a median of short calls measures a core nobody else wants, which a shared machine is not.

`fit_profile` turns the means into a hardware profile (`cost.hardware.Hardware` fields) the
way the model charges them (`Hardware.compute_nanoseconds`: flops over the rate plus bytes
over the memory bandwidth, plus `kernel_latency`; `AlphaBeta.step_nanoseconds`:
`collective_latency` plus α per message plus bytes over β), never reading the model's code;
`crowded_row` does so for a run with more ranks than cores; `kernel_passes` adds, per op
type, how much longer than one pass over its bytes its numpy kernel takes (GeLU's series for
erf: hundreds).
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import numpy as np

from autostrat.runtime.executor import execute
from autostrat.runtime.instructions import Communicate, Compute, Load, Program

COLLECTIVE_ELEMENTS = (1, 4096, 65536)  # float32 elements per member of a collective's piece
COLLECTIVES = ("AllReduce", "AllToAll")  # 2 (g - 1) ring messages and g - 1: α apart from the fixed cost
ADD_ELEMENTS, MATMUL_SIZE, CHAIN = 262144, 128, 60
OVERHEAD_CONFIG = Path(__file__).resolve().parent.parent / "configs" / "gpt_train.yaml"  # `instruction_overhead`'s program
FEWEST_PASSES = 0.01  # `kernel_passes`: a Reshape's view moves nothing
WAIT_ROWS, WAIT_KERNEL, LONG_WAIT_KERNEL = 256, 512, 1024  # MatMuls of ~1 and ~8 ms on a core of its own  # a MatMul of [256, 512] x [512, 512] before each collective: ~1 ms on one core


def collective_program(kind: str, rank: int, device_num: int, elements: int, length: int, kernel: int = 0) -> Program:
    """A program of `length` chained collective instructions over every rank (``a_i =
    kind(a_{i-1})``, each of the shape it reads: an AllReduce, or an AllToAll of dim 0 onto
    itself), on a piece of `elements` per member, as the lowering writes them
    (`instructions.Communicate`, ring algorithm); with `kernel`, each after a MatMul of
    ``[WAIT_ROWS, kernel] x [kernel, kernel]`` (kind "": the MatMuls alone)."""
    group = tuple(range(device_num))
    instructions, previous = [Load("x", ((0, elements * device_num),)), Load("w", ((0, WAIT_ROWS), (0, kernel))),
                              Load("v", ((0, kernel), (0, kernel)))], "x"
    for index in range(length):
        if kernel:
            instructions.append(Compute(f"k{index}", "MatMul", ("w", "v"), (f"k{index}",), (), None))
        if kind:
            instructions.append(Communicate(kind, previous, f"a{index}", group, (0, 0), group, "sum", (rank, rank), 0, f"e{index}"))
            previous = f"a{index}"
    return Program(rank, device_num, (), tuple(instructions), ("x", "w", "v"), ((previous, previous),))


def collective_seconds(backend, kind: str, elements: int, repeats: int, kernel: int = 0, length: int = CHAIN) -> tuple[float, float, float]:
    """(mean seconds, ring messages, bytes) per collective of a chain of `kind` (with
    `kernel`: per MatMul and collective) run by the executor on every rank at once, each chain
    after a barrier; messages and bytes as the wire counts them (every `transfer` it makes),
    never as the model counts them."""
    program = collective_program(kind, backend.rank, backend.device_num, elements, length, kernel)
    rng = np.random.default_rng(0)
    values = {"x": np.full(elements * backend.device_num, 1e-3, np.float32), "w": np.ones((WAIT_ROWS, kernel), np.float32),
              "v": np.linalg.qr(rng.standard_normal((kernel, kernel)))[0].astype(np.float32) if kernel else np.ones((0, 0), np.float32)}
    sent, transfer = [], backend.transfer

    def counted(piece, dest, source, shape):
        if dest != backend.rank:
            sent.append(piece.nbytes)
        return transfer(piece, dest, source, shape)

    backend.transfer = counted
    times = []
    for _ in range(repeats + 2):
        backend.barrier()
        started = time.perf_counter()
        execute(program, backend, values)
        times.append(time.perf_counter() - started)
    del backend.transfer  # the method again
    runs = length * (repeats + 2)
    return statistics.mean(times[2:]) / length, len(sent) / runs, sum(sent) / runs


def chain_program(op_type: str, shape: tuple[int, ...], length: int) -> Program:
    """A one-rank program: load x and y, then ``a_i = op(a_{i-1}, y)`` `length` times, every
    result kept (an output), as a training step keeps its activations for the backward: the
    executor's work per instruction grows with what it holds."""
    instructions = [Load("x", tuple((0, n) for n in shape)), Load("y", tuple((0, n) for n in shape))]
    previous = "x"
    for index in range(length):
        instructions.append(Compute(f"op{index}", op_type, (previous, "y"), (f"a{index}",), (), None))
        previous = f"a{index}"
    kept = tuple((f"a{index}", f"a{index}") for index in range(length))
    return Program(0, 1, (), tuple(instructions), ("x", "y"), kept)


def kernel_seconds(backend, op_type: str, shape: tuple[int, ...], repeats: int) -> float:
    """Mean seconds per Compute instruction of a chain of `op_type` on `shape` arrays."""
    program = chain_program(op_type, shape, CHAIN)
    values = chain_values(op_type, shape)
    times = []
    for _ in range(repeats + 2):
        started = time.perf_counter()
        execute(program, _Alone(), values)
        times.append(time.perf_counter() - started)
    return statistics.mean(times[2:]) / CHAIN


def chain_values(op_type: str, shape: tuple[int, ...]) -> dict:
    """x and y of a chain whose values stay normal floats all along it: a MatMul's y is
    orthogonal (each product keeps the norm), an Add's small. Subnormal floats, where the
    values shrink along the chain (y of 0.01-scaled normals: 0.01^60 after 60 products),
    take the FPU tens of times longer (128 x 128 MatMuls 965 us per instruction, the rate of
    a real run's 20 times lower)."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal(shape).astype(np.float32)
    if op_type == "MatMul":
        return {"x": x, "y": np.linalg.qr(rng.standard_normal(shape))[0].astype(np.float32)}
    return {"x": x, "y": np.full(shape, 1e-3, np.float32)}


class _Alone:
    """The backend of a program that communicates nothing (`execute` only calls `prepare`)."""

    sent: list = []

    def prepare(self, partitions) -> None:
        pass


def measure_rank(backend, repeats: int = 30) -> dict:
    """This rank's means (seconds) of the three kernel chains and of each collective chain at
    each size, with the collectives' messages and bytes per instruction; and of the wait
    chains. The collectives run back to back: where ranks share cores, what a collective
    waits after compute is `collective_wait`'s, measured apart (each collective after a small
    MatMul instead, its time taken out, charged that wait twice: gpt_train's 4-rank steps
    predicted 25-54 % above their measure, against -2..+9 % so)."""
    measured = {"kernel_tiny": kernel_seconds(backend, "Add", (1,), 5 * repeats),
                "kernel_add": kernel_seconds(backend, "Add", (ADD_ELEMENTS,), repeats),
                "kernel_matmul": kernel_seconds(backend, "MatMul", (MATMUL_SIZE, MATMUL_SIZE), repeats)}
    for kind in COLLECTIVES:
        for elements in COLLECTIVE_ELEMENTS:
            seconds, messages, sent = collective_seconds(backend, kind, elements, max(3, repeats // 3))
            measured |= {f"{kind}_{elements}": seconds, f"{kind}_{elements} messages": messages, f"{kind}_{elements} bytes": sent}
    measured["instruction_overhead"] = instruction_overhead(OVERHEAD_CONFIG)
    measured["kernel_call"] = kernel_call_seconds()
    for key, kernel, length in (("wait", WAIT_KERNEL, CHAIN), ("long_wait", LONG_WAIT_KERNEL, CHAIN // 6)):
        measured[f"{key}_kernel"] = collective_seconds(backend, "", 1, max(3, repeats // 3), kernel, length)[0]
        measured[f"{key}_pair"] = collective_seconds(backend, "AllReduce", 1, max(3, repeats // 3), kernel, length)[0]
    return measured


def instruction_overhead(config_path, repeats: int = 3) -> float:
    """Mean seconds per instruction that the executor spends beside its kernels in a program of
    realistic size (`config_path` planned on one device: a training step's loads and a few
    hundred kernels, its activations held for the backward): the program's run by
    `runtime.executor.execute` less the time inside its kernels (each `run_kernel` call
    timed), over its instructions. A chain of Adds of one element holds a few arrays and
    names a few keys: about 9 us per instruction where a training step's took 12-20."""
    from autostrat.frontend.config import load_config
    from autostrat.frontend.run import plan_config
    from autostrat.runtime import executor as runtime_executor
    from autostrat.runtime.job import random_batch
    from autostrat.runtime.program import lower_programs

    plan, _ = plan_config(load_config(config_path, device_num=1), 1)
    program = lower_programs(plan)[0]
    values = runtime_executor.graph_values(plan.graph, random_batch(plan.graph, np.random.default_rng(0)))
    inner, in_kernels = runtime_executor.run_kernel, []

    def timed(*args):
        started = time.perf_counter()
        result = inner(*args)
        in_kernels.append(time.perf_counter() - started)
        return result

    runtime_executor.run_kernel = timed
    try:
        runs = []
        for _ in range(repeats + 1):
            in_kernels.clear()
            started = time.perf_counter()
            execute(program, _Alone(), values)
            runs.append((time.perf_counter() - started - sum(in_kernels)) / len(program.instructions))
    finally:
        runtime_executor.run_kernel = inner
    return statistics.mean(runs[1:])


def kernel_call_seconds(count: int = 1000) -> float:
    """Mean seconds of a kernel call on one element (an Add): its own fixed cost."""
    from autostrat.runtime.kernels import run_kernel

    one = np.ones(1, np.float32)
    return statistics.mean(_seconds(lambda: run_kernel("Add", [one, one], {}, None)) for _ in range(count))


def kernel_passes(config_paths, profile: dict, repeats: int = 3) -> tuple[dict[str, float], dict[str, float]]:
    """Per op type, the passes over its bytes its numpy kernel takes (`Hardware.kernel_passes`)
    on the calibrated `profile` (`fit_profile`'s fields), and for an op type whose kernel
    outruns the profile's FLOP rate, how many times that rate it runs at (`kernel_rates`):
    every op of each config's graph planned on one device (whole tensors; the calibrated plans
    run slices of them on 2 to 8) run by its kernel alone `repeats` times, less a kernel
    call's fixed cost (an Add of one element, timed here: the rest of an instruction's is
    `kernel_latency`) and its flops at the profile's float32 rate, over its bytes
    (`cost.op_cost` counts both) at the profile's memory bandwidth; the median over the op
    type's ops. The profile's rates, not this process's own: the model charges the passes at
    them (an Add alone in its process moved 35-45 GB/s, a busy rank's executor 13: passes
    taken at the first charged GeLU twice its time). Where the median is below `FEWEST_PASSES`
    (the flops alone at the rate take longer than the kernel: Conv2D's one large product),
    the op type moves its bytes `FEWEST_PASSES` times and its rate is the median of its ops'
    flops over the time left (1 for every other op type)."""
    from autostrat.cost import op_cost
    from autostrat.frontend.config import load_config
    from autostrat.frontend.run import plan_config
    from autostrat.runtime.executor import graph_values
    from autostrat.runtime.job import random_batch
    from autostrat.runtime.kernels import run_kernel

    def mean_seconds(op_type: str, inputs, attrs, count: int) -> float:
        return statistics.mean(_seconds(lambda: run_kernel(op_type, inputs, attrs, None)) for _ in range(count))

    call = kernel_call_seconds()
    bandwidth, rate = profile["device_memory_bandwidth"], profile["device_flops"] / 2  # float32: half the rate
    found: dict[str, list[tuple[float, int, int]]] = {}
    for path in config_paths:
        plan, _ = plan_config(load_config(path, device_num=1), 1)
        graph = plan.graph
        store = graph_values(graph, random_batch(graph, np.random.default_rng(0)))
        for name, op in graph.ops.items():
            inputs = [store[tensor] for tensor in op.inputs]
            seconds = mean_seconds(op.op_type, inputs, op.attr_dict, repeats)
            store.update(zip(op.outputs, run_kernel(op.op_type, inputs, op.attr_dict, None)))
            cost = op_cost(plan.ops[name].strategy, tuple(map(plan.sizes.priced, op.inputs + op.outputs)))
            if cost.memory_bytes_per_device:
                found.setdefault(op.op_type, []).append((seconds - call, cost.flops_per_device, cost.memory_bytes_per_device))
    passes, rates = {}, {}
    for op_type, samples in sorted(found.items()):
        passes[op_type] = statistics.median((t - f / rate) * bandwidth / b for t, f, b in samples)
        rates[op_type] = 1.0  # every op type's, so that every rank reports the same figures
        if passes[op_type] < FEWEST_PASSES:
            passes[op_type] = FEWEST_PASSES
            computing = [f / rate / max(t - FEWEST_PASSES * b / bandwidth, 1e-9) for t, f, b in samples if f]
            rates[op_type] = max(1.0, statistics.median(computing)) if computing else 1.0
    return passes, rates


def _seconds(run) -> float:
    started = time.perf_counter()
    run()
    return time.perf_counter() - started


def fit_profile(measured: dict) -> dict:
    """Hardware fields from a calibration's means (the slowest rank's, `measure_rank`):
    `kernel_latency` the executor's time per instruction of a training step beside its
    kernels plus a kernel call's fixed cost (`instruction_overhead`, `kernel_call_seconds`);
    the memory bandwidth from the large Add's extra time (beyond a chained Add of one element)
    over its 12 bytes per element read and written; the float32 FLOP rate from the
    MatMul's time less its fixed and memory parts (``device_flops`` is twice it: the model runs
    float32 at half the 16-bit rate); of the collectives of one element, which send few bytes,
    α the time per ring message (their difference over their messages' difference) and
    `collective_latency` the rest; β the least-squares slope of the larger ones' time beyond
    those over their bytes; `collective_wait` what an AllReduce of one element takes after a
    MatMul of about a millisecond beyond what it takes alone, over the MatMul's time (ranks
    sharing cores reach it at their turns, not at once), and `collective_wait_most` what it
    waits after a MatMul of about 8 ms (a rank waits its turn, not the whole of a long
    segment's compute: ranks that compute long share the cores and end together). The way the model charges them (`Hardware.compute_nanoseconds`:
    flops over the rate plus bytes over the bandwidth plus `kernel_latency`;
    `AlphaBeta.step_nanoseconds`: `collective_latency` plus α per message plus bytes over β),
    never reading the model's code."""
    latency = measured["kernel_tiny"]
    memory = 12 * ADD_ELEMENTS / max(measured["kernel_add"] - latency, 1e-9)
    n = MATMUL_SIZE
    matmul = measured["kernel_matmul"] - latency - 12 * n * n / memory
    rate = 2 * n**3 / max(matmul, 1e-9)
    (many, t_many), (few, t_few) = [(measured[f"{kind}_1 messages"], measured[f"{kind}_1"]) for kind in COLLECTIVES]
    alpha = max(0.0, (t_many - t_few) / (many - few))
    fixed = max(0.0, t_few - few * alpha)
    samples = [(measured[f"{kind}_{e} bytes"], measured[f"{kind}_{e}"] - fixed - measured[f"{kind}_{e} messages"] * alpha)
               for kind in COLLECTIVES for e in COLLECTIVE_ELEMENTS if e > 1]
    beta = sum(b * b for b, _ in samples) / max(sum(b * extra for b, extra in samples), 1e-12)
    wait = max(0.0, (measured["wait_pair"] - measured["wait_kernel"] - measured["AllReduce_1"]) / measured["wait_kernel"])
    most = max(0.0, measured["long_wait_pair"] - measured["long_wait_kernel"] - measured["AllReduce_1"])
    return {"device_flops": 2 * rate, "device_memory_bandwidth": memory, "intra_server_bandwidth": beta,
            "inter_server_bandwidth": beta, "intra_server_latency": alpha, "inter_server_latency": alpha,
            "kernel_latency": measured["instruction_overhead"] + measured["kernel_call"], "collective_latency": fixed,
            "collective_wait": wait, "collective_wait_most": most}


def crowded_row(alone: dict, crowded: dict, crowding: int) -> tuple[float, ...]:
    """A `Hardware.crowded` row from two calibrations' means, one rank per core (`alone`) and
    `crowding` ranks per core: (crowding, the crowded collectives' α and β as `fit_profile`
    fits them, the median over the three kernel chains of how many times longer each took (one
    chain's ratio moves with what the run alone measured: the large Add's bandwidth between
    13 and 16 GB/s from run to run, which made the mean 2.07 in one calibration and 2.61 in
    the next), the
    crowded collectives' fixed latency, wait and longest wait)."""
    fitted = fit_profile(crowded)
    chains = ("kernel_tiny", "kernel_add", "kernel_matmul")
    slowdown = statistics.median(crowded[key] / alone[key] for key in chains)
    return (float(crowding), fitted["intra_server_latency"], fitted["intra_server_bandwidth"], slowdown,
            fitted["collective_latency"], fitted["collective_wait"], fitted["collective_wait_most"])
