"""Issue #36: the refinement at coarsening "exact" (no layer tying) against the layer-tied optimum.

Models of `benchmarks/quality.py` (training steps with Adam, Megatron-LM's seeds on block 0
only, propagated, bytes per device): by default "7b" (LLaMA-7B shape on 64 devices). Rows per
model, each a whole `search` (`SearchOptions(refine="cpsat")`, as `autostrat search --refine
cpsat --coarsen LEVEL` runs it) in a process of its own, so that its peak RSS is its own:

- bfs: the propagated plan (no refinement);
- layers: CP-SAT on the model whose repeated layers agree, within ``--tied-limit`` seconds
  (OPTIMAL there means optimal among plans whose layers agree, not among all plans);
- exact: the untied model within ``--time-limit`` seconds (`search.solve.untied`: the tied
  model first, CP-SAT on the untied model, then the IOPDDL solver from CP-SAT's plan); its
  bound holds for every plan.

Columns: cost (bytes per device), bound, gap, status, which solver found the plan, seconds (the
whole search: problem, BFS, refinement and plan), peak RSS, and cost / the layers row's cost.
Target: exact / tied <= 1 within the time limit.

Run: .venv/bin/python benchmarks/coarsen_exact.py [--models 7b stack-8] [--time-limit 60] [--tied-limit 120]

Recorded (2 cores shared with other work; 7b at load 12-13, stack-8 with ``--tied-limit 60`` at
load 10-13): 7b: bfs 52.572 GB; layers 20.200 GB OPTIMAL (among tied plans) in 119.5 s; exact
6.247 GB, bound 0.934 GB, 60.3 s, 685 MB, 0.309 of the tied optimum. stack-8: bfs 0.469 GB;
layers 0.469 GB FEASIBLE (bound 0.032 GB) in 64.5 s; exact 0.060 GB, bound 0.025 GB, 59.1 s,
0.128 of the layers row. Before `search.solve.untied`, the 7b exact row kept the BFS plan.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script: the repository is not installed

from quality import MODELS, TENSOR_PARALLEL, training_graph  # noqa: E402  (this folder is on sys.path)

from autostrat.models import megatron_seeds  # noqa: E402
from autostrat.search import SearchOptions, search  # noqa: E402
from autostrat.tables import format_table  # noqa: E402

HEADERS = ["model", "devices", "coarsening", "cost GB", "bound GB", "gap", "status", "found by", "seconds", "RSS MB",
           "cost / tied"]


def measure(model: str, level: str, time_limit: float) -> dict:
    """One row's figures: the search of `model` refined at `level` ("bfs": not refined)."""
    device_num, build = MODELS[model]
    layers = len(build().blocks)
    seeds = megatron_seeds(layers, TENSOR_PARALLEL, True, data_parallel=device_num // TENSOR_PARALLEL)
    graph = training_graph(build(), device_num, seeds)
    options = SearchOptions() if level == "bfs" else SearchOptions(refine="cpsat", coarsen=level,
                                                                   refine_time_limit=time_limit)
    started = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # unreached ops' warnings: the table says what matters
        plan = search(graph, device_num, options)
    seconds = time.perf_counter() - started
    result = plan.refinement.result if plan.refinement else None
    return {"cost": plan.total_bytes, "bound": result.bound if result else None, "gap": result.gap if result else None,
            "status": result.status if result else "-", "solver": result.solver if result else "BFS",
            "seconds": seconds, "rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "objective": result.objective if result else plan.total_bytes}


def measured(model: str, level: str, time_limit: float) -> dict:
    """`measure` in a process of its own (its peak RSS is then the row's alone)."""
    command = [sys.executable, __file__, "--row", model, level, str(time_limit)]
    output = subprocess.run(command, check=True, capture_output=True, text=True).stdout
    return json.loads(output.strip().splitlines()[-1])


def row(model: str, level: str, figures: dict, tied: int | None) -> list[str]:
    device_num = MODELS[model][0]
    bound = "-" if figures["bound"] is None else f"{figures['bound'] / 1e9:,.3f}"
    gap = "-" if figures["gap"] is None else f"{figures['gap']:.1%}"
    ratio = "-" if not tied else f"{figures['cost'] / tied:.3f}"
    return [model, str(device_num), level, f"{figures['cost'] / 1e9:,.3f}", bound, gap, figures["status"],
            figures["solver"], f"{figures['seconds']:.1f}", f"{figures['rss']:,.0f}", ratio]


def model_rows(model: str, args: argparse.Namespace) -> list[list[str]]:
    found = {level: measured(model, level, limit)
             for level, limit in (("bfs", 0.0), ("layers", args.tied_limit), ("exact", args.time_limit))}
    # The refinement's objective is the plan's bytes (`problem.cost`): the two must agree.
    assert all(f["objective"] == f["cost"] for f in found.values()), found
    tied = found["layers"]["cost"]
    return [row(model, level, figures, tied) for level, figures in found.items()]


def main() -> None:
    if len(sys.argv) == 5 and sys.argv[1] == "--row":
        print(json.dumps(measure(sys.argv[2], sys.argv[3], float(sys.argv[4]))))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", choices=list(MODELS), default=["7b"])
    parser.add_argument("--time-limit", type=float, default=60.0, help="seconds of the exact rows' search (default 60)")
    parser.add_argument("--tied-limit", type=float, default=120.0, help="seconds of the layers rows' search (default 120)")
    args = parser.parse_args()
    rows = []
    for model in args.models:
        rows += model_rows(model, args)
        print(format_table(HEADERS, rows[-3:]), flush=True)
    print()
    print(format_table(HEADERS, rows))
    for model_row in rows[2::3]:
        ratio = float(model_row[-1])
        print(f"{model_row[0]}: exact / tied = {ratio:.3f} ({'met' if ratio <= 1 else 'missed'}: <= 1)")


if __name__ == "__main__":
    main()
