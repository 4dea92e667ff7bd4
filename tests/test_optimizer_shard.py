"""Optimizer sharding (MindSpore's parallel optimizer, ZeRO 1-2): the shard layout, its pricing
in the search, training equal to one device with measured = predicted bytes, checkpoints that
record it and load under another setting, and the context/YAML/CLI keys."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from autostrat import reset_auto_parallel_context, set_auto_parallel_context
from autostrat.autodiff import Adam, Momentum
from autostrat.cli import main
from autostrat.errors import ConfigError
from autostrat.frontend.config import load_config
from autostrat.frontend.run import plan_config
from autostrat.frontend.train import synthetic_batches, training_plan
from autostrat.layout import DeviceMatrix, Layout, TensorMap
from autostrat.models import FFN
from autostrat.runtime.checkpoint import load_checkpoint, save_checkpoint
from autostrat.runtime.executor import graph_values
from autostrat.runtime.training import reference_graph, train_locally, train_single_device
from autostrat.search.checkpoint import checkpoint_dict
from autostrat.search.optimizer_shard import OptimizerShard
from autostrat.search.problem import build_problem, searched_graph

ROOT = Path(__file__).resolve().parent.parent
ANY_SIZE = {"parallel_optimizer_threshold": 0}


def _layout(matrix, tensor_map, shape=(64, 32)):
    return Layout(DeviceMatrix(matrix), TensorMap(tensor_map), shape)


def test_a_replicated_weight_is_split_over_all_its_replicas_by_default():
    shard = OptimizerShard(threshold_bytes=0)
    assert shard.layout(_layout((8,), (-1, -1)), "float32").slice_shape == (8, 32)
    # Rows split 2 ways, 4 replicas each: the rows split 8 ways.
    assert shard.layout(_layout((2, 4), (1, -1)), "float32").slice_shape == (8, 32)
    # No replica: nothing to share.
    split = _layout((2, 4), (1, 0))
    assert shard.layout(split, "float32") is split


def test_the_shard_size_takes_the_innermost_replicas():
    updated = OptimizerShard(shard_size=2, threshold_bytes=0).layout(_layout((2, 4), (1, -1)), "float32")
    assert updated.slice_shape == (16, 32)
    stored = _layout((2, 4), (1, -1))
    for rank in range(8):  # partners differ by one rank (the inner axis), and stay inside the stored slice
        low, high = stored.slice_range(rank)[0]
        part_low, part_high = updated.slice_range(rank)[0]
        assert low <= part_low < part_high <= high
        assert updated.shard_index(rank) != updated.shard_index(rank ^ 1)


def test_small_and_indivisible_parameters_stay_whole_per_replica():
    stored = _layout((8,), (-1, -1), (4, 32))  # 4 rows cannot split 8 ways
    assert OptimizerShard(threshold_bytes=0).layout(stored, "float32") is stored
    big = _layout((8,), (-1, -1))
    assert OptimizerShard().layout(big, "float32") is big  # 8 KB < the 64 KB default threshold
    assert OptimizerShard(threshold_bytes=8192).layout(big, "float32") is not big


@pytest.mark.parametrize("config, message", [
    ({"optimizer_level": "level4"}, "level4"),
    ({"optimizer_weight_shard_size": 0}, "optimizer_weight_shard_size"),
    ({"parallel_optimizer_threshold": -1}, "parallel_optimizer_threshold"),
    ({"shard": 2}, "unknown key 'shard'"),
])
def test_bad_parallel_optimizer_configs_are_refused_by_key(config, message):
    with pytest.raises(ConfigError, match=message):
        set_auto_parallel_context(enable_parallel_optimizer=True, parallel_optimizer_config=config)
    reset_auto_parallel_context()


def test_a_shard_size_the_replicas_cannot_make_is_refused():
    with pytest.raises(ConfigError, match="innermost replica axes"):
        OptimizerShard(shard_size=3, threshold_bytes=0).layout(_layout((8,), (-1, -1)), "float32")


def _plan(net, optimizer, zero: bool, device_num: int = 8, steps: int = 3):
    set_auto_parallel_context(parallel_mode="auto_parallel", device_num=device_num, enable_parallel_optimizer=zero,
                              parallel_optimizer_config=ANY_SIZE)
    try:
        return training_plan(net, optimizer, steps=steps)
    finally:
        reset_auto_parallel_context()


def _config_plan(name: str, zero: bool, steps: int = 3):
    """A shipped training config's plan (its optimiser and seeds), with or without sharding."""
    config = load_config(ROOT / "configs" / f"{name}.yaml", enable_parallel_optimizer=zero, parallel_optimizer_config=ANY_SIZE)
    plan, _ = plan_config(config)
    return plan, graph_values(plan.graph, {}), synthetic_batches(plan.graph, steps)


def _ffn():
    net = FFN()
    net.dense1.matmul.shard(((2, 1), (1, 4)))
    return net


CASES = {"ffn-adam": lambda zero: _plan(_ffn(), Adam(1e-3), zero),
         "ffn-momentum": lambda zero: _plan(_ffn(), Momentum(0.01, 0.9), zero),
         "transformer_stack": lambda zero: _config_plan("transformer_stack", zero),
         "gpt_train": lambda zero: _config_plan("gpt_train", zero)}


