"""Parallel pricing: the refined 7B row's cost tables priced by 1 and by N processes, cold.

The problem is `benchmarks/quality.py`'s 7b row as its refinement for predicted time sees it (64
devices, Megatron's seed on the first block, the α–β model of the default hardware). Every
missing entry of its cost tables (`redistribution.parallel.missing_pairs`) is priced from cold
memos: in this process (the collector paused, as `search` runs it), and by
`price_in_parallel` on each process count asked; every price must equal this process's. Each
count runs ``--repeat`` times in turn with the others, so a load that comes and goes falls on
all; the table prints the median and its ratio to one process.

Run: .venv/bin/python benchmarks/parallel_pricing.py [--processes 2] [--repeat 3]

Recorded (issue #32, 2 shared cores, medians): 5 232 entries; before (4 pairs a task in the
tables' order, the collector on in the processes, this process idle): 2 processes 53.9 s, this
one alone 50.6 s (collector on). By search class, collector paused, 2 spawned processes and this
one idle: 27.4 s against 47.7 s (1.74x). As shipped, this process and 1 spawned: 34.1 s against
49.7 s (1.46x, runs 29.4-34.8 / 47.3-52.9 s); it gains more inside a search, whose memos are warm.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from quality import MODELS, TENSOR_PARALLEL, training_graph  # noqa: E402  (this folder is on sys.path)

from autostrat.models import megatron_seeds  # noqa: E402
from autostrat.redistribution import table  # noqa: E402
from autostrat.redistribution.memo import clear_memos  # noqa: E402
from autostrat.redistribution.parallel import missing_pairs, price_in_parallel  # noqa: E402
from autostrat.search import SearchOptions  # noqa: E402
from autostrat.search.problem import build_problem  # noqa: E402
from autostrat.tables import format_table  # noqa: E402


def quality_pairs() -> list[tuple]:
    """The missing entries of the 7b row's cost tables under the time model, in the tables' order."""
    device_num, build = MODELS["7b"]
    layers = len(build().blocks)
    seeds = megatron_seeds(layers, TENSOR_PARALLEL, True, data_parallel=device_num // TENSOR_PARALLEL)
    options = SearchOptions(cost_model="time")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        graph = training_graph(build(), device_num, seeds)
        problem = build_problem(graph, device_num, options.repeated, mesh=options.mesh, hardware=options.hardware,
                                optimizer_shard=options.optimizer_shard, precision=options.precision)
    return missing_pairs(edge.table for edge in problem.edges)


def priced_here(pairs: list[tuple]) -> tuple[list[float], float]:
    """Every price of `pairs` computed in this process from cold memos, and the seconds it took."""
    clear_memos()
    began = time.perf_counter()
    with table.collector_paused():
        prices = [table.entry_price(*pair) for pair in pairs]
    return prices, time.perf_counter() - began


def priced_by(pairs: list[tuple], processes: int) -> tuple[list[float], float]:
    """The prices `price_in_parallel` writes into the memo for `pairs` on `processes` processes,
    and the seconds it took (the processes' start included)."""
    clear_memos()
    began = time.perf_counter()
    priced = price_in_parallel(pairs, processes)
    seconds = time.perf_counter() - began
    if priced != len(pairs):
        raise SystemExit(f"{processes} processes priced {priced} of {len(pairs)} pairs")
    # Every pair is memoised now (all were priced): a one-entry table reads its price back.
    return [float(table.cost_table([src], [dst], dtype, model)[0, 0]) for src, dst, dtype, model in pairs], seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, nargs="+", default=[2], help="process counts (default 2)")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each count (default 3)")
    args = parser.parse_args()
    pairs = quality_pairs()
    seconds: dict[int, list[float]] = {1: []}
    for count in args.processes:
        seconds[count] = []
    for _ in range(args.repeat):
        expected, took = priced_here(pairs)
        seconds[1].append(took)
        for count in args.processes:
            prices, took = priced_by(pairs, count)
            if prices != expected:
                wrong = sum(a != b for a, b in zip(prices, expected))
                raise SystemExit(f"{count} processes priced {wrong} of {len(pairs)} pairs differently from this one")
            seconds[count].append(took)
    one = statistics.median(seconds[1])
    rows = [[str(count), f"{statistics.median(runs):.1f}", " ".join(f"{run:.1f}" for run in runs),
             f"{one / statistics.median(runs):.2f}"] for count, runs in seconds.items()]
    print(f"{len(pairs):,} entries of the 7b row's cost tables (64 devices, time model), priced cold; every price "
          f"equal to this process's")
    print(format_table(["processes", "median s", "runs s", "speed-up"], rows))


if __name__ == "__main__":
    main()
