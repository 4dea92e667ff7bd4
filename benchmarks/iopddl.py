"""Issue #36: `autostrat solve` on the IOPDDL contest's instances (../shared/iopddl), each in a
fresh process under the contest's time limit for its letter (or --seconds), one at a time.

Columns: the instance, its nodes and edges; the cost of the solution the command printed last,
its ratio to the best contest entry and to XLA's solver (where the contest reported it); the
lower bound the command reported; the wall time around the whole process (start, reading,
solving, printing) against the limit; and whether the solution is valid — one strategy per node,
within the memory limit at every time point — by an evaluator here that shares no code with
the solver, which also recomputes the cost.

Targets: a valid solution on every instance; below XLA on A, B, C and G; within 1.10x of the
best entry on at least 6 of 8; never over the limit by more than 5 s.

Run: .venv/bin/python benchmarks/iopddl.py [A B ...] [--seconds S] [--folder ../shared/iopddl]
"""

from __future__ import annotations

import argparse
import gzip
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run as a script: the repository is not installed

from autostrat.tables import format_table  # noqa: E402

FOLDER = ROOT.parent / "shared" / "iopddl"
# The contest's published final results (asplos-contest/2025): the lowest valid cost of any team,
# and XLA's auto-sharding solver where reported.
BEST = {"A": 6548641531, "B": 532843, "C": 84102445260, "D": 313613524736, "G": 217039, "K": 2274276676,
        "L": 1970993742, "M": 49928460991}
XLA = {"A": 13214846074, "B": 990205, "C": 4195881092919, "G": 1264777}
HEADERS = ["instance", "nodes", "edges", "cost", "/ best", "/ XLA", "bound", "time s", "limit s", "valid"]


def check(path: Path, solution: list) -> tuple:
    """(valid, cost, peak) of `solution`, read straight from the file."""
    problem = json.loads(gzip.open(path).read() if path.suffix == ".gz" else path.read_text())["problem"]
    nodes, edges = problem["nodes"], problem["edges"]
    if len(solution) != len(nodes["costs"]) or any(not 0 <= s < len(c) for s, c in zip(solution, nodes["costs"])):
        return False, None, None
    cost = sum(costs[s] for costs, s in zip(nodes["costs"], solution))
    for (u, v), flat in zip(edges["nodes"], edges["costs"]):
        cost += flat[solution[u] * len(nodes["costs"][v]) + solution[v]]
    end = max((b for _, b in nodes["intervals"]), default=0)
    change = np.zeros(end + 1, dtype=np.int64)
    for (start, stop), usages, s in zip(nodes["intervals"], nodes["usages"], solution):
        if start < stop:
            change[start] += usages[s]
            change[stop] -= usages[s]
    peak = int(np.cumsum(change).max()) if end else 0
    return peak <= problem.get("usage_limit", peak), cost, peak


def run(letter: str, folder: Path, seconds: float | None) -> list:
    """One row: `autostrat solve` in a fresh process, timed around it."""
    path = folder / f"asplos-2025-iopddl-{letter}.json.gz"
    command = [sys.executable, "-m", "autostrat", "solve", str(path)]
    command += ([] if seconds is None else [f"{seconds:g}"]) + ["--json"]
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
    wall = time.perf_counter() - started
    lines = done.stdout.strip().splitlines()
    if not lines:
        return [letter, "", "", f"failed: {done.stderr.strip()[-80:]}", "", "", "", f"{wall:.1f}", "", "no"]
    solution, figures = json.loads(lines[-1]), json.loads(lines[-2])
    valid, cost, _ = check(path, solution) if solution else (False, None, None)
    problem = json.loads(gzip.open(path).read())["problem"]
    limit = seconds if seconds is not None else _contest_seconds(letter)
    agree = cost == figures["cost"]
    return [letter, len(problem["nodes"]["costs"]), len(problem["edges"]["nodes"]),
            f"{cost:,}" if cost is not None else "none", f"{cost / BEST[letter]:.4f}" if cost else "",
            f"{cost / XLA[letter]:.4f}" if cost and letter in XLA else "", f"{figures['lower_bound']:,.0f}",
            f"{wall:.1f}", f"{limit:g}", ("yes" if valid else "no") + ("" if agree else " (cost differs)")]


def _contest_seconds(letter: str) -> float:
    from autostrat.cli_solve import contest_seconds

    return contest_seconds(f"x-{letter}.json.gz")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("instances", nargs="*", default=sorted(BEST), help="instance letters (default: all eight)")
    parser.add_argument("--seconds", type=float, help="time limit for every instance (default: the contest's)")
    parser.add_argument("--folder", type=Path, default=FOLDER, help="where the instances are")
    args = parser.parse_args()
    rows = []
    for letter in args.instances:
        rows.append(run(letter, args.folder, args.seconds))
        print(format_table(HEADERS, [rows[-1]]).splitlines()[-1], file=sys.stderr, flush=True)
    print(format_table(HEADERS, rows))


if __name__ == "__main__":
    main()
