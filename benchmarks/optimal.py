"""Issue #30 (optimal among what was searched): the "auto" logical mesh against every divisor.

For the GPT training step of configs/gpt_train.yaml (its seeds scaled to each device count, as
`autostrat search --device-num` scales them), prints per device count the bytes per device of
the plan searched on the "auto" mesh and on every divisor ("full"), the loss of auto against
full, and the seconds each search took. With ``--refine S``, each search is refined by CP-SAT
for at most S seconds (both then say OPTIMAL or FEASIBLE: optimal among what each searched).

Also (``--follow``): the forward-only `TransformerStack` of 96 blocks (hidden 1024, 8 devices),
block 0 seeded TP 4 x DP 2, propagated following the seeded layer and by default (which keeps
the cheaper of following and not following).

Run: .venv/bin/python benchmarks/optimal.py [--devices 16 24 32] [--refine 20] [--config configs/gpt_train.yaml]
     .venv/bin/python benchmarks/optimal.py --follow
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run as a script: the repository is not installed

from autostrat.frontend import trace  # noqa: E402
from autostrat.frontend.config import apply_seeds, load_config  # noqa: E402
from autostrat.frontend.run import plan_config  # noqa: E402
from autostrat.models import TransformerStack, megatron_seeds  # noqa: E402
from autostrat.search.problem import build_problem  # noqa: E402
from autostrat.search.propagate import TIE_BREAKS, _propagate, propagate  # noqa: E402
from autostrat.strategies import mesh_axes  # noqa: E402
from autostrat.tables import format_table  # noqa: E402


def searched(config_path: Path, device_num: int, mesh: str, refine: float | None):
    """The plan of the config on `device_num` devices and `mesh`, and the seconds it took."""
    overrides = {"mesh": mesh} | ({"refine": "cpsat", "refine_time_limit": refine} if refine else {})
    config = load_config(config_path, phase="train", **overrides)
    started = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        plan, _ = plan_config(config, device_num)
    return plan, time.perf_counter() - started


def status(plan) -> str:
    return plan.refinement.result.status if plan.refinement else "bfs"


def mesh_rows(config_path: Path, devices: list[int], refine: float | None) -> list[list[str]]:
    rows = []
    for device_num in devices:
        auto, auto_seconds = searched(config_path, device_num, "auto", refine)
        full, full_seconds = searched(config_path, device_num, "full", refine)
        axes = mesh_axes(device_num)
        loss = auto.total_bytes / full.total_bytes - 1 if full.total_bytes else 0.0
        rows.append([str(device_num), "every divisor" if axes is None else " x ".join(map(str, axes)),
                     f"{auto.total_bytes:,}", status(auto), f"{full.total_bytes:,}", status(full), f"{loss:+.1%}",
                     f"{auto_seconds:.1f}", f"{full_seconds:.1f}"])
        print(format_table(HEADERS, rows[-1:]).splitlines()[-1], flush=True)
    return rows


HEADERS = ["devices", "auto mesh", "auto bytes", "auto", "full bytes", "full", "auto loss", "auto s", "full s"]


def follow_rows() -> list[list[str]]:
    net = TransformerStack(layers=96, hidden=1024, heads=16, seq=128, batch=16)
    graph = trace(net, *net.example_inputs(), device_num=8)
    problem = build_problem(apply_seeds(graph, megatron_seeds(96, 4, first_layer_only=True, data_parallel=2), 8), 8)
    following = min(problem.cost(_propagate(problem, None, True, tie).choice) for tie in TIE_BREAKS)
    default = problem.cost(propagate(problem).choice)
    return [["following block 0", f"{following / 1e6:,.1f}"], ["default (the cheaper start)", f"{default / 1e6:,.1f}"]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, nargs="+", default=[16, 24, 32])
    parser.add_argument("--refine", type=float, help="refine each plan by CP-SAT for at most this many seconds")
    parser.add_argument("--config", type=Path, default=ROOT / "configs" / "gpt_train.yaml")
    parser.add_argument("--follow", action="store_true", help="only the follow_layers comparison")
    args = parser.parse_args()
    if args.follow:
        print(format_table(["96-block forward-only stack, 8 devices", "MB per device"], follow_rows()))
        return
    print(f"{args.config.name}, training step, bytes per device per step")
    rows = mesh_rows(args.config, args.devices, args.refine)
    print(format_table(HEADERS, rows))
    worst = max(float(row[6].rstrip("%")) for row in rows)
    print(f"worst auto loss against every divisor: {worst:+.1f}%")


if __name__ == "__main__":
    main()
