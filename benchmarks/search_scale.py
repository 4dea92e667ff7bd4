"""How sharding propagation scales with a GPT-style model's depth.

The GPT-style model (hidden 1024, seq 128, batch 16, 16 heads, vocab 32768) with 1, 8, 32 and
96 layers on 8 and 64 devices, seeded the Megatron-LM way on every layer or on the first layer
only: tensor parallel over min(devices, 8) devices (Megatron needs the 16 heads divisible by it),
data parallel over the rest. Prints ops, candidates, edges, seconds to trace, to build candidates and cost tables, to
propagate (BFS) and to build the plan, the end-to-end seconds, and the plan's bytes per device. Cost-table entries
are computed as the BFS reads them, so "bfs s" includes pricing them; "entries" is how many entries of the run's
distinct tables (identical edges share one) are computed after it, out of all of them (a warm run's tables carry what
earlier runs computed).

Memo tables (strategies, op costs, redistribution costs) are cleared before the first run of each
device count, so that run is cold and later ones reuse what it computed (column "memo"); with
--cold every run starts cold, as a fresh process would.

Run: .venv/bin/python benchmarks/search_scale.py [--layers 1 8 32 96] [--devices 8 64] [--cold]
"""

from __future__ import annotations

import argparse

from phases import PhaseClock  # this folder is on sys.path when run as a script

from autostrat.frontend import trace
from autostrat.frontend.config import apply_seeds
from autostrat.models import GPT, megatron_seeds
from autostrat.tables import format_table
from autostrat.search.plan import build_plan
from autostrat.search.problem import build_problem
from autostrat.search.propagate import propagate


def clear_caches() -> None:
    """Every run starts cold: the memo tables of strategies, costs and redistributions."""
    from autostrat.redistribution.memo import clear_memos
    from autostrat.search import problem, problem_edges
    from autostrat.strategies import generate_strategies

    generate_strategies.cache_clear()
    problem_edges.edge_table.cache_clear()
    problem._op_costs.cache_clear()
    clear_memos()


def run(layers: int, device_num: int, first_layer_only: bool, cold: bool) -> dict:
    if cold:
        clear_caches()
    clock = PhaseClock()
    with clock.phase("trace"):
        net = GPT(layers=layers, hidden=1024, heads=16, seq=128, batch=16, vocab=32768)
        graph = trace(net, *net.example_inputs(), device_num=device_num)
        model_parallel = min(device_num, 8)
        seeds = megatron_seeds(layers, model_parallel, first_layer_only, data_parallel=device_num // model_parallel)
        graph = apply_seeds(graph, seeds, device_num)
    with clock.phase("tables"):
        problem = build_problem(graph, device_num)
    with clock.phase("bfs"):
        assignment = propagate(problem)
    tables = {id(edge.table): edge.table for edge in problem.edges}.values()
    entries = f"{sum(t.computed for t in tables):,}/{sum(t.size for t in tables):,}"
    with clock.phase("plan"):
        strategies = {name: problem.candidates[name][i] for name, i in assignment.choice.items()}
        plan = build_plan(graph, device_num, "auto_parallel", strategies, assignment.origin, assignment.warnings)
    seconds = clock.seconds
    return {
        "plan": plan,
        "row": [
            str(layers), str(device_num), "first" if first_layer_only else "all", "cold" if cold else "warm",
            str(len(graph.ops)), str(sum(len(c) for c in problem.candidates.values())), str(len(problem.edges)),
            f"{seconds['trace']:.2f}", f"{seconds['tables']:.2f}", f"{seconds['bfs']:.3f}", f"{seconds['plan']:.2f}",
            entries, f"{clock.total():.2f}", f"{plan.total_bytes:,}",
        ],
    }


def layer_bytes(plan, layer: int) -> dict[str, int]:
    """Bytes per device of each redistribution inside one block, by consumer op."""
    prefix = f"blocks.{layer}."
    found: dict[str, int] = {}
    for edge in plan.redistributions:
        if edge.consumer.startswith(prefix):
            key = f"{edge.consumer[len(prefix):]}[{edge.input_index}] " + "+".join(s.kind for s in edge.plan.steps)
            found[key] = found.get(key, 0) + edge.cost
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, nargs="+", default=[1, 8, 32, 96])
    parser.add_argument("--devices", type=int, nargs="+", default=[8, 64])
    parser.add_argument("--cold", action="store_true", help="clear every memo before every run")
    args = parser.parse_args()
    headers = ["layers", "devices", "seeds", "memo", "ops", "candidates", "edges", "trace s", "tables s", "bfs s", "plan s",
               "entries", "total s", "bytes/device"]
    rows, examples = [], {}
    for device_num in args.devices:
        first_run = True
        for first_only in (False, True):
            for layers in args.layers:
                result = run(layers, device_num, first_only, cold=args.cold or first_run)
                first_run = False
                rows.append(result["row"])
                print("  ".join(result["row"]), flush=True)  # progress while the next run computes
                examples[(device_num, first_only)] = result["plan"]
    print()
    print(format_table(headers, rows))
    for (device_num, first_only), plan in sorted(examples.items()):
        seeds = "first layer only" if first_only else "every layer"
        print(f"\n{device_num} devices, seeds on {seeds}, {len(plan.graph.ops)} ops: redistributions inside block 0 and the last block")
        last = max(int(name.split(".")[1]) for name in plan.ops if name.startswith("blocks."))
        for layer in sorted({0, last}):
            for key, cost in layer_bytes(plan, layer).items():
                print(f"  blocks.{layer}.{key}: {cost:,} B")


if __name__ == "__main__":
    main()
