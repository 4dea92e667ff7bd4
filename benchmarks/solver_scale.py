"""How the CP-SAT refinement scales with a GPT-style model's depth, with no seeds.

The GPT-style model (hidden 1024, seq 128, batch 16, 16 heads, vocab 32768) with 1, 8, 32 and
96 layers on 8 and 64 devices, searched fully automatically (search_mode "integer_programming":
no seeds, every op uses every device). Two budgets per size:

- none: no memory budget. The optimum is then pure data parallelism (0 bytes), found from the
  hint and proven at once; the row shows how far the exact coarsening shrinks the model.
- megatron: the per-device peak memory of Megatron-LM's hand plan for the same model (tensor
  parallel over min(devices, 8), data parallel over the rest) as `max_device_memory`, so that
  replicated parameters no longer fit. Solved at coarsening level "layers" (repeated layers share
  variables; the optimum is over plans whose layers agree) and, up to --exact-layers layers, also
  at level "exact" under the same time limit, to show what the unrestricted model proves.

Columns: CP-SAT variables and constraints of the uncoarsened model ("before") and of the solved
one ("after"), solve seconds (coarsening + model + solve), status, gap, bytes per device of the
solver's plan, of the hint (data parallel) and of Megatron's plan, and the peak memory.

Run: .venv/bin/python benchmarks/solver_scale.py [--layers 1 8 32 96] [--devices 8 64] [--time-limit 60]
"""

from __future__ import annotations

import argparse
import time

from autostrat.frontend import trace
from autostrat.frontend.config import apply_seeds
from autostrat.models import GPT, megatron_seeds
from autostrat.search.memory import peak_bytes
from autostrat.search.problem import build_problem
from autostrat.search.propagate import data_parallel, propagate
from autostrat.search.refine import model_size, refine
from autostrat.tables import format_table

HEADERS = ["layers", "devices", "budget", "level", "vars before", "cons before", "vars after", "cons after",
           "solve s", "status", "gap", "bytes", "hint bytes", "megatron bytes", "peak", "budget bytes"]


def gpt_graph(layers: int, device_num: int):
    net = GPT(layers=layers, hidden=1024, heads=16, seq=128, batch=16, vocab=32768)
    return trace(net, *net.example_inputs(), device_num=device_num)


def megatron(graph, layers: int, device_num: int) -> tuple[int, int]:
    """Bytes and peak memory per device of Megatron-LM's plan (its seeds propagated by BFS)."""
    model_parallel = min(device_num, 8)
    seeds = megatron_seeds(layers, model_parallel, data_parallel=device_num // model_parallel)
    problem = build_problem(apply_seeds(graph, seeds, device_num), device_num)
    choice = propagate(problem).choice
    return problem.cost(choice), peak_bytes(problem, choice)


def solve_row(problem, layers, device_num, budget, level, time_limit, reference, before) -> list[str]:
    hint = data_parallel(problem, keep_seeds=True).choice
    after = model_size(problem, level, budget)
    start = time.perf_counter()
    result = refine(problem, hint, time_limit, max_device_memory=budget, coarsen_level=level)
    seconds = time.perf_counter() - start
    return [
        str(layers), str(device_num), "none" if budget is None else "megatron", level,
        f"{before[0]:,}", f"{before[1]:,}", f"{after[0]:,}", f"{after[1]:,}",
        f"{seconds:.1f}", result.status, f"{result.gap:.2%}", f"{result.objective:,}", f"{problem.cost(hint):,}",
        f"{reference[0]:,}", f"{peak_bytes(problem, result.choice):,}", "-" if budget is None else f"{budget:,}",
    ]


def rows_for(layers: int, device_num: int, time_limit: float, exact_layers: int) -> list[list[str]]:
    graph = gpt_graph(layers, device_num)
    reference = megatron(graph, layers, device_num)
    problem = build_problem(graph, device_num, full_only=True)
    rows = []
    for budget, levels in ((None, ["exact"]), (reference[1], ["layers"] + (["exact"] if layers <= exact_layers else []))):
        before = model_size(problem, "none", budget)
        for level in levels:
            rows.append(solve_row(problem, layers, device_num, budget, level, time_limit, reference, before))
            print("  ".join(rows[-1]), flush=True)  # progress while the next row solves
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, nargs="+", default=[1, 8, 32, 96])
    parser.add_argument("--devices", type=int, nargs="+", default=[8, 64])
    parser.add_argument("--time-limit", type=float, default=60.0, help="CP-SAT seconds per solve (default 60)")
    parser.add_argument("--exact-layers", type=int, default=8, help="also solve level 'exact' under the budget up to this depth")
    args = parser.parse_args()
    rows = []
    for device_num in args.devices:
        for layers in args.layers:
            rows += rows_for(layers, device_num, args.time_limit, args.exact_layers)
    print()
    print(format_table(HEADERS, rows))


if __name__ == "__main__":
    main()
