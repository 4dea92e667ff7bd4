"""Issue #35, expert parallelism: what the fully automatic search picks for the tiny Mixtral.

configs/moe_train.yaml without its seeds, searched with ``search_mode: integer_programming``
(every op on every device, CP-SAT from the data-parallel start) under ``cost_model: time``,
next to the shipped EP 4 x ETP 2 plan. Per plan: the strategies of the MoE ops (router,
routing, dispatch, experts, combine), the layout of one expert weight (its split of the experts
is the expert parallelism, of the FFN width the ETP), the predicted step time and bytes per
device, and the refinement's status. The time limit is the first argument (default 120 s): on a
loaded machine CP-SAT may not finish pricing the tables within it, and then keeps its start.

Run: .venv/bin/python benchmarks/moe_search.py [seconds]
"""

from __future__ import annotations

import sys
import time
import warnings
from pathlib import Path

from autostrat.frontend.config import parse_config, parse_config_text
from autostrat.frontend.run import plan_config
from autostrat.tables import format_table

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "configs/moe_train.yaml"
MOE_OPS = ("route", "dispatch_mask", "combine_weights", "dispatch", "expert_gate", "expert_up", "expert_down", "combine")


def automatic_config_text(seconds: float) -> str:
    """The shipped config without its seeds, fully automatic under the time objective."""
    text = CONFIG.read_text().split("\nstrategies:")[0] + "\n"
    text = text.replace("search_mode: sharding_propagation", "search_mode: integer_programming")
    return text + f"cost_model: time\nrefine_time_limit: {seconds}\n"


def rows(name: str, plan) -> list[list[str]]:
    found = [[name, op, str(plan.ops[f"blocks.0.moe.{op}"].strategy.to_tuples())] for op in MOE_OPS]
    weight = plan.layouts["blocks.0.moe.w_gate"]
    found.append([name, "w_gate [e, h, f] layout", f"{weight.device_matrix} {weight.tensor_map} slice {list(weight.slice_shape)}"])
    found.append([name, "predicted step", f"{plan.prediction.step_time_ns / 1000:.3f} us, {plan.total_bytes:,} bytes per device"])
    found.append([name, "refinement", plan.refinement.summary()[:110] if plan.refinement else "none (propagation from the seeds)"])
    return found


def main(seconds: float) -> None:
    warnings.simplefilter("ignore", UserWarning)  # the seeds' own dispatch AllToAll is announced as a disagreement
    seeded, _ = plan_config(parse_config(CONFIG.read_text(), CONFIG))
    text = automatic_config_text(seconds)
    parse_config_text(text, CONFIG)  # the same YAML checks as a file
    started = time.process_time()
    automatic, _ = plan_config(parse_config(text, CONFIG))
    cpu = time.process_time() - started
    print(format_table(["plan", "op", "strategy"], rows("seeded EP4xETP2", seeded) + rows("automatic", automatic)))
    print(f"automatic search: {cpu:.1f} CPU-s")


if __name__ == "__main__":
    main(float(sys.argv[1]) if len(sys.argv) > 1 else 120.0)
