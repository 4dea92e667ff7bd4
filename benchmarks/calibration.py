"""Calibration of the MPI backend on this machine: α, β of a ring message and kernel throughput.

`measure_rank` is what every rank of a calibration run does at once (all ranks busy, as in a
plan's step, so that ranks sharing cores share them here too):

- a ring message: `Wire.exchange` of a float32 piece to the next rank while receiving from the
  previous one (a ring step of the runtime, `runtime.wire`), each after a few kernels, for
  sizes from 4 B to 1 MiB;
- kernels: the executor (`runtime.executor.execute`) running a program of chained Compute
  instructions, so the per-instruction work of the runtime is in the time: a chain of Adds of
  one element (the fixed cost of an instruction), of 256 Ki elements (bytes read and written),
  and of 128 × 128 MatMuls (FLOP/s).

Every figure is a mean over many, after a warm-up, not a median or a minimum: a step meets the
waits for a partner that lost its core (to another rank or another job) as often as the mean
does; a median of short calls measures a core nobody else wants, which a shared machine is not.

`fit_profile` turns the means into a hardware profile (`cost.hardware.Hardware` fields) the
way the model charges them (`Hardware.compute_nanoseconds`: flops over the rate plus bytes
over the memory bandwidth, plus `kernel_latency`; `AlphaBeta.step_nanoseconds`: α per message
plus bytes over β), never reading the model's code; `kernel_passes` adds, per op type, how
much longer than one pass over its bytes its numpy kernel takes (GeLU's series for erf: hundreds).
"""

from __future__ import annotations

import statistics
import time

import numpy as np

from autostrat.runtime.executor import execute
from autostrat.runtime.instructions import Compute, Load, Program

MESSAGE_SIZES = (4, 1024, 16384, 262144, 1048576)  # bytes
ADD_ELEMENTS, MATMUL_SIZE, CHAIN = 262144, 128, 60
BETWEEN = 10  # kernels between two messages


def ring_seconds(backend, size: int, repeats: int) -> float:
    """Mean seconds of one ring exchange of `size` bytes (every rank sending to the next),
    each after a few kernels, as a plan's collectives come between its ops: the mean, not the
    median, so that the waits for a partner that lost its core (another job, another rank)
    are in it as often as a step meets them."""
    piece = np.zeros(size // 4, np.float32)
    right, left = (backend.rank + 1) % backend.device_num, (backend.rank - 1) % backend.device_num
    work, times = np.ones(4096, np.float32), []
    for _ in range(repeats + 3):
        for _ in range(BETWEEN):
            work = np.add(work, 1.0)
        started = time.perf_counter()
        backend.exchange(piece, right, left)
        times.append(time.perf_counter() - started)
    return statistics.mean(times[3:])


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
    rng = np.random.default_rng(0)
    values = {"x": rng.standard_normal(shape).astype(np.float32) * 0.01, "y": rng.standard_normal(shape).astype(np.float32) * 0.01}
    times = []
    for _ in range(repeats + 2):
        started = time.perf_counter()
        execute(program, _Alone(), values)
        times.append(time.perf_counter() - started)
    return statistics.mean(times[2:]) / CHAIN


class _Alone:
    """The backend of a program that communicates nothing (`execute` only calls `prepare`)."""

    sent: list = []

    def prepare(self, partitions) -> None:
        pass


def measure_rank(backend, repeats: int = 30) -> dict:
    """This rank's means (seconds): per message size the ring exchange, and the three chains."""
    measured = {f"ring_{size}": ring_seconds(backend, size, 10 * repeats) for size in MESSAGE_SIZES}
    measured["kernel_tiny"] = kernel_seconds(backend, "Add", (1,), 5 * repeats)
    measured["kernel_add"] = kernel_seconds(backend, "Add", (ADD_ELEMENTS,), repeats)
    measured["kernel_matmul"] = kernel_seconds(backend, "MatMul", (MATMUL_SIZE, MATMUL_SIZE), repeats)
    return measured


def kernel_passes(config_paths, repeats: int = 3) -> dict[str, float]:
    """Per op type, the passes over its bytes its numpy kernel takes (`Hardware.kernel_passes`),
    all timed in this process, so that each is a ratio of two times taken alike (whatever
    share of a core the process has): every op of each config's graph planned on one device
    (whole tensors; the calibrated plans run slices of them on 2 to 8) run by its kernel
    alone `repeats` times, less a kernel call's fixed cost (an Add of one element: the rest of
    an instruction's is `kernel_latency`) and its flops at this process's rate (a 128 × 128
    MatMul's), over its bytes (`cost.op_cost` counts both) at this process's bandwidth (an
    Add of 256 Ki elements'); the median over the op type's ops, at least 0.01 (a Reshape's
    view moves nothing)."""
    from autostrat.cost import op_cost
    from autostrat.frontend.config import load_config
    from autostrat.frontend.run import plan_config
    from autostrat.runtime.executor import graph_values
    from autostrat.runtime.job import random_batch
    from autostrat.runtime.kernels import run_kernel

    def mean_seconds(op_type: str, inputs, attrs, count: int) -> float:
        return statistics.mean(_seconds(lambda: run_kernel(op_type, inputs, attrs, None)) for _ in range(count))

    one, large, square = np.ones(1, np.float32), np.ones(ADD_ELEMENTS, np.float32), np.ones((MATMUL_SIZE,) * 2, np.float32)
    call = mean_seconds("Add", [one, one], {}, 1000)  # a kernel's own fixed cost
    bandwidth = 12 * ADD_ELEMENTS / (mean_seconds("Add", [large, large], {}, 50) - call)
    rate = 2 * MATMUL_SIZE**3 / (mean_seconds("MatMul", [square, square], {}, 50) - call - 12 * MATMUL_SIZE**2 / bandwidth)
    found: dict[str, list[float]] = {}
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
                moving = seconds - call - cost.flops_per_device / rate
                found.setdefault(op.op_type, []).append(moving * bandwidth / cost.memory_bytes_per_device)
    return {op_type: round(max(0.01, statistics.median(values)), 3) for op_type, values in sorted(found.items())}


def _seconds(run) -> float:
    started = time.perf_counter()
    run()
    return time.perf_counter() - started


def fit_profile(measured: dict) -> dict:
    """Hardware fields from a calibration's means (the slowest rank's, `measure_rank`):
    α the smallest message's time, β the least-squares slope of the larger ones' time over
    their bytes; `kernel_latency` an instruction of one element; the memory bandwidth from the
    large Add's extra time over its 12 bytes per element read and written; the float32 FLOP
    rate from the MatMul's time less its fixed and memory parts (``device_flops`` is twice it:
    the model runs float32 at half the 16-bit rate)."""
    alpha = measured["ring_4"]
    sizes = [s for s in MESSAGE_SIZES if s > 4]
    extra = [measured[f"ring_{s}"] - alpha for s in sizes]
    beta = sum(s * s for s in sizes) / sum(s * e for s, e in zip(sizes, extra))
    latency = measured["kernel_tiny"]
    memory = 12 * ADD_ELEMENTS / max(measured["kernel_add"] - latency, 1e-9)
    n = MATMUL_SIZE
    matmul = measured["kernel_matmul"] - latency - 12 * n * n / memory
    rate = 2 * n**3 / max(matmul, 1e-9)
    return {"device_flops": 2 * rate, "device_memory_bandwidth": memory, "intra_server_bandwidth": beta,
            "inter_server_bandwidth": beta, "intra_server_latency": alpha, "inter_server_latency": alpha,
            "kernel_latency": latency}
