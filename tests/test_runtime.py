"""The runtime on LocalBackend threads: every built-in config matches the single-device result
and sends exactly the predicted bytes; collectives agree with `redistribution.simulate`."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from autostrat.errors import ConfigError, RuntimeBackendError
from autostrat.frontend.run import RunOptions, fit_seed, prepare_run
from autostrat.layout import DeviceMatrix, Layout, TensorMap, assemble_tensor, split_tensor
from autostrat.redistribution import plan_redistribution, simulate
from autostrat.rules import make_rule
from autostrat.runtime.executor import execute
from autostrat.runtime.job import make_job, run_steps
from autostrat.runtime.local import LocalCluster, run_job_locally
from autostrat.runtime.program import lower_programs, lower_steps
from autostrat.runtime.instructions import Load, Program

CASES = [("ffn", 8), ("mlp", 8), ("gpt", 8), ("resnet", 8), ("ffn", 4), ("mlp", 4), ("gpt", 4), ("resnet", 4),
         ("ffn", 6), ("mlp", 6), ("gpt", 6), ("resnet", 6)]


@pytest.mark.parametrize("config,device_num", CASES, ids=[f"{c}-{n}" for c, n in CASES])
def test_config_matches_single_device_and_predicted_bytes(config, device_num):
    job, _, _ = prepare_run(f"configs/{config}.yaml", RunOptions(device_num=device_num, steps=1))
    check = run_job_locally(job)
    assert check.bytes_match, check.text
    assert check.results_match, check.text


def test_tutorial_has_one_reduce_scatter_of_6144_bytes():
    job, _, _ = prepare_run("configs/ffn.yaml", RunOptions(steps=1))
    forward = [c for c in job.programs[0].communications() if c.phase == "forward"]
    assert [(c.kind, c.edge, c.predicted) for c in forward] == [
        ("ReduceScatter", "dense2.matmul:0 -> dense2.bias_add[0]", 6144)
    ]
    assert "ReduceScatter (forward) sent 6144, predicted 6144" in run_job_locally(job).text


def test_runs_are_deterministic():
    job, _, _ = prepare_run("configs/gpt.yaml", RunOptions(steps=1))
    first = LocalCluster(8).run(lambda backend: execute(job.programs[backend.rank], backend, job.values | job.batches[0]))
    second = LocalCluster(8).run(lambda backend: execute(job.programs[backend.rank], backend, job.values | job.batches[0]))
    for a, b in zip(first, second):
        assert all(np.array_equal(a.outputs[k], b.outputs[k]) for k in a.outputs)


LAYOUT_PAIRS = [
    ((8,), (0, -1), (2, 4), (-1, 0), ()),  # AllToAll across matrices
    ((2, 4), (1, 0), (8,), (-1, -1), ()),  # AllGather
    ((2, 4), (1, -1), (2, 4), (1, 0), (0,)),  # partial -> ReduceScatter
    ((2, 4), (-1, -1), (2, 4), (-1, -1), (0, 1)),  # partial -> AllReduce
    ((2, 4), (1, 0), (2, 4), (0, 1), ()),  # axes swap (all-to-all)
    ((2, 4), ((1, 0), -1), (2, 4), ((0, 1), -1), ()),  # same pieces, other owners: CollectivePermute
    ((4,), (-1, -1), (4,), (0, -1), ()),  # Slice
    ((2, 4), (1, 0), (2, 4), (1, -1), (), (0,)),  # whole -> partial: AllGather, PartialCreate
]


def layout_pair(src_dm, src_tm, dst_dm, dst_tm, partial, dst_partial=()):
    """The plan between a pair's layouts of a [16, 8] tensor and every rank's source piece."""
    shape = (16, 8)
    src = Layout(DeviceMatrix(src_dm), TensorMap(src_tm), shape, partial)
    dst = Layout(DeviceMatrix(dst_dm), TensorMap(dst_tm), shape, dst_partial)
    plan = plan_redistribution(src, dst)
    return plan, split_tensor(np.random.default_rng(1).standard_normal(shape).astype(np.float32), src)


def run_layout_pair(backend, plan, pieces):
    """This rank's result of running `plan` as a program (shared with the MPI script)."""
    rank = backend.rank
    partitions = tuple(dict.fromkeys(s.groups for s in plan.steps if s.kind in ("AllGather", "AllReduce", "AllToAll", "ReduceScatter")))
    load = Load("t", tuple((0, size) for size in pieces[rank].shape))  # the whole piece: it is the rank's slice
    steps = tuple(lower_steps(plan, rank, "t", "u", "edge", "forward", pieces[rank].itemsize))
    program = Program(rank, plan.src.device_num, partitions, (load, *steps), (), (("t", "u" if steps else "t"),))
    return execute(program, backend, {"t": pieces[rank]})


@pytest.mark.parametrize("pair", LAYOUT_PAIRS)
def test_collectives_agree_with_simulation(pair):
    plan, pieces = layout_pair(*pair)
    results = LocalCluster(plan.src.device_num).run(lambda backend: run_layout_pair(backend, plan, pieces))
    expected = simulate(plan, pieces)
    for rank, result in enumerate(results):
        assert np.array_equal(result.outputs["t"], expected[rank])
        assert sum(t.sent for t in result.traffic) == sum(t.predicted for t in result.traffic)
    assert np.allclose(assemble_tensor([r.outputs["t"] for r in results], plan.dst), assemble_tensor(pieces, plan.src))


