"""Issue #14: `autostrat search --device-num N` up to 4096 devices, time against candidates.

For each device count, one `autostrat search CONFIG --device-num N` in its own process (cold
memos, as a user runs it), timed as a whole (Python start and imports included). Columns:
devices; the mesh the candidates come from (`strategies.mesh_axes`, "every divisor" up to 16
devices); candidates summed over the searched ops, and the distinct ones (equal rules share
their candidates and costs); wall seconds; milliseconds per distinct candidate, which should
not grow with the device count; bytes per device of the plan.

Run: .venv/bin/python benchmarks/device_count.py [--config configs/gpt.yaml] [--devices 8 64 256 1024 2048 4096]
"""

from __future__ import annotations

import argparse
import importlib
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run as a script: the repository is not installed

from phases import PhaseClock, timed_calls  # noqa: E402  (this folder is on sys.path)

from autostrat.frontend.config import load_config  # noqa: E402
from autostrat.frontend.run import plan_config  # noqa: E402
from autostrat.strategies import mesh_axes  # noqa: E402
from autostrat.tables import format_table  # noqa: E402


def candidates(config_path: str, devices: int) -> tuple[int, int]:
    """Candidates summed over the searched ops, and over the distinct rules (ops of equal rules
    share their candidates), of the problem the search builds."""
    search_module = importlib.import_module("autostrat.search.search")  # not the re-exported function
    clock = PhaseClock()
    with timed_calls(clock, search_module, {"build_problem": "tables"}):
        plan_config(load_config(config_path), devices)
    problem = clock.results["build_problem"]
    distinct = {(problem.graph.ops[name].rule, options) for name, options in problem.candidates.items()}
    return sum(len(c) for c in problem.candidates.values()), sum(len(options) for _, options in distinct)


def timed_search(config_path: str, devices: int) -> tuple[float, str]:
    command = [sys.executable, "-m", "autostrat", "search", config_path, "--device-num", str(devices)]
    start = time.perf_counter()
    out = subprocess.run(command, capture_output=True, text=True, check=True, cwd=ROOT).stdout
    seconds = time.perf_counter() - start
    total = next(line for line in out.splitlines() if line.startswith("total bytes per device:"))
    return seconds, total.split(":")[-1].strip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/gpt.yaml")
    parser.add_argument("--devices", type=int, nargs="+", default=[8, 64, 256, 1024, 2048, 4096])
    args = parser.parse_args()
    rows = []
    for devices in args.devices:
        total, distinct = candidates(args.config, devices)
        seconds, sent = timed_search(args.config, devices)
        mesh = mesh_axes(devices)
        rows.append([devices, "every divisor" if mesh is None else " x ".join(map(str, mesh)), f"{total:,}",
                     f"{distinct:,}", f"{seconds:.2f}", f"{seconds * 1000 / distinct:.1f}", sent])
    print(format_table(["devices", "mesh", "candidates", "distinct", "search s", "ms/distinct", "bytes/device"], rows))


if __name__ == "__main__":
    main()
