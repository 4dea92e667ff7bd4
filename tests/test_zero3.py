"""ZeRO-3 (``optimizer_level: level3``): parameters may rest sharded between steps, gathered for
each op reading them; the search decides it per parameter. Checked against brute force over
every storage choice, against the plan's own bytes and peak, and by training against one device."""

from __future__ import annotations

import itertools
from dataclasses import replace
from pathlib import Path

from autostrat import reset_auto_parallel_context, set_auto_parallel_context
from autostrat.autodiff import Adam, Momentum, build_training
from autostrat.frontend import trace
from autostrat.frontend.config import apply_seeds
from autostrat.frontend.train import training_plan
from autostrat.models import FFN
from autostrat.nn import Tensor
from autostrat.runtime.training import reference_graph, train_locally, train_single_device
from autostrat.search.memory import peak_bytes
from autostrat.search.optimizer_shard import OptimizerShard
from autostrat.search.plan import build_plan
from autostrat.search.prediction import plan_peak_bytes
from autostrat.search.problem import build_problem
from autostrat.search.propagate import propagate
from autostrat.search.refine import refine
from autostrat.search.search import follow_parameters
from tests.test_memory_measured import assert_peaks_match
from tests.test_optimizer_shard import _assert_same_training, assert_the_ffn_continues_plain_on_4_ranks

ROOT = Path(__file__).resolve().parent.parent
LEVEL3 = OptimizerShard("level3", threshold_bytes=0)


def _ffn_training():
    net = FFN()
    net.dense1.matmul.shard(((2, 1), (1, 4)))
    return build_training(trace(net, Tensor(shape=(64, 64)), device_num=8), Momentum(0.01, 0.9))


def test_first_readers_also_get_their_candidates_with_parameters_at_rest():
    graph = _ffn_training()
    problem = build_problem(graph, 8, optimizer_shard=LEVEL3)
    plain = build_problem(graph, 8, optimizer_shard=OptimizerShard("level1", threshold_bytes=0))
    assert not any(s.at_rest for candidates in plain.candidates.values() for s in candidates)
    for op in ("dense1.matmul", "dense1.bias_add", "dense2.matmul", "dense2.bias_add"):
        base, extended = plain.candidates[op], problem.candidates[op]
        assert extended[: len(base)] == base  # the seed and the enumeration order stay first
        variants = extended[len(base):]
        assert variants and all(s.at_rest == (1,) and replace(s, at_rest=()) in base for s in variants)
    assert all(not s.at_rest for s in problem.candidates["relu"])


def test_propagation_keeps_parameters_at_rest_only_where_it_costs_nothing():
    graph = _ffn_training()
    problem = build_problem(graph, 8, optimizer_shard=LEVEL3)
    plain = build_problem(graph, 8, optimizer_shard=OptimizerShard("level1", threshold_bytes=0))
    resting, whole = propagate(problem), propagate(plain)
    rested = {op for op, index in resting.choice.items() if problem.candidates[op][index].at_rest}
    # dense2.weight is read again by the backward (dense1's output gradient): a second gather
    # would cost bytes. The first layer's weight and the biases are read once.
    assert rested == {"dense1.matmul", "dense1.bias_add", "dense2.bias_add"}
    assert all("parameters at rest (no extra cost)" in resting.origin[op] for op in rested)
    assert problem.cost(resting.choice) == plain.cost(whole.choice)
    assert peak_bytes(problem, resting.choice) < peak_bytes(plain, whole.choice)


def _storage_problem():
    """The FFN's training step with every op seeded as BFS plans it (those that can be), so that
    the only choices left are where the first readers' parameters rest: 2^4 plans."""
    graph = _ffn_training()
    problem = build_problem(graph, 8, optimizer_shard=LEVEL3)
    seeds = {}
    for op, index in propagate(problem).choice.items():
        strategy = problem.candidates[op][index]
        if not strategy.sums_partials:
            seeds[op] = (strategy.to_tuples(), strategy.out_tuples())
    seeded = apply_seeds(graph, seeds, 8)
    return seeded, build_problem(seeded, 8, optimizer_shard=LEVEL3)


def test_the_budgeted_optimum_is_the_brute_force_one_over_every_storage_choice():
    _, problem = _storage_problem()
    free = [op for op, candidates in problem.candidates.items() if len(candidates) > 1]
    assert len(free) == 4
    fixed = {op: 0 for op in problem.candidates}
    plans = []
    for picks in itertools.product(*(range(len(problem.candidates[op])) for op in free)):
        choice = fixed | dict(zip(free, picks))
        plans.append((problem.cost(choice), peak_bytes(problem, choice), choice))
    peaks = sorted({peak for _, peak, _ in plans})
    assert len(peaks) > 4  # each parameter at rest holds less
    # A gather per use replaces the gather after the update: free for a weight read once (the
    # first layer's: no input gradient), dearer for one the backward reads again.
    assert all(cost >= plans[0][0] for cost, _, _ in plans) and any(cost > plans[0][0] for cost, _, _ in plans)
    for budget in peaks[:-1:2]:
        best = min(cost for cost, peak, _ in plans if peak <= budget)
        result = refine(problem, fixed, time_limit=30, max_device_memory=budget)
        assert result.status == "OPTIMAL" and result.objective == best
        assert peak_bytes(problem, result.choice) <= budget


