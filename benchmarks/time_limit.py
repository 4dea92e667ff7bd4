"""Issue #30, item 6: `--time-limit` bounds the whole search, within 10 %.

Each row searches a config with ``--refine cpsat --time-limit T`` in a fresh process (the
redistribution memo is per process: a second search would find its cost tables priced), and
measures around the calls:

- search s: the whole `search` call (tracing and the training graph excluded), where the clock
  starts;
- refinement s: the refinement (`search._refined_plan`: the extra starts, pricing the cost
  tables, coarsening, building the model, the solves and the plan of the result);
- before s: the rest, the problem and the BFS propagation, which come first and do not look at
  the clock (the refinement gets what they leave);
- ratio: search s / T; target <= 1.10 on every row whose problem and BFS take less than T (they
  are never cut short: their plan is the floor; such a row says "BFS alone over T");
- status: the refinement's status, and the line saying where the time ran out if it did.

Run: .venv/bin/python benchmarks/time_limit.py [--cases stack:32 gpt_train:32 gpt_train:64] [--limits 5 20]
"""

from __future__ import annotations

import argparse
import importlib
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run as a script: the repository is not installed

from autostrat.tables import format_table  # noqa: E402

CONFIGS = {"stack": "configs/transformer_stack.yaml", "gpt_train": "configs/gpt_train.yaml"}
HEADERS = ["case", "devices", "--time-limit s", "search s", "refinement s", "before s", "ratio", "status"]
TARGET = 1.10


def measure(case: str, device_num: int, limit: float) -> dict:
    """One row's figures, in this process."""
    from autostrat.frontend.config import load_config
    from autostrat.frontend.run import plan_config

    search_module = importlib.import_module("autostrat.search.search")
    refined_plan, refinement = search_module._refined_plan, []

    def timed_refined_plan(*args, **kwargs):
        started = time.perf_counter()
        try:
            return refined_plan(*args, **kwargs)
        finally:
            refinement.append(time.perf_counter() - started)

    search_module._refined_plan = timed_refined_plan
    config = load_config(ROOT / CONFIGS[case], refine="cpsat", refine_time_limit=limit)
    search = search_module.search
    searched = []

    def timed_search(*args, **kwargs):
        started = time.perf_counter()
        try:
            return search(*args, **kwargs)
        finally:
            searched.append(time.perf_counter() - started)

    importlib.import_module("autostrat.frontend.api").search = timed_search
    plan, _ = plan_config(config, device_num)
    result = plan.refinement.result
    status = result.status + (f" ({result.stopped})" if result.stopped else f", gap {result.gap:.1%}")
    return {"search": searched[-1], "refinement": refinement[-1], "status": status}


def row(case: str, device_num: int, limit: float) -> list[str]:
    """One row, measured in a child process."""
    child = subprocess.run([sys.executable, __file__, "--row", case, str(device_num), str(limit)], cwd=ROOT,
                           capture_output=True, text=True, check=False)
    if child.returncode != 0:
        return [case, str(device_num), f"{limit:g}", "-", "-", "-", "-", f"failed: {child.stderr.strip()[-200:]}"]
    found = json.loads(child.stdout.strip().splitlines()[-1])
    ratio, before = found["search"] / limit, found["search"] - found["refinement"]
    verdict = "" if ratio <= TARGET else " (BFS alone over T)" if before > limit else " (missed)"
    return [case, str(device_num), f"{limit:g}", f"{found['search']:.1f}", f"{found['refinement']:.1f}",
            f"{before:.1f}", f"{ratio:.2f}{verdict}",
            found["status"]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", nargs="+", default=["stack:32", "gpt_train:32", "gpt_train:64"],
                        help="config:devices pairs (configs: " + ", ".join(CONFIGS) + ")")
    parser.add_argument("--limits", type=float, nargs="+", default=[5.0, 20.0], help="--time-limit values (seconds)")
    parser.add_argument("--row", nargs=3, metavar=("CASE", "DEVICES", "LIMIT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.row:
        case, device_num, limit = args.row
        print(json.dumps(measure(case, int(device_num), float(limit))))
        return
    rows = []
    for case, device_num in (item.split(":") for item in args.cases):
        for limit in args.limits:
            rows.append(row(case, int(device_num), limit))
            print(format_table(HEADERS, [rows[-1]]), flush=True)
    print()
    print(format_table(HEADERS, rows))


if __name__ == "__main__":
    main()
