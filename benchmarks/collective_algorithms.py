"""Issue #37: what the collective algorithms (`cost.algorithms`) change in the 7b shape's no-pipeline step.

The Megatron plan of `benchmarks/quality.py`'s pipeline rows (LLaMA-7B shape, TP 8 x data
parallelism, one sequence per device, the bytes objective) on ``--devices`` devices, servers of 8.
Per phase, the predicted communication time with every collective step run as

- ring: every step as a flat ring (the model before issue #37);
- planned: the algorithm the plan records (the bytes objective: hierarchical across servers);
- time objective: every step's algorithm chosen again for time (recursive doubling too),
  the steps themselves unchanged;

then the collective steps of the plan by phase, kind, group size, planned and time-objective
algorithm, with their count.

Run: .venv/bin/python benchmarks/collective_algorithms.py [--devices 1024]
"""

from __future__ import annotations

import argparse
import collections
import math
from dataclasses import replace

from quality import megatron_7b, timed  # the script's directory is on sys.path

from autostrat.cost import collective_bytes, dtype_size
from autostrat.cost.algorithms import ALGORITHMS
from autostrat.redistribution.algorithms import with_algorithms
from autostrat.redistribution.plan import step_nanoseconds
from autostrat.search import SearchOptions, search
from autostrat.tables import format_table


def as_ring(step, itemsize: int):
    """`step` run as a ring, with the ring's bytes."""
    if step.algorithm == "ring":
        return step
    local_bytes = math.prod(step.before.slice_shape) * itemsize
    return replace(step, algorithm="ring", itemsize=0, bytes=collective_bytes(step.kind, step.group_size, local_bytes, itemsize))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, default=1024)
    args = parser.parse_args()
    plan, seconds = timed(lambda: search(megatron_7b(args.devices, args.devices), args.devices, SearchOptions()))
    model = plan.hardware.alpha_beta(args.devices)
    times = collections.defaultdict(lambda: [0, 0, 0])
    steps = collections.Counter()
    for edge in plan.redistributions:
        if edge.shares:
            continue  # sent once, by the edge it shares
        phase, dtype = plan.edge_phase(edge), plan.sizes.priced(edge.tensor)
        again = with_algorithms(edge.plan, model, dtype, "time")
        for step, fast in zip(edge.plan.steps, again.steps):
            for column, run in enumerate((as_ring(step, dtype_size(dtype)), step, fast)):
                times[phase][column] += step_nanoseconds(model, run)
            if step.kind in ALGORITHMS:
                steps[(phase, step.kind, step.group_size, step.algorithm, fast.algorithm)] += 1
    print(f"{args.devices} devices, search {seconds:.1f} s; predicted step {plan.prediction.step_time_ns / 1e6:,.1f} ms")
    rows = [[phase, *(f"{value / 1e6:,.1f}" for value in columns)] for phase, columns in times.items()]
    print(format_table(["phase", "ring ms", "planned ms", "time objective ms"], rows))
    print()
    rows = [[*map(str, key), str(count)] for key, count in sorted(steps.items())]
    print(format_table(["phase", "kind", "group", "planned", "time objective", "steps"], rows))


if __name__ == "__main__":
    main()
