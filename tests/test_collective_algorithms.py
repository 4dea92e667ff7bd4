"""Collective algorithms as choices (issue #37): ring, recursive doubling and hierarchical runs
equal the exact collective, their bytes counted at the send calls equal the model's, the chooser
picks the brute-force best, and plans record and run the algorithm they chose."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from autostrat.cost import Hardware
from autostrat.cost.algorithms import ALGORITHMS, algorithm_bytes, algorithm_nanoseconds, choose_algorithm, placement
from autostrat.errors import AutostratError, LayoutError, RuntimeBackendError
from autostrat.layout import DeviceMatrix, Layout, TensorMap
from autostrat.redistribution import plan_redistribution
from autostrat.redistribution.algorithms import with_algorithms
from autostrat.runtime.local import LocalCluster

SIZES = range(2, 9)
# (device_num, devices per server, the group in chunk order): spread evenly over 2..4 servers,
# members of a server not adjacent in the group, and a group that leaves ranks out.
SPREAD = [(4, 2, (0, 2, 1, 3)), (6, 3, (0, 1, 2, 3, 4, 5)), (6, 2, (5, 0, 3, 1, 4, 2)), (8, 4, (4, 0, 5, 1, 6, 2, 7, 3)),
          (8, 2, (0, 1, 2, 3, 4, 5, 6, 7)), (8, 4, (0, 1, 4, 5))]


def _run(device_num: int, group: tuple[int, ...], call):
    """Per member of `group`: ``(result of call(backend), bytes it sent)``."""
    def rank(backend):
        return (call(backend), sum(m.bytes for m in backend.sent)) if backend.rank in group else None
    return {r: found for r, found in enumerate(LocalCluster(device_num).run(rank)) if found is not None}


def _data(group, shape, seed):
    rng = np.random.default_rng(seed)
    return {rank: rng.integers(-50, 50, size=shape).astype(np.float64) for rank in group}  # sums exact in any order


def _placement_of(group, size):
    servers = list(dict.fromkeys(r // size for r in group))
    inside = {s: [r for r in group if r // size == s] for s in servers}
    return {r: (servers.index(r // size), inside[r // size].index(r)) for r in group}, len(servers)


def _cases():
    for g in SIZES:
        for algorithm in ("ring", "doubling"):
            yield g, None, tuple(range(g)), algorithm
    for device_num, size, group in SPREAD:
        yield device_num, size, group, f"hierarchical:{size}"


@pytest.mark.parametrize("op", ["sum", "max"])
def test_allreduce_algorithms_equal_the_exact_reduction_and_send_the_modelled_bytes(op):
    for device_num, size, group, algorithm in _cases():
        data = _data(group, (5, 3), device_num)  # 15 elements: no group size but 3 and 5 divides them
        exact = np.sum if op == "sum" else np.max
        runs = _run(device_num, group, lambda b: b.allreduce(data[b.rank], group, op, algorithm))
        positions, servers = _placement_of(group, size) if size else ({r: group.index(r) for r in group}, 1)
        for rank, (result, sent) in runs.items():
            assert np.array_equal(result, exact(np.stack(list(data.values())), axis=0)), (algorithm, group, rank)
            assert sent == algorithm_bytes("AllReduce", algorithm, len(group), 120, 8, positions[rank], servers), (algorithm, group, rank)
        assert max(sent for _, sent in runs.values()) == algorithm_bytes("AllReduce", algorithm, len(group), 120, 8, None, servers)


def test_hierarchical_allgather_and_reduce_scatter_equal_the_exact_ones_and_the_modelled_bytes():
    for device_num, size, group in SPREAD:
        algorithm, g = f"hierarchical:{size}", len(group)
        data = _data(group, (g, 2), size)
        runs = _run(device_num, group, lambda b: b.allgather(data[b.rank], group, algorithm))
        for result, sent in runs.values():
            assert [p.tolist() for p in result] == [data[r].tolist() for r in group]
            assert sent == algorithm_bytes("AllGather", algorithm, g, data[group[0]].nbytes, 8, None, g // _members(group, size))
        runs = _run(device_num, group, lambda b: b.reduce_scatter(np.split(data[b.rank], g), group, "sum", algorithm))
        total = sum(data.values())
        for rank, (result, sent) in runs.items():
            assert np.array_equal(result, np.split(total, g)[group.index(rank)])
            assert sent == algorithm_bytes("ReduceScatter", algorithm, g, data[group[0]].nbytes, 8, None, g // _members(group, size))


def _members(group, size):
    return sum(1 for r in group if r // size == group[0] // size)


def test_the_ring_and_hierarchical_send_as_many_bytes_and_doubling_more():
    for m, k in [(2, 4), (3, 2), (4, 8)]:
        for kind in ALGORITHMS:
            ring = algorithm_bytes(kind, "ring", m * k, 96 * m * k, 4)
            assert algorithm_bytes(kind, f"hierarchical:{k}", m * k, 96 * m * k, 4, servers=m) == ring
    assert algorithm_bytes("AllReduce", "doubling", 6, 600) == 3 * 600 > algorithm_bytes("AllReduce", "ring", 6, 600)


def _brute_force(model, kind, matrix, axes, local_bytes, itemsize, objective):
    """The best of every algorithm the step can run as, timed one by one."""
    group = matrix.groups(axes)[0]
    found = []
    names = [a for a in ALGORITHMS[kind] if not (objective == "bytes" and a == "doubling")]
    for order, name in enumerate(names):
        spread = placement(model, matrix, axes)
        if name == "hierarchical" and spread is None:
            continue
        algorithm = f"hierarchical:{spread[2]}" if name == "hierarchical" else name
        time = algorithm_nanoseconds(model, kind, algorithm, matrix, axes, local_bytes, itemsize)
        sent = algorithm_bytes(kind, algorithm, len(group), local_bytes, itemsize, None, spread[0] if spread and name == "hierarchical" else 1)
        found.append(((time, sent, order) if objective == "time" else (sent, time, order), algorithm))
    return min(found)[1]


def test_the_chooser_picks_what_brute_force_over_the_algorithms_times_picks():
    chosen = set()
    for devices_per_server, device_num in [(8, 8), (4, 8), (2, 6), (8, 16), (8, 64)]:
        model = Hardware(devices_per_server=devices_per_server).alpha_beta(device_num)
        for shape in [(device_num,), (2, device_num // 2), (device_num // 2, 2)]:
            matrix = DeviceMatrix(shape)
            for axes in [(0,), (1,), (0, 1)][: matrix.ndim * 2 - 1]:
                for kind in ALGORITHMS:
                    for local_bytes in (4 * device_num, 4096 * device_num, 2**22 * device_num):
                        for objective in ("bytes", "time"):
                            best = choose_algorithm(model, kind, matrix, axes, local_bytes, 4, objective)[0]
                            assert best == _brute_force(model, kind, matrix, axes, local_bytes, 4, objective)
                            chosen.add(best.split(":")[0])
    assert chosen == {"ring", "doubling", "hierarchical"}  # every algorithm wins somewhere


def test_plans_record_their_algorithms_and_only_the_time_objective_takes_recursive_doubling():
    src = Layout(DeviceMatrix((2, 4)), TensorMap((-1,)), (64,), partial=(0, 1))
    one_server, two_servers = Hardware().alpha_beta(8), Hardware(devices_per_server=4).alpha_beta(8)
    plan = plan_redistribution(src, src.with_partial(()))
    assert with_algorithms(plan, one_server, "float32", "bytes") == plan  # inside a server the bytes objective keeps rings
    timed = with_algorithms(plan, one_server, "float32", "time")
    assert [s.algorithm for s in timed.steps] == ["doubling"] and timed.cost > plan.cost
    assert timed.nanoseconds(one_server) < plan.nanoseconds(one_server)
    spread = with_algorithms(plan, two_servers, "float32", "bytes")
    assert [s.algorithm for s in spread.steps] == ["hierarchical:4"] and spread.cost == plan.cost
    text = spread.to_text()
    assert "AllReduce(axes (2, 1, 0), 448B, hierarchical:4)" in text and "algorithm=hierarchical:4" in text


def test_a_plan_on_two_servers_runs_its_hierarchical_collectives_with_the_predicted_bytes():
    from autostrat.frontend.config import load_config
    from autostrat.frontend.run import plan_config
    from autostrat.runtime.job import make_job
    from autostrat.runtime.local import run_job_locally

    config = load_config("configs/mlp.yaml", phase="train")
    config = replace(config, context=replace(config.context, devices_per_server=4))
    plan, _ = plan_config(config, 8)
    kinds = {(s.kind, s.algorithm) for e in plan.redistributions for s in e.plan.steps if s.algorithm != "ring"}
    assert ("AllReduce", "hierarchical:4") in kinds and ("AllGather", "hierarchical:4") in kinds
    check = run_job_locally(make_job(plan, 1, 0))
    assert check.bytes_match and check.results_match, check.text


def test_unknown_algorithms_are_refused_by_name():
    with pytest.raises(LayoutError, match="AllToAll has no algorithm 'doubling'"):
        algorithm_bytes("AllToAll", "doubling", 4, 64)
    with pytest.raises(LayoutError, match="needs groups spread evenly over servers of 4"):
        algorithm_nanoseconds(Hardware().alpha_beta(8), "AllReduce", "hierarchical:4", DeviceMatrix((8,)), (0,), 64, 4)
    with pytest.raises(AutostratError, match="'hierarchical:K'"):
        _run(2, (0, 1), lambda b: b.allgather(np.zeros(2), (0, 1), "hierarchical"))
    with pytest.raises(RuntimeBackendError, match="ReduceScatter runs as 'ring' or 'hierarchical:K', got 'doubling'"):
        _run(2, (0, 1), lambda b: b.reduce_scatter([np.zeros(2)] * 2, (0, 1), "sum", "doubling"))
