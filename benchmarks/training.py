"""Time per training step on 8 ranks against the stand-alone run, and bytes per rank per phase.

    .venv/bin/python benchmarks/training.py [--steps 10]

Three training plans: the tutorial FFN (cross-entropy loss, Momentum) with its one seed, and
the 2-layer GPT-style model with Adam, seeded as Megatron (model parallel 4, data parallel 2)
or in data_parallel mode. Each trains on the same synthetic batches stand-alone (one device,
whole tensors), on 8 LocalCluster threads and on 8 MPI ranks (mpiexec; this script is also
the rank program). A step's time is the median interval between the ends of rank 0's steps
(the first step, which pays for communicators and caches, is left out; the median shrugs off
other programs' bursts on a shared machine); the ranks meet in every step's collectives, so
rank 0 keeps the pace of the slowest. Bytes are what a rank sent per step
in each phase, the largest over the ranks; the run fails unless every rank's measured bytes
equal the plan's prediction and the losses and final parameters equal the stand-alone run's.
"""

from __future__ import annotations

import argparse
import os
import pickle
import sys
import time
from pathlib import Path

import numpy as np
from mpi_runs import mpi_run  # first: it puts the repository on sys.path

from autostrat import nn
from autostrat.frontend.api import plan_for
from autostrat.frontend.context import ParallelContext
from autostrat.frontend.train import (
    TrainOneStepCell,
    WithLossCell,
    compare,
    synthetic_batches,
)
from autostrat.io import write_atomically
from autostrat.models import FFN, GPT, megatron_seeds
from autostrat.runtime.executor import graph_values
from autostrat.runtime.instructions import PHASES
from autostrat.runtime.training import (
    reference_graph,
    train_collective,
    train_locally,
    train_single_device,
)
from autostrat.tables import format_table

DEVICE_NUM = 8
PLAN_FILE, RESULT_FILE = "training.pkl", "result.pkl"


def ffn_case():
    """The tutorial: dense1.matmul seeded ((2, 1), (1, 4)), the rest propagated."""
    net = FFN()
    cell = TrainOneStepCell(WithLossCell(net, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")),
                            nn.Momentum(net.trainable_params(), 0.1, 0.9))
    inputs = (nn.Tensor(shape=(64, 64)), nn.Tensor(shape=(64,), dtype="int32"))
    seeds = {"backbone.dense1.matmul": (((2, 1), (1, 4)), None)}
    return cell, inputs, ParallelContext(parallel_mode="auto_parallel", device_num=DEVICE_NUM), seeds


def gpt_case(mode: str):
    """The GPT sample's training (sample_code/gpt_training: the mean over replicas, see there)."""
    net = GPT(layers=2, batch=8)
    cell = TrainOneStepCell(net, nn.Adam(net.trainable_params(), 1e-3))
    if mode == "megatron":
        context = ParallelContext(parallel_mode="auto_parallel", device_num=DEVICE_NUM, gradients_mean=True)
        return cell, net.example_inputs(), context, megatron_seeds(2, 4, data_parallel=2)
    return cell, net.example_inputs(), ParallelContext(parallel_mode="data_parallel", device_num=DEVICE_NUM, gradients_mean=True), None


CASES = (("FFN", "tutorial seed", ffn_case), ("GPT 2 layers", "megatron", lambda: gpt_case("megatron")),
         ("GPT 2 layers", "data_parallel", lambda: gpt_case("data_parallel")))


class StepClock:
    """An `on_step` callback noting when each step ends; `ms_per_step` starts after the first."""

    def __init__(self):
        self.ends: list[float] = []

    def __call__(self, step: int, loss: float) -> None:
        self.ends.append(time.perf_counter())

    def ms_per_step(self) -> float:
        return float(np.median(np.diff(self.ends))) * 1e3


def timed(run, *args):
    """`run(*args, on_step)` and its milliseconds per step."""
    clock = StepClock()
    return run(*args, clock), clock.ms_per_step()


def mpi_training(plan, values, batches):
    """The MPI run of the plan (this script as the rank program) and its ms per step."""
    def prepare(folder: Path) -> None:
        write_atomically(folder / PLAN_FILE, pickle.dumps((plan, values, batches), protocol=pickle.HIGHEST_PROTOCOL))

    with mpi_run(plan.device_num, prepare, (str(Path(__file__).resolve()), "--rank", "RUN_DIR")) as folder:
        return pickle.loads((folder / RESULT_FILE).read_bytes())


def run_rank(run_dir: Path) -> None:
    """One MPI rank: train the saved plan; rank 0 saves the result and its ms per step."""
    from autostrat.runtime.mpi import MpiBackend
    from autostrat.runtime.rank import redirect_output

    backend = MpiBackend()
    redirect_output(run_dir, backend.rank)  # the launcher watches the pid this records
    plan, values, batches = pickle.loads((run_dir / PLAN_FILE).read_bytes())
    clock = StepClock()  # called on rank 0 only
    result = train_collective(plan, backend, values, batches, clock)
    if result is not None:
        write_atomically(run_dir / RESULT_FILE, pickle.dumps((result, clock.ms_per_step())))


def checked(plan, result, reference, where: str):
    report = compare(plan, result, reference)
    if not report.ok:
        raise SystemExit(f"{where}: training differs from stand-alone or from the predicted bytes\n{report.text}")
    return result


def row(model: str, mode: str, make, steps: int) -> list[str]:
    cell, inputs, context, seeds = make()
    plan = plan_for(cell, inputs, context, seeds)
    values, batches = graph_values(plan.graph, {}), synthetic_batches(plan.graph, steps)
    alone, alone_ms = timed(train_single_device, reference_graph(plan), values, batches)
    threads, threads_ms = timed(train_locally, plan, values, batches)
    mpi, mpi_ms = mpi_training(plan, values, batches)
    checked(plan, threads, alone, f"{model} {mode} on threads")
    checked(plan, mpi, alone, f"{model} {mode} on MPI")
    if threads.measured != mpi.measured:
        raise SystemExit(f"{model} {mode}: threads and MPI ranks sent different bytes")
    most = [max(rank[phase] for rank in mpi.measured) for phase in PHASES]
    return [model, mode, str(plan.device_num), str(steps), f"{alone_ms:.2f}", f"{threads_ms:.2f}", f"{mpi_ms:.2f}",
            *map(str, most)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10, help="training steps per run (at least 2)")
    parser.add_argument("--rank", metavar="RUN_DIR", help=argparse.SUPPRESS)  # the MPI ranks' entry
    args = parser.parse_args()
    if args.rank:
        return run_rank(Path(args.rank))
    if args.steps < 2:
        parser.error("--steps must be at least 2: the first step is not timed")
    headers = ["model", "mode", "ranks", "steps", "stand-alone ms", "8 threads ms", "8 MPI ranks ms",
               *(f"{phase} B" for phase in PHASES)]
    rows = [row(model, mode, make, args.steps) for model, mode, make in CASES]
    print(f"ms per training step on {os.cpu_count()} cores; bytes per rank per step, the largest over the ranks "
          f"(measured == predicted on every rank, threads and MPI)")
    print(format_table(headers, rows))


if __name__ == "__main__":
    sys.exit(main())