def test_the_layout_pairs_cover_every_step_kind():
    kinds = {step.kind for pair in LAYOUT_PAIRS for step in layout_pair(*pair)[0].steps}
    assert kinds == {"AllGather", "AllReduce", "AllToAll", "CollectivePermute", "PartialCreate", "ReduceScatter", "Slice"}


def test_a_whole_tensor_made_partial_runs_on_ranks_and_sends_nothing_for_it():
    # Issue #32: the columns are gathered over the 4-axis, then a PartialCreate leaves the sum
    # over that axis on its first rank and zeros on the others. The check slices the tensor by
    # the destination's ranges and sums each partial group's outputs (no planner code).
    matrix = DeviceMatrix((2, 4))
    src = Layout(matrix, TensorMap((1, 0)), (16, 8))
    dst = Layout(matrix, TensorMap((1, -1)), (16, 8), partial=(0,))
    plan = plan_redistribution(src, dst)
    assert [step.kind for step in plan.steps] == ["AllGather", "PartialCreate"]
    x = np.random.default_rng(4).standard_normal((16, 8)).astype(np.float32)
    pieces = [x[tuple(slice(a, b) for a, b in src.slice_range(rank))] for rank in range(8)]
    results = LocalCluster(8).run(lambda backend: run_layout_pair(backend, plan, pieces))
    for group in ((0, 1, 2, 3), (4, 5, 6, 7)):
        want = x[tuple(slice(a, b) for a, b in dst.slice_range(group[0]))]
        assert np.array_equal(sum(results[rank].outputs["t"] for rank in group), want)
        assert [bool(results[rank].outputs["t"].any()) for rank in group] == [True, False, False, False]
    created = [t for result in results for t in result.traffic if t.kind == "PartialCreate"]
    assert len(created) == 8 and all(t.sent == t.predicted == 0 and t.peers == () for t in created)
    assert all(sum(t.sent for t in result.traffic) == sum(t.predicted for t in result.traffic) == 3 * 16 * 8 * 4 // 8 for result in results)  # the gather alone


def test_a_partial_create_of_an_op_it_cannot_start_is_refused():
    from autostrat.errors import RuntimeBackendError
    from autostrat.runtime.stream import create_partial

    with pytest.raises(RuntimeBackendError, match=r"a PartialCreate needs a partial op among max, min, sum, got 'prod'"):
        create_partial(np.ones(2), "prod", 1)


def test_a_failing_rank_is_named():
    def fail_on_rank_2(backend):
        if backend.rank == 2:
            raise ValueError("bad slice")
        return backend.allgather(np.zeros(1), (0, 1, 2, 3))

    with pytest.raises(RuntimeBackendError, match="rank 2: ValueError: bad slice"):
        LocalCluster(4, timeout=10).run(fail_on_rank_2)


def test_wrong_rank_count_fails_before_any_collective():
    job, _, _ = prepare_run("configs/ffn.yaml", RunOptions(steps=1))
    with pytest.raises(RuntimeBackendError, match="is for device_num 8 but 4 ranks are running"):
        LocalCluster(4).run(lambda backend: run_steps(job, backend))


def test_a_plan_for_another_graph_is_rejected():
    from dataclasses import replace

    from autostrat.frontend.api import plan_for
    from autostrat.frontend.config import load_config

    config = load_config("configs/mlp.yaml")
    plan = plan_for(config.net, config.inputs, config.context, config.strategies)
    mixed = replace(plan, ops={**plan.ops, "layers.0.matmul": plan.ops["layers.1.matmul"]})
    with pytest.raises(RuntimeBackendError, match="op layers.0.matmul: the plan's strategy is for MatMul on"):
        lower_programs(mixed)
    with pytest.raises(RuntimeBackendError, match="ops without a strategy"):
        lower_programs(replace(plan, ops={k: v for k, v in plan.ops.items() if k != "layers.0.matmul"}))


def test_seeds_are_scaled_to_the_device_count():
    rule = make_rule("MatMul", [(64, 64), (64, 64)])
    assert fit_seed(rule, ((1, 8), (8, 1)), None, 8, 4) == (((1, 4), (4, 1)), None)
    assert fit_seed(rule, ((2, 1), (1, 4)), None, 8, 8) == (((2, 1), (1, 4)), None)


def test_make_job_rejects_a_fault_outside_the_ranks():
    from autostrat.runtime.job import Fault

    job, _, _ = prepare_run("configs/ffn.yaml", RunOptions(steps=1))
    assert job.fault is None
    with pytest.raises(ConfigError, match="a fault is a rank below 8"):
        make_job(job_plan(), fault=Fault(9, "kill", 0))


def job_plan():
    from autostrat.frontend.api import plan_for
    from autostrat.frontend.config import load_config

    config = load_config("configs/ffn.yaml")
    return plan_for(config.net, config.inputs, config.context, config.strategies)


def test_a_training_run_checks_every_loss_and_the_final_parameters():
    """A training config's steps carry the parameters and Adam state on; the check covers them,
    and a wrong final value (one element of one moment) makes it fail."""
    job, _, _ = prepare_run("configs/gpt_train.yaml", RunOptions(backend="local", steps=3))
    check = run_job_locally(job)
    assert check.ok, check.text
    assert "3 training step(s)" in check.text and "sync predicted" in check.text
    assert "the final parameters and optimiser state" in check.text
    final = dict(job.final)
    final["moment1.blocks.0.ffn1.weight"] = final["moment1.blocks.0.ffn1.weight"].copy()
    final["moment1.blocks.0.ffn1.weight"][0, 0] += 1.0
    assert not run_job_locally(replace(job, final=final)).results_match
