"""Run under mpiexec: every layout pair of `test_runtime.LAYOUT_PAIRS` whose device count is the
world size, on `MpiBackend`, compared with `redistribution.simulate` on every rank. Rank 0 prints
one line per pair; any mismatch raises (and `python -m mpi4py` aborts the job)."""

from __future__ import annotations

import numpy as np

from autostrat.redistribution import simulate
from autostrat.runtime.mpi import MpiBackend
from tests.test_runtime import LAYOUT_PAIRS, layout_pair, run_layout_pair


def main() -> None:
    backend = MpiBackend()
    for pair in LAYOUT_PAIRS:
        plan, pieces = layout_pair(*pair)
        if plan.src.device_num != backend.device_num:
            continue
        result = run_layout_pair(backend, plan, pieces)
        expected = simulate(plan, pieces)[backend.rank]
        if not np.array_equal(result.outputs["t"], expected):
            raise AssertionError(f"rank {backend.rank}: {plan} gave another piece than the simulation")
        sent, predicted = sum(t.sent for t in result.traffic), sum(t.predicted for t in result.traffic)
        if sent != predicted:
            raise AssertionError(f"rank {backend.rank}: {plan} sent {sent} bytes, predicted {predicted}")
        if backend.rank == 0:
            print(f"ok {'+'.join(s.kind for s in plan.steps)} {sent}B", flush=True)


if __name__ == "__main__":
    main()
