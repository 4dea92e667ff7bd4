"""Bytes against predicted step time: how cost_model="time" changes a GPT training step's plan.

The GPT-style model of `solver_scale.py` (hidden 1024, seq 128, batch 16, 16 heads, vocab 32768)
as an Adam training step on one 8-device server (and, with --devices 16, two), planned four ways,
each under both cost models:

- data parallel: every forward op splits its batch (parallel_mode "data_parallel");
- megatron: Megatron-LM's tensor-parallel seeds (Q, K, V, FFN1 by columns; projection and FFN2
  by rows over min(devices, 8), data parallel over the rest), propagated by BFS;
- automatic: no seeds, every op uses every device, CP-SAT decides (search_mode
  "integer_programming"), once without a memory budget and once within a quarter of the data
  parallel plan's peak (so that replicating every weight and its Adam state does not fit).

Columns: bytes sent per device per step, the predicted step time and its compute and
communication parts, the peak memory per device, the solver's status, and the search's seconds
(every memo cleared first). Under "bytes" the plan's redistributions are the fewest bytes, under
"time" the fastest; both are timed on the default hardware (8 x H100 SXM5 per server,
`autostrat.cost.hardware`).

Run: .venv/bin/python benchmarks/step_time.py [--layers 2] [--devices 8] [--time-limit 60]
(from a worktree whose checkout the venv does not install: PYTHONPATH=. first)
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace

from autostrat.autodiff import Adam, build_training
from autostrat.frontend import trace
from autostrat.frontend.config import apply_seeds
from autostrat.models import GPT, megatron_seeds
from autostrat.redistribution.memo import clear_memos
from autostrat.search import SearchOptions, search
from autostrat.search import problem_edges
from autostrat.search.prediction import format_nanoseconds
from autostrat.tables import format_table

HEADERS = ["plan", "cost model", "bytes", "step time", "compute", "communication", "peak bytes", "solver", "search s"]


def training_graph(layers: int, device_num: int, seeds: dict | None = None):
    net = GPT(layers=layers, hidden=1024, heads=16, seq=128, batch=16, vocab=32768)
    graph = trace(net, *net.example_inputs(), device_num=device_num)
    if seeds:
        graph = apply_seeds(graph, seeds, device_num)
    return build_training(graph, Adam())


def row(name: str, graph, device_num: int, options: SearchOptions) -> list[str]:
    clear_memos()
    problem_edges.edge_table.cache_clear()
    started = time.perf_counter()
    plan = search(graph, device_num, options)
    seconds = time.perf_counter() - started
    predicted = plan.prediction
    refinement = plan.refinement
    status = "-" if refinement is None else f"{refinement.result.status} gap {refinement.result.gap:.1%}"
    return [name, options.cost_model, f"{plan.total_bytes:,}", format_nanoseconds(predicted.step_time_ns),
            format_nanoseconds(predicted.compute_ns), format_nanoseconds(predicted.communication_ns),
            f"{predicted.peak_bytes:,}", status, f"{seconds:.1f}"]


def rows_for(layers: int, device_num: int, time_limit: float) -> list[list[str]]:
    model_parallel = min(device_num, 8)
    plain = training_graph(layers, device_num)
    megatron = training_graph(layers, device_num, megatron_seeds(layers, model_parallel, data_parallel=device_num // model_parallel))
    automatic = SearchOptions(search_mode="integer_programming", refine_time_limit=time_limit, coarsen="layers")
    budget = search(plain, device_num, SearchOptions(mode="data_parallel")).prediction.peak_bytes // 4
    cases = [
        ("data parallel", plain, SearchOptions(mode="data_parallel")),
        ("megatron", megatron, SearchOptions()),
        ("automatic", plain, automatic),
        (f"automatic, peak <= {budget:,}", plain, replace(automatic, max_device_memory=budget)),
    ]
    rows = []
    for name, graph, options in cases:
        for cost_model in ("bytes", "time"):
            rows.append(row(name, graph, device_num, replace(options, cost_model=cost_model)))
            print("  ".join(rows[-1]), flush=True)  # progress while the next one searches
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--devices", type=int, nargs="+", default=[8])
    parser.add_argument("--time-limit", type=float, default=60.0)
    args = parser.parse_args()
    for device_num in args.devices:
        print(f"GPT {args.layers} layers, hidden 1024, Adam training step on {device_num} devices")
        print(format_table(HEADERS, rows_for(args.layers, device_num, args.time_limit)))


if __name__ == "__main__":
    main()
