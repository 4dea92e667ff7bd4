"""Issue #15: how good the training plans are, against Megatron-LM's and data parallelism.

Models (training steps with Adam, float32):

- stack-8/32/96: `autostrat.models.TransformerStack` (B=16, S=128, H=1024, 16 heads, FFN 4H) of
  8, 32 and 96 blocks on 8 devices;
- 7b: LLaMA-7B-shaped `GPT` (32 layers, hidden 4096, 32 heads, seq 2048, vocab 32000, one
  sequence per device) on 64 devices.

Rows per model:

- megatron: Megatron-LM's tensor parallelism inside a server (TP 8) x data parallelism across
  servers, seeded on every block and propagated;
- data parallel: parallel_mode data_parallel (every batch dim split, weights replicated);
- bfs: the same Megatron seeds on block 0 only, propagated (search_mode sharding_propagation);
- refined: that BFS plan refined by CP-SAT for the predicted step time (cost_model "time",
  ``--coarsen layers``) under a per-device memory
  budget equal to the Megatron plan's peak.

Columns: bytes per device per phase (forward, backward, gradient sync), total, peak memory per
device (parameters, optimiser state and live activations: `search.memory`), predicted step
time, search seconds (tracing excluded), the refinement's status. Targets: refined predicted
time <= every baseline's; bfs predicted time <= 1.1 x megatron's.

Run: .venv/bin/python benchmarks/quality.py [--models stack-8 stack-32 stack-96 7b] [--time-limit 60]
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script: the repository is not installed

from autostrat.autodiff import Adam, build_training  # noqa: E402
from autostrat.errors import AutostratError  # noqa: E402
from autostrat.frontend import trace  # noqa: E402
from autostrat.frontend.config import apply_seeds  # noqa: E402
from autostrat.models import GPT, TransformerStack, megatron_seeds  # noqa: E402
from autostrat.search import SearchOptions, search  # noqa: E402
from autostrat.tables import format_table  # noqa: E402

MODELS = {
    "stack-8": (8, lambda: TransformerStack(layers=8, hidden=1024, heads=16, seq=128, batch=16)),
    "stack-32": (8, lambda: TransformerStack(layers=32, hidden=1024, heads=16, seq=128, batch=16)),
    "stack-96": (8, lambda: TransformerStack(layers=96, hidden=1024, heads=16, seq=128, batch=16)),
    "7b": (64, lambda: GPT(layers=32, hidden=4096, heads=32, seq=2048, batch=64, vocab=32000)),
}
TENSOR_PARALLEL = 8  # Megatron-LM's TP inside one 8-device server
HEADERS = ["model", "devices", "plan", "forward MB", "backward MB", "sync MB", "total MB", "peak MB",
           "step ms", "search s", "status"]


def training_graph(net, device_num: int, seeds: dict | None, recompute: tuple[str, ...] = ()):
    graph = trace(net, *net.example_inputs(), device_num=device_num)
    if seeds:
        graph = apply_seeds(graph, seeds, device_num)
    return build_training(graph, Adam(1e-3), recompute=recompute)


def timed_search(graph, device_num: int, options: SearchOptions):
    started = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # unreached ops' warnings: the table says what matters
        plan = search(graph, device_num, options)
    return plan, time.perf_counter() - started


def row(model: str, device_num: int, name: str, plan, seconds: float) -> list[str]:
    phases, prediction = plan.phase_bytes(), plan.prediction
    status = plan.refinement.result.status if plan.refinement else "-"
    return [model, str(device_num), name, *(f"{phases[p] / 1e6:,.1f}" for p in ("forward", "backward", "sync")),
            f"{plan.total_bytes / 1e6:,.1f}", f"{prediction.peak_bytes / 1e6:,.1f}",
            f"{prediction.step_time_ns / 1e6:,.3f}", f"{seconds:.2f}", status]


def model_rows(model: str, time_limit: float) -> tuple[list[list[str]], list[str]]:
    """The four plans of one model, and the targets they meet or miss."""
    device_num, build = MODELS[model]
    layers = len(build().blocks)
    data = device_num // TENSOR_PARALLEL
    megatron_graph = training_graph(build(), device_num, megatron_seeds(layers, TENSOR_PARALLEL, data_parallel=data))
    first_block = training_graph(build(), device_num, megatron_seeds(layers, TENSOR_PARALLEL, True, data_parallel=data))
    plans = {}
    plans["megatron"] = timed_search(megatron_graph, device_num, SearchOptions())
    plans["data parallel"] = timed_search(training_graph(build(), device_num, None), device_num,
                                          SearchOptions(mode="data_parallel"))
    plans["bfs"] = timed_search(first_block, device_num, SearchOptions())
    budget = plans["megatron"][0].prediction.peak_bytes
    refined = SearchOptions(refine="cpsat", coarsen="layers", max_device_memory=budget, refine_time_limit=time_limit,
                            cost_model="time")
    try:
        plans["refined"] = timed_search(first_block, device_num, refined)
    except AutostratError as error:
        print(f"{model}: refined: {error}", file=sys.stderr)
    rows = [row(model, device_num, name, plan, seconds) for name, (plan, seconds) in plans.items()]
    return rows, targets(model, {name: plan for name, (plan, _) in plans.items()})


def targets(model: str, plans: dict) -> list[str]:
    time_of = {name: plan.prediction.step_time_ns for name, plan in plans.items()}
    found = []
    ratio = time_of["bfs"] / time_of["megatron"]
    found.append(f"{model}: bfs / megatron predicted time = {ratio:.3f} ({'met' if ratio <= 1.1 else 'missed'}: <= 1.1)")
    if "refined" not in time_of:
        return found + [f"{model}: refined: no plan (missed)"]
    worst = [name for name in ("megatron", "data parallel", "bfs") if time_of["refined"] > time_of[name]]
    found.append(f"{model}: refined predicted time {'<=' if not worst else '>'} every baseline's "
                 f"({'met' if not worst else 'missed: slower than ' + ', '.join(worst)})")
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--time-limit", type=float, default=60.0, help="CP-SAT seconds for the refined plan")
    args = parser.parse_args()
    rows, notes = [], []
    for model in args.models:
        found, met = model_rows(model, args.time_limit)
        rows += found
        notes += met
        print(format_table(HEADERS, found), flush=True)
    print()
    print(format_table(HEADERS, rows))
    print("\n".join(notes))


if __name__ == "__main__":
    main()
