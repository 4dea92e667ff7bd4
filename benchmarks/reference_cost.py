"""What the stand-alone reference of a run costs: the CPU seconds of `runtime.reference.reference_run`
on a config's graph (two steps; a training config's with its optimiser), each in a fresh process,
as a job's launcher pays it once per `autostrat run` (importing JAX, tracing and compiling the
step, running it).

Columns: config; the reference's library; the CPU seconds of each repeat (its own process:
`time.process_time` around the call, so the import of JAX is in it and the planning is not);
their median. Repeats in separate processes, since a process keeps its compiled steps.

Run: .venv/bin/python benchmarks/reference_cost.py [--repeats 3] [CONFIG ...]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
from pathlib import Path

from autostrat.tables import format_table

ROOT = Path(__file__).resolve().parent.parent
CONFIGS = ("ffn.yaml", "gpt.yaml", "gpt_train.yaml", "transformer_stack.yaml")

# Run in a child: plan the config, then time the reference alone.
CHILD = """
import sys, time
from autostrat.frontend.config import load_config
from autostrat.frontend.run import plan_config
from autostrat.frontend.train import reference_graph, synthetic_batches
from autostrat.runtime.executor import graph_values
from autostrat.runtime.reference import reference_run
plan, _ = plan_config(load_config(sys.argv[1]))
graph = reference_graph(plan)
values, batches = graph_values(graph, {}), synthetic_batches(graph, 2, 0)
began = time.process_time()
library = reference_run(graph, values, batches).library
print(f"{time.process_time() - began:.3f}\\t{library}")
"""


def measure(config: Path) -> tuple[float, str]:
    """The reference's CPU seconds on `config`'s graph in a fresh process, and its library."""
    done = subprocess.run([sys.executable, "-c", CHILD, str(config)], capture_output=True, text=True, cwd=ROOT, check=True)
    seconds, library = done.stdout.strip().splitlines()[-1].split("\t")
    return float(seconds), library


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("configs", nargs="*", help=f"configs to measure (default: {', '.join(CONFIGS)})")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    rows = []
    for name in args.configs or CONFIGS:
        config = ROOT / "configs" / name if not Path(name).exists() else Path(name)
        runs = [measure(config) for _ in range(args.repeats)]
        seconds = [s for s, _ in runs]
        rows.append([config.name, runs[0][1], "  ".join(f"{s:.2f}" for s in seconds), f"{statistics.median(seconds):.2f}"])
    print(format_table(["config", "reference", "CPU s per repeat", "median"], rows))


if __name__ == "__main__":
    main()
