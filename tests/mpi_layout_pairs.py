"""Run under mpiexec: every layout pair of `test_runtime.LAYOUT_PAIRS` whose device count is the
world size, on `MpiBackend`, compared with `redistribution.simulate` on every rank. Rank 0 prints
one line per pair, then the pairs again with other collective algorithms (`run_algorithms`); any
mismatch raises (and `python -m mpi4py` aborts the job)."""

from __future__ import annotations

import numpy as np

from autostrat.cost import Hardware
from autostrat.redistribution import simulate
from autostrat.redistribution.algorithms import with_algorithms
from autostrat.runtime.mpi import MpiBackend
from tests.test_runtime import LAYOUT_PAIRS, layout_pair, run_layout_pair


def main() -> None:
    backend = MpiBackend()
    for pair in LAYOUT_PAIRS:
        plan, pieces = layout_pair(*pair)
        if plan.src.device_num != backend.device_num:
            continue
        sent = check_pair(backend, plan, plan, pieces, np.array_equal)
        if backend.rank == 0:
            print(f"ok {'+'.join(s.kind for s in plan.steps)} {sent}B", flush=True)
    run_algorithms(backend)


def check_pair(backend, run, plan, pieces, same) -> int:
    """Run `run` (`plan` or the same steps with other algorithms) on `pieces`; raise unless this
    rank's result is `same` as `plan`'s simulation and it sent the bytes predicted. Its bytes."""
    result = run_layout_pair(backend, run, pieces)
    if not same(result.outputs["t"], simulate(plan, pieces)[backend.rank]):
        raise AssertionError(f"rank {backend.rank}: {run} gave another piece than the simulation")
    sent, predicted = sum(t.sent for t in result.traffic), sum(t.predicted for t in result.traffic)
    if sent != predicted:
        raise AssertionError(f"rank {backend.rank}: {run} sent {sent} bytes, predicted {predicted}")
    return sent


def run_algorithms(backend) -> None:
    """The same pairs with every collective as the time objective chooses it on 2 servers:
    recursive doubling and hierarchical steps, their sums in another order (so close, not equal),
    their bytes as predicted. Rank 0 prints one "ok algorithms" line per pair that changed."""
    model = Hardware(devices_per_server=backend.device_num // 2).alpha_beta(backend.device_num)
    for pair in LAYOUT_PAIRS:
        plan, pieces = layout_pair(*pair)
        if plan.src.device_num != backend.device_num or (chosen := with_algorithms(plan, model, "float32", "time")) == plan:
            continue
        sent = check_pair(backend, chosen, plan, pieces, lambda a, b: np.allclose(a, b, rtol=1e-5, atol=1e-6))
        if backend.rank == 0:
            print(f"ok algorithms {'+'.join(f'{s.kind}/{s.algorithm}' for s in chosen.steps)} {sent}B", flush=True)
    group = tuple(range(backend.device_num - 1))  # 3 or 7 ranks: recursive doubling's one-way fold-in messages
    if backend.rank in group:
        reduced = backend.allreduce(np.arange(5.0) * (backend.rank + 1), group, "sum", "doubling")
        if not np.array_equal(reduced, np.arange(5.0) * sum(rank + 1 for rank in group)):
            raise AssertionError(f"rank {backend.rank}: recursive doubling over {group} gave {reduced}")
    if backend.rank == 0:
        print(f"ok algorithms AllReduce/doubling over {len(group)} ranks", flush=True)


if __name__ == "__main__":
    main()