def _assert_same_training(run, alone) -> None:
    """Losses, parameters and optimiser state (assembled from their shards) equal one device's
    within 1e-5 of each tensor's scale (float32 sums in another order differ in the last bits)."""
    np.testing.assert_allclose(run.losses, alone.losses, rtol=1e-5)
    for name, want in alone.parameters.items():
        scale = max(1.0, float(np.max(np.abs(want))))
        np.testing.assert_allclose(run.parameters[name], want, rtol=0, atol=1e-5 * scale, err_msg=name)


@pytest.mark.parametrize("case", list(CASES))
def test_sharded_training_equals_one_device_with_the_predicted_bytes(case):
    plain, _, _ = CASES[case](False)
    sharded, values, batches = CASES[case](True)
    run, alone = train_locally(sharded, values, batches), train_single_device(reference_graph(sharded), values, batches)
    _assert_same_training(run, alone)
    assert run.bytes_match, (run.predicted[0], run.measured[0])
    sharded_updates = [op for name, op in sharded.ops.items() if "optimizer shard of" in op.origin]
    assert sharded_updates
    # The state shrinks, and the gradient sync turns into ReduceScatters plus gathers afterwards.
    assert sharded.prediction.peak_bytes < plain.prediction.peak_bytes
    phases, before = sharded.phase_bytes(), plain.phase_bytes()
    assert phases["sync"] < before["sync"] and phases["update"] > before["update"]


def test_the_search_prices_the_sharded_plan_it_returns():
    # The problem's cost of the plan's choice (gradient ReduceScatters into the shard layouts,
    # the parameters' gathers as their first readers' own cost) is what the plan sends.
    plan, _, _ = _config_plan("transformer_stack", True)
    problem = build_problem(plan.graph, 8, allow_repeated=True, optimizer_shard=plan.optimizer_shard)
    core, _ = searched_graph(plan.graph)
    choice = {name: problem.candidates[name].index(plan.ops[name].strategy) for name in core.ops}
    assert problem.cost(choice, shared=True) == plan.total_bytes


def test_the_strategy_checkpoint_records_the_optimizer_shard():
    plan, _, _ = _plan(_ffn(), Adam(1e-3), True)
    layouts = checkpoint_dict(plan)["parallel_layout_item"]
    weight = layouts["dense1.weight"]  # split (1, 4): 2 replicas, on ranks 4 apart
    assert (weight["opt_weight_shard_size"], weight["opt_weight_shard_step"]) == (2, 4)
    plain, _, _ = _plan(_ffn(), Adam(1e-3), False)
    assert all(item["opt_weight_shard_size"] == 0 for item in checkpoint_dict(plain)["parallel_layout_item"].values())


def assert_the_ffn_continues_plain_on_4_ranks(sharded, values, batches, path) -> None:
    """Train the FFN's `sharded` plan (Adam, 8 ranks), save its checkpoint at `path`, and
    continue it unsharded on 4 ranks: equal to one device throughout."""
    save_checkpoint(train_locally(sharded, values, batches), path)
    set_auto_parallel_context(parallel_mode="auto_parallel", device_num=4)
    try:
        net = FFN()
        net.dense1.matmul.shard(((2, 1), (1, 2)))
        plain, resumed, more = training_plan(net, Adam(1e-3), steps=2, seed=1, initial=load_checkpoint(path))
    finally:
        reset_auto_parallel_context()
    second = train_locally(plain, resumed, more)
    alone = train_single_device(reference_graph(sharded), values, batches)
    alone = train_single_device(reference_graph(plain), {**resumed, **alone.parameters}, more)
    _assert_same_training(second, alone)


def test_a_checkpoint_saved_sharded_on_8_ranks_continues_plain_on_4(tmp_path):
    assert_the_ffn_continues_plain_on_4_ranks(*_plan(_ffn(), Adam(1e-3), True, steps=2), tmp_path / "zero.npz")


def test_yaml_and_the_command_line_turn_it_on(tmp_path, capsys):
    text = (ROOT / "configs" / "gpt_train.yaml").read_text() + "parallel_optimizer_config: {parallel_optimizer_threshold: 0}\n"
    (tmp_path / "off.yaml").write_text(text)
    (tmp_path / "on.yaml").write_text(text + "enable_parallel_optimizer: true\n")
    assert load_config(tmp_path / "on.yaml").context.search_options().optimizer_shard.threshold_bytes == 0
    assert load_config(tmp_path / "off.yaml").context.search_options().optimizer_shard is None

    def search(*args):
        assert main(["search", *args]) == 0
        return capsys.readouterr().out

    assert "optimizer shard of" in search(str(tmp_path / "on.yaml"))
    assert "optimizer shard of" in search(str(tmp_path / "off.yaml"), "--parallel-optimizer")
    assert "optimizer shard of" not in search(str(tmp_path / "off.yaml"))


def test_sharded_training_on_8_mpi_ranks(tmp_path):
    # (the transformer stack runs sharded on MPI ranks with recompute: tests/test_recompute.py)
    from tests.test_mpi import assert_nothing_left, run

    path = tmp_path / "gpt_train.yaml"
    path.write_text((ROOT / "configs" / "gpt_train.yaml").read_text() + "parallel_optimizer_config: {parallel_optimizer_threshold: 0}\n")
    code, out, err, run_dir, _ = run(tmp_path, str(path), "--device-num", "8", "--steps", "2", "--parallel-optimizer")
    assert code == 0, err
    assert "bytes: measured = predicted on every rank" in out and ": OK" in out
    assert "ReduceScatter (sync)" in out and "(update)" in out  # gradients scattered, parameters gathered back
    assert_nothing_left(run_dir, 8)