def _ffn_plan(budget: int | None = None, level: str = "level3"):
    """The tutorial FFN's training step (Adam) on 8 devices with optimizer sharding at `level`
    under `budget` (small enough for CP-SAT to prove every plan)."""
    set_auto_parallel_context(parallel_mode="auto_parallel", device_num=8, enable_parallel_optimizer=True,
                              parallel_optimizer_config={"parallel_optimizer_threshold": 0, "optimizer_level": level},
                              max_device_memory=budget)
    try:
        net = FFN()
        net.dense1.matmul.shard(((2, 1), (1, 4)))
        return training_plan(net, Adam(1e-3), steps=2)
    finally:
        reset_auto_parallel_context()


BUDGET = 50_000  # below every plan keeping the FFN's parameters whole (ZeRO-1's best: 53,848)


def test_without_a_budget_only_parameters_read_once_rest_sharded():
    plan, _, _ = _ffn_plan()
    plain, _, _ = _ffn_plan(level="level1")
    assert plan.resting == {"dense1.weight", "dense1.bias", "dense2.bias"} and not plain.resting
    assert plan.total_bytes == plain.total_bytes and plan.prediction.peak_bytes < plain.prediction.peak_bytes
    assert plain.prediction.peak_bytes > BUDGET
    # Resting sharded changes no gradient sum (gradients_mean=False): the devices computing with
    # one slice of dense1.weight are still 2, though each holds an eighth of it at rest.
    assert {p: plan.replicas(p) for p in plan.resting} == {p: plain.replicas(p) for p in plan.resting}
    assert plan.replicas("dense1.weight") == 2 > len(plan.layouts["dense1.weight"].replica_groups()[0])


def test_a_budget_makes_parameters_rest_sharded_and_training_still_equals_one_device():
    plan, values, batches = _ffn_plan(BUDGET)
    assert plan.resting and plan.refinement.result.status == "OPTIMAL"
    assert plan.prediction.peak_bytes <= BUDGET
    assert plan.phase_bytes()["gather"] > 0
    origins = [op.origin for op in plan.ops.values() if "at rest (ZeRO-3)" in op.origin]
    assert len(origins) == len(plan.resting)
    resting_in_json = [(op["name"], op["at_rest"]) for op in plan.to_dict()["ops"] if "at_rest" in op]
    assert len(resting_in_json) == len(plan.resting) and all(at == [1] for _, at in resting_in_json)
    run, alone = train_locally(plan, values, batches), train_single_device(reference_graph(plan), values, batches)
    _assert_same_training(run, alone)
    assert run.bytes_match
    assert_peaks_match(run, "FFN with parameters at rest")


def test_the_problem_prices_and_holds_what_the_plan_with_parameters_at_rest_does():
    graph, problem = _storage_problem()
    plans = []
    for choice in ({op: len(c) - 1 for op, c in problem.candidates.items()}, {op: 0 for op in problem.candidates}):
        strategies = {op: problem.candidates[op][index] for op, index in choice.items()}
        origins = dict.fromkeys(strategies, "test")
        for name, (strategy, origin) in follow_parameters(graph, strategies, 8, LEVEL3).items():
            strategies[name], origins[name] = strategy, origin
        plan = build_plan(graph, 8, "auto_parallel", strategies, origins, (), optimizer_shard=LEVEL3)
        assert problem.cost(choice, shared=True) == plan.total_bytes
        assert peak_bytes(problem, choice) == plan_peak_bytes(plan) == plan.prediction.model_peak_bytes
        plans.append(plan)
    resting, whole = plans
    assert len(resting.resting) == 4 and not whole.resting
    assert resting.prediction.peak_bytes < whole.prediction.peak_bytes
    assert resting.phase_bytes()["update"] == 0 < whole.phase_bytes()["update"]  # no gather back after the update


_FFN_YAML = f"""\
parallel_mode: auto_parallel
device_num: 8
optimizer: {{name: adam, learning_rate: 0.001}}
model: {{name: FFN}}
inputs: [{{shape: [64, 64]}}]
strategies: {{dense1.matmul: [[2, 1], [1, 4]]}}
enable_parallel_optimizer: true
parallel_optimizer_config: {{parallel_optimizer_threshold: 0, optimizer_level: level3}}
max_device_memory: {BUDGET}
"""


def test_parameters_at_rest_on_8_mpi_ranks(tmp_path):
    from tests.test_mpi import assert_nothing_left, run

    path = tmp_path / "ffn.yaml"
    path.write_text(_FFN_YAML)
    code, out, err, run_dir, _ = run(tmp_path, str(path), "--device-num", "8", "--steps", "2")
    assert code == 0, err
    assert "bytes: measured = predicted on every rank" in out and ": OK" in out
    assert "AllGather (gather)" in out  # parameters gathered from where they rest
    assert_nothing_left(run_dir, 8)


def test_a_checkpoint_saved_with_parameters_at_rest_continues_plain_on_4_ranks(tmp_path):
    resting, values, batches = _ffn_plan(BUDGET)
    assert "dense1.weight" in resting.resting
    assert_the_ffn_continues_plain_on_4_ranks(resting, values, batches, tmp_path / "zero3.npz")
