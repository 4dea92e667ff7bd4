"""Issue #17: pipeline stages on the LLaMA-7B shape, the stage split searched.

The model of `benchmarks/quality.py` ("7b": 32 layers, hidden 4096, 32 heads, seq 2048, vocab
32000, Adam, float32) with one sequence per device (a global batch of 64 sequences on 64
devices, 1024 on 1024). Rows per device count:

- no pipeline: Megatron-LM's TP 8 inside a server x data parallelism across, seeded on every
  block and propagated (by bytes: a propagation priced in time computes timed redistribution
  searches that take minutes at 1024 devices; the table's times are the plans' predictions);
- S stages: the devices in S equal groups, each running one micro-batch of ``batch / m``
  sequences with the same Megatron seeds on its own devices (``m = 8 S`` micro-batches: one
  sequence per data-parallel replica); the stage split of the 34 units (embedding, 32 blocks,
  head and loss) searched by `search.pipeline.plan_pipeline` under the budget (1F1B).

Columns: layers per stage, the slowest stage's slot (one micro-batch's forward, backward and
sends), the predicted step time (``(m + S - 1)`` slots, plus the slowest stage's gradient
synchronisation and updates, which run once per step: `search.pipeline.Pipeline.step_time_ns`), the bubble, the largest stage peak (weights and optimiser state,
plus 1F1B's in-flight micro-batches' activations, per unit: `search.stages`; the no-pipeline row
shows its plan's exact peak), and the seconds to trace, search and split.

Run: .venv/bin/python benchmarks/pipeline.py [--devices 64 1024] [--stages 2 4 8] [--budget 80GB]
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script: the repository is not installed

from autostrat.autodiff import Adam, build_training  # noqa: E402
from autostrat.errors import InfeasibleError  # noqa: E402
from autostrat.frontend import trace  # noqa: E402
from autostrat.frontend.config import apply_seeds  # noqa: E402
from autostrat.frontend.context import parse_bytes  # noqa: E402
from autostrat.models import GPT, megatron_seeds  # noqa: E402
from autostrat.search import SearchOptions, search  # noqa: E402
from autostrat.search.pipeline import plan_pipeline  # noqa: E402
from autostrat.tables import format_table  # noqa: E402

LAYERS, TENSOR_PARALLEL = 32, 8
HEADERS = ["devices", "plan", "micro-batches", "layers per stage", "slot ms", "step ms", "bubble", "peak GB", "search s"]


def _graph(batch: int, device_num: int):
    net = GPT(layers=LAYERS, hidden=4096, heads=32, seq=2048, batch=batch, vocab=32000)
    seeds = megatron_seeds(LAYERS, TENSOR_PARALLEL, data_parallel=device_num // TENSOR_PARALLEL)
    return build_training(apply_seeds(trace(net, *net.example_inputs(), device_num=device_num), seeds, device_num), Adam(1e-3))


def no_pipeline(device_num: int) -> list[str]:
    started = time.perf_counter()
    plan = search(_graph(device_num, device_num), device_num, SearchOptions())
    seconds = time.perf_counter() - started
    return [str(device_num), "no pipeline", "1", str(LAYERS), "-", f"{plan.prediction.step_time_ns / 1e6:,.1f}", "0",
            f"{plan.prediction.peak_bytes / 1e9:,.1f}", f"{seconds:.1f}"]


def pipelined(device_num: int, stages: int, budget: int) -> list[str]:
    micro_batches = 8 * stages
    group = device_num // stages
    started = time.perf_counter()
    options = SearchOptions(max_device_memory=budget)
    try:
        plan = plan_pipeline(_graph(device_num // micro_batches, group), device_num, stages, micro_batches, options)
    except InfeasibleError as error:
        return [str(device_num), f"{stages} stages", str(micro_batches), f"no split fits: {error}", "-", "-", "-", "-", "-"]
    seconds = time.perf_counter() - started
    split, step = plan.pipeline.split, plan.pipeline.step_time_ns
    layers = "/".join(str(len([u for u in range(first, end) if 1 <= u <= LAYERS])) for first, end in split.bounds)
    return [str(device_num), f"{stages} stages", str(micro_batches), layers, f"{max(split.slot_ns) / 1e6:,.2f}",
            f"{step / 1e6:,.1f}", f"{split.bubble:.3f}", f"{max(split.peak_bytes) / 1e9:,.1f}", f"{seconds:.1f}"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, nargs="+", default=[64, 1024])
    parser.add_argument("--stages", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--budget", default="80GB", help="per-device memory budget of a stage (default 80GB)")
    args = parser.parse_args()
    budget = parse_bytes(args.budget, "--budget")
    found = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for device_num in args.devices:
            for row in [no_pipeline(device_num)] + [pipelined(device_num, s, budget) for s in args.stages]:
                found.append(row)
                print(format_table(HEADERS, [row]), flush=True)
    print()
    print(format_table(HEADERS, found))


if __name__ == "__main__":
    main()
