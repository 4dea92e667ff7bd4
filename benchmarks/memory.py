"""Issue #16: memory as decisions — optimizer sharding on the LLaMA-7B shape.

The model of `benchmarks/quality.py` ("7b": 32 layers, hidden 4096, 32 heads, seq 2048, Adam,
float32 master weights) on 64 devices, with a per-device budget (default 80 GB). Rows:

- megatron: tensor parallelism inside a server (TP 8) x data parallelism across servers,
  seeded on every block and propagated;
- megatron + ZeRO-1: the same with ``enable_parallel_optimizer`` (optimiser state and updates
  split over the 8 data-parallel replicas of every weight slice);
- megatron + recompute: every block recomputed in the backward (`Cell.recompute`), with and
  without ZeRO-1;
- refined: Megatron's seeds on block 0 only, propagated, then refined by CP-SAT for the predicted
  step time under the budget (``--coarsen layers``), without and with optimizer sharding;
- refined + ZeRO-1, recompute searched: the same with how many blocks to recompute chosen by
  the search (`recompute_choice.choose_recompute`, as ``auto_recompute`` does), the counts it
  tried printed under the table;
- refined, ZeRO-3 and recompute searched: ``optimizer_level: level3``, so that CP-SAT also
  decides per parameter whether it rests sharded (gathered per use, phase "gather").

Columns: bytes per device per phase (forward, backward, gradient sync, update = the parameters'
gathers after a sharded update, gather = ZeRO-3's gathers per use), peak memory per device (the
buffers a rank holds, redistributed copies included: what a run measures), predicted step time,
search seconds,
whether the plan fits the budget ("no plan": the refinement found none that fits).

Run: .venv/bin/python benchmarks/memory.py [--budget 80GB] [--time-limit 60] [--plans NAME ...]
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script: the repository is not installed
sys.path.insert(0, str(Path(__file__).resolve().parent))

from quality import MODELS, TENSOR_PARALLEL, timed_search, training_graph  # noqa: E402

from autostrat.errors import InfeasibleError, SolverError  # noqa: E402
from autostrat.frontend.context import parse_bytes  # noqa: E402
from autostrat.models import megatron_seeds  # noqa: E402
from autostrat.search import SearchOptions  # noqa: E402
from autostrat.search.optimizer_shard import OptimizerShard  # noqa: E402
from autostrat.search.recompute_choice import choose_recompute  # noqa: E402
from autostrat.tables import format_table  # noqa: E402

HEADERS = ["plan", "forward MB", "backward MB", "sync MB", "update MB", "gather MB", "peak MB", "step ms", "search s", "fits"]


def _searched(build, device_num: int, seeds: dict, options: SearchOptions, layers: tuple[str, ...]):
    """The refined plan with recompute searched (`recompute_choice.choose_recompute`), its
    seconds, and the recompute counts tried."""
    started = time.perf_counter()

    def plan_with(cells):
        return timed_search(training_graph(build(), device_num, seeds, cells), device_num, options)[0]

    plan, choice = choose_recompute(plan_with, layers, options.max_device_memory)
    return plan, time.perf_counter() - started, choice


def rows(budget: int, time_limit: float, only: tuple[str, ...] = ()) -> tuple[list[list[str]], list[str]]:
    device_num, build = MODELS["7b"]
    layers = len(build().blocks)
    data = device_num // TENSOR_PARALLEL
    every_block = megatron_seeds(layers, TENSOR_PARALLEL, data_parallel=data)
    first_block = megatron_seeds(layers, TENSOR_PARALLEL, True, data_parallel=data)
    zero, zero3 = OptimizerShard(), OptimizerShard("level3")
    refined = SearchOptions(refine="cpsat", coarsen="layers", max_device_memory=budget, refine_time_limit=time_limit,
                            cost_model="time")
    blocks = tuple(f"blocks.{index}" for index in range(layers))
    cases = [
        ("megatron", every_block, SearchOptions(), ()),
        ("megatron + ZeRO-1", every_block, SearchOptions(optimizer_shard=zero), ()),
        ("megatron + recompute", every_block, SearchOptions(), blocks),
        ("megatron + ZeRO-1 + recompute", every_block, SearchOptions(optimizer_shard=zero), blocks),
        ("refined", first_block, refined, ()),
        ("refined + ZeRO-1", first_block, replace(refined, optimizer_shard=zero), ()),
        ("refined + ZeRO-1, recompute searched", first_block, replace(refined, optimizer_shard=zero), None),
        ("refined, ZeRO-3 and recompute searched", first_block, replace(refined, optimizer_shard=zero3), None),
    ]
    found, searched = [], []
    for name, seeds, options, recompute in cases:
        if only and name not in only:
            continue
        try:
            if recompute is None:
                plan, seconds, choice = _searched(build, device_num, seeds, options, blocks)
                searched.append(f"{name}: {choice.summary()}")
            else:
                plan, seconds = timed_search(training_graph(build(), device_num, seeds, recompute), device_num, options)
        except (InfeasibleError, SolverError) as error:
            found.append([name, *["-"] * (len(HEADERS) - 2), f"no plan: {type(error).__name__}"])
            print(format_table(HEADERS, found[-1:]), flush=True)
            continue
        phases, prediction = plan.phase_bytes(), plan.prediction
        found.append([name, *(f"{phases.get(p, 0) / 1e6:,.1f}" for p in ("forward", "backward", "sync", "update", "gather")),
                      f"{prediction.peak_bytes / 1e6:,.1f}", f"{prediction.step_time_ns / 1e6:,.3f}", f"{seconds:.2f}",
                      "yes" if prediction.peak_bytes <= budget else "no"])
        print(format_table(HEADERS, found[-1:]), flush=True)
    return found, searched


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", default="80GB", help="per-device memory budget (default 80GB)")
    parser.add_argument("--time-limit", type=float, default=60.0, help="CP-SAT seconds per refined plan")
    parser.add_argument("--plans", nargs="+", metavar="NAME", help="only these rows (their names as printed)")
    args = parser.parse_args()
    found, searched = rows(parse_bytes(args.budget, "--budget"), args.time_limit, tuple(args.plans or ()))
    print()
    print(format_table(HEADERS, found))
    print("\n".join(searched))


if __name__ == "__main__":
    main()
