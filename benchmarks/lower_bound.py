"""Issue #19: every shipped config's plan against the matmul communication lower bound.

Each config in configs/ is planned at its own device_num, in its own phase and, when it has no
optimizer, as a training step too (phase "train"; a config that cannot train is left out).
Columns: bytes per device of the whole plan, the bytes charged to its matmul-family ops
(`search.bounds.op_charges`), the sum of those ops' bounds (Al Daas et al., SPAA 2022, each op
alone), their ratio and how many ops send more than `FLAG` times their own bound. A pipeline
plan is one micro-batch's step on one stage's devices. See `search.bounds` for why the summed
bound is not a bound on the plan and why an op can sit below 1×.

Run: .venv/bin/python benchmarks/lower_bound.py [--lines]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run as a script: the repository is not installed

from autostrat.errors import AutostratError  # noqa: E402
from autostrat.frontend.config import load_config  # noqa: E402
from autostrat.frontend.run import plan_config  # noqa: E402
from autostrat.search.bounds import FLAG, plan_bounds  # noqa: E402
from autostrat.tables import format_table  # noqa: E402


def plans():
    """(config name, phase, plan) for every config and phase that plans."""
    for path in sorted((ROOT / "configs").glob("*.yaml")):
        own = load_config(path)
        for phase in dict.fromkeys((own.context.phase, "train")):
            try:
                config = own if phase == own.context.phase else load_config(path, phase=phase)
                yield path.name, phase, plan_config(config)[0]
            except AutostratError as error:
                print(f"{path.name} ({phase}): not planned: {error}", file=sys.stderr)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", action="store_true", help="also print each plan's communication line")
    args = parser.parse_args(argv)
    rows, lines = [], []
    for name, phase, plan in plans():
        bounds = plan_bounds(plan)
        ratio = "n/a" if bounds.ratio is None else f"{bounds.ratio:.2f}×"
        rows.append([name, str(plan.device_num), phase, f"{plan.total_bytes:,}", f"{bounds.charged:,}",
                     f"{bounds.bound:,.0f}", ratio, str(len(bounds.flagged))])
        lines.append(f"{name} ({phase}): {bounds.line}")
    print(format_table(["config", "devices", "phase", "plan bytes", "matmul bytes", "bound", "ratio",
                        f"ops > {FLAG}×"], rows))
    if args.lines:
        print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
