"""A MindSpore script's names (issue #18, part 1): ``import autostrat as ms`` gives what the
parallel subset of MindSpore's API uses, with MindSpore's meaning; the tutorial script, with
only its imports changed, trains on threads and on MPI ranks and checks itself against one
device (``AUTOSTRAT_CHECK=1``)."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

import autostrat as ms
import autostrat.dataset as ds
from autostrat import nn
from autostrat.common.initializer import Constant, Normal, One, Zero, initializer
from autostrat.errors import CheckpointError, ConfigError
from autostrat.frontend import mindspore_keys, ms_context
from autostrat.models import FFN

ROOT = Path(__file__).resolve().parent.parent
TUTORIAL = ROOT / "sample_code" / "mindspore_tutorial"


@pytest.fixture(autouse=True)
def _clean():
    yield
    ms.reset_auto_parallel_context()
    ms_context.reset_context()
    mindspore_keys.forget_warnings()  # what warn_once said, for both contexts


def test_the_names_a_script_imports_are_there():
    for name in ("Tensor", "Parameter", "float16", "float32", "int32", "int64", "set_context", "GRAPH_MODE", "ParallelMode",
                 "set_auto_parallel_context", "set_seed", "save_checkpoint", "load_checkpoint", "load_param_into_net",
                 "Model", "LossMonitor", "nn", "ops", "dataset", "communication", "context", "train"):
        assert getattr(ms, name) is not None, name
    assert ms.Tensor(np.ones(3), ms.float32).dtype == "float32"
    assert ms.ParallelMode.AUTO_PARALLEL == "auto_parallel"
    from autostrat.train.callback import LossMonitor
    assert LossMonitor is ms.LossMonitor
    with pytest.raises(AttributeError, match="no attribute 'Tensr'"):
        ms.Tensr


def test_initializers_mean_what_mindspore_means():
    ms.set_seed(3)
    normal = initializer(Normal(sigma=0.5, mean=2.0), (4000,), ms.float32).make()
    assert abs(normal.mean() - 2.0) < 0.05 and abs(normal.std() - 0.5) < 0.05
    assert initializer(One(), [2]).make().tolist() == [1.0, 1.0] and initializer(Zero(), [1]).make().tolist() == [0.0]
    assert initializer(Constant(7), [2], ms.float16).make().dtype == np.float16 and initializer(2.5, [1]).make()[0] == 2.5
    assert ms.Parameter(initializer("uniform", [100])).asnumpy().max() <= 0.07
    with pytest.raises(ConfigError, match="expected a name such as 'normal'"):
        initializer("gaussian", [2])


def test_dense_means_what_mindspore_means():
    """nn.Dense holds weight [out, in] and transposes it in its MatMul, so a MindSpore strategy
    for it splits the same dims here: ((1, 1), (4, 1)) cuts the weight's rows, the output's columns."""
    dense = nn.Dense(3, 2)
    assert dense.weight.shape == (2, 3) and dense.bias.shape == (2,) and dense.matmul.attrs == {"transpose_b": True}
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    expected = x @ dense.weight.asnumpy().T + dense.bias.asnumpy()
    np.testing.assert_allclose(dense(ms.Tensor(x)).asnumpy(), expected, rtol=1e-6)
    ms.set_auto_parallel_context(parallel_mode="semi_auto_parallel", device_num=4)
    wide = nn.Dense(64, 32)
    wide.matmul.shard(((1, 1), (4, 1)))
    plan = ms.parallelize(wide, ms.Tensor(shape=(16, 64)))
    assert plan.layouts["weight"].slice_shape == (8, 64) and plan.layouts["matmul:0"].slice_shape == (16, 8)


def test_set_context_acts_on_save_graphs_and_warns_once_per_key_it_cannot_act_on(tmp_path):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ms.set_context(mode=ms.GRAPH_MODE, device_target="Ascend", save_graphs=2, save_graphs_path=str(tmp_path / "ir"))
        ms.set_context(device_target="GPU")
    assert [str(w.message).split("=")[0] for w in caught] == ["set_context: device_target"]
    ms.set_auto_parallel_context(parallel_mode="AUTO_PARALLEL", device_num=8)  # MindSpore's spelling
    net = FFN()
    net.dense1.matmul.shard(((2, 1), (1, 4)))
    ms.parallelize(net, ms.Tensor(shape=(64, 64)))
    assert (tmp_path / "ir" / "rank_0" / "step_parallel_begin_0000.ir").exists()
    with pytest.raises(ConfigError, match="set_context: unknown key 'save_graph'"):
        ms.set_context(save_graph=True)


def test_mindspore_context_keys_map_onto_autostrat_ones(tmp_path):
    ms.set_auto_parallel_context(dataset_strategy="full_batch", parameter_broadcast=True,
                                 strategy_ckpt_config={"save_file": str(tmp_path / "s.json"), "only_trainable_params": False})
    assert ms.get_auto_parallel_context("full_batch") is True
    assert ms.get_auto_parallel_context("strategy_ckpt_save_file") == str(tmp_path / "s.json")
    with pytest.raises(ConfigError, match="a per-input strategy tuple is not supported"):
        ms.set_auto_parallel_context(dataset_strategy=((8, 1), (8,)))
    with pytest.raises(ConfigError, match="strategy_ckpt_config takes the keys"):
        ms.set_auto_parallel_context(strategy_ckpt_config={"save": "x"})


def test_datasets_batch_like_mindspore():
    rows = ds.GeneratorDataset(lambda: ((np.float32(i), np.int32(i % 2)) for i in range(5)), ["x", "y"]).batch(2)
    assert [tuple(a.tolist() for a in batch) for batch in rows] == [([0.0, 1.0], [0, 1]), ([2.0, 3.0], [0, 1]), ([4.0], [0])]
    assert rows.get_dataset_size() == 3
    class Source:
        def __getitem__(self, index):
            return np.full(2, index), index
        def __len__(self):
            return 3
    assert [row[1].tolist() for row in ds.GeneratorDataset(Source(), ["a", "b"])] == [0, 1, 2]
    slices = ds.NumpySlicesDataset({"a": np.arange(4), "b": np.arange(4) * 10}, shuffle=False)
    assert slices.column_names == ["a", "b"] and [b[1].tolist() for b in slices.batch(4)] == [[0, 10, 20, 30]]
    assert isinstance(next(slices.create_tuple_iterator(output_numpy=False))[0], ms.Tensor)
    with pytest.raises(ConfigError, match="columns of one length"):
        ds.NumpySlicesDataset((np.arange(3), np.arange(4)))


def test_checkpoints_of_a_cell_round_trip(tmp_path):
    net = FFN()
    ms.save_checkpoint(net, tmp_path / "ffn.npz")
    other = FFN()
    loaded = ms.load_checkpoint(tmp_path / "ffn.npz", other)
    assert isinstance(loaded["dense1.weight"], ms.Parameter)
    assert np.array_equal(other.dense1.weight.asnumpy(), net.dense1.weight.asnumpy())
    assert ms.load_param_into_net(other, {"dense1.bias": loaded["dense1.bias"], "nothing": loaded["dense1.bias"]}) == (
        ["dense1.weight", "dense2.weight", "dense2.bias"], ["nothing"])
    with pytest.raises(CheckpointError, match=r"load_param_into_net: dense1.bias of FFN is \[64\] float32, the checkpoint.s is \[3\] float32"):
        ms.load_param_into_net(other, {"dense1.bias": np.zeros(3, np.float32)})


def test_model_train_accepts_sink_mode_with_a_warning():
    ms.set_auto_parallel_context(parallel_mode="data_parallel", device_num=2)
    net = FFN()
    data = ds.NumpySlicesDataset((np.ones((4, 64), np.float32), np.zeros(4, np.int32)), shuffle=False).batch(2)
    model = ms.Model(net, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"), nn.Momentum(net.trainable_params(), 0.1, 0.9))
    with pytest.warns(UserWarning, match="dataset_sink_mode and sink_size are accepted and have no effect"):
        model.train(1, data, dataset_sink_mode=True)


def test_the_tutorial_script_trains_on_threads_and_checks_itself(tmp_path):
    env = os.environ | {"AUTOSTRAT_CHECK": "1", "RANK_SIZE": "8"}
    done = subprocess.run([sys.executable, str(TUTORIAL / "train.py")], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "epoch: 2 step: 4, loss is" in done.stdout and "measured = predicted on every rank" in done.stdout
    assert "(limit 1e-05): OK" in done.stdout
    assert (tmp_path / "graphs" / "rank_0" / "step_parallel_end_0001.ir").exists()  # save_graphs=2
    ir = (tmp_path / "graphs" / "rank_0" / "step_parallel_begin_0000.ir").read_text()
    # MindSpore's IR shows the seed among the primitive's attributes and the source line of each op.
    assert "primitive_attrs: {in_strategy: ((2, 1), (1, 4))}" in ir and "# In file train.py:32" in ir


@pytest.mark.slow
def test_the_tutorial_script_runs_on_8_mpi_ranks_from_its_run_sh():
    done = subprocess.run(["bash", str(TUTORIAL / "run.sh"), "8"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "epoch: 2 step: 4, loss is" in done.stdout and "(limit 1e-05): OK" in done.stdout


def _functional_run(steps: int, batches):
    """Three Momentum steps of the tutorial FFN the MindSpore 2.x way; the final parameters."""
    ms.set_seed(5)
    net = FFN()
    net.dense1.matmul.shard(((2, 1), (1, 4)))
    loss_fn = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    optimizer = nn.Momentum(net.trainable_params(), 0.1, 0.9)
    assert optimizer.parameters == tuple(net.trainable_params())
    grad_fn = ms.value_and_grad(lambda x, y: loss_fn(net(x), y), None, optimizer.parameters)

    @ms.jit
    def step(x, y):
        loss, grads = grad_fn(x, y)
        optimizer(grads)
        return loss

    losses = [float(step(*batch).asnumpy()) for batch in batches[:steps]]
    return losses, {name: p.asnumpy() for name, p in net.parameters_and_names()}


def test_the_functional_loop_trains_as_model_train_does():
    """value_and_grad + optimizer(grads) (the whole step planned, as Model.train plans it) against
    Model.train: the same losses and parameters after three steps on 8 devices."""
    ms.set_auto_parallel_context(parallel_mode="auto_parallel", device_num=8)
    rng = np.random.default_rng(2)
    batches = [(rng.standard_normal((64, 64)).astype(np.float32), rng.integers(0, 64, 64).astype(np.int32)) for _ in range(3)]
    losses, functional = _functional_run(3, batches)
    ms.set_seed(5)
    net = FFN()
    net.dense1.matmul.shard(((2, 1), (1, 4)))
    seen = []
    monitor = ms.LossMonitor(log=seen.append)
    ms.Model(net, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"),
             nn.Momentum(net.trainable_params(), 0.1, 0.9)).train(1, batches, callbacks=[monitor])
    planned = {name: p.asnumpy() for name, p in net.parameters_and_names()}
    assert [float(line.split("loss is ")[1]) for line in seen] == pytest.approx(losses, rel=1e-5)
    assert max(float(np.max(np.abs(functional[k] - planned[k]))) for k in planned) <= 1e-5
    assert losses[2] < losses[0]


def test_value_and_grad_sums_the_replicas_gradients_unless_gradients_mean():
    """Data parallel on 4 devices holds every parameter 4 times: MindSpore's default sum
    (gradients_mean=False) is 4 times the mean, which is one device's whole-batch gradient."""
    rng = np.random.default_rng(3)
    x, y = rng.standard_normal((8, 64)).astype(np.float32), rng.integers(0, 64, 8).astype(np.int32)
    loss_fn = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    grads = {}
    for mean in (False, True):
        ms.set_auto_parallel_context(parallel_mode="data_parallel", device_num=4, gradients_mean=mean)
        ms.set_seed(1)
        net = FFN()
        _, found = ms.value_and_grad(lambda a, b: loss_fn(net(a), b), None, net.trainable_params())(x, y)
        grads[mean] = [g.asnumpy() for g in found]
    for summed, averaged in zip(grads[False], grads[True]):
        np.testing.assert_allclose(summed, 4 * averaged, rtol=1e-5, atol=1e-8)
    assert max(float(np.max(np.abs(g))) for g in grads[True]) > 1e-3


def test_value_and_grad_refuses_what_it_cannot_do():
    net = FFN()
    with pytest.raises(ConfigError, match="gradients of the inputs .* are not supported"):
        ms.value_and_grad(lambda x: net(x), 0, net.trainable_params())
    with pytest.raises(ConfigError, match="pass the parameters to differentiate as weights"):
        ms.value_and_grad(lambda x: net(x))
    optimizer = nn.SGD(net.trainable_params(), 0.1)
    with pytest.raises(ConfigError, match=r"SGD\(grads\): expected 4 gradients"):
        optimizer([np.zeros(1)])


def test_the_functional_script_checks_every_step_against_one_device(tmp_path):
    env = os.environ | {"AUTOSTRAT_CHECK": "1", "RANK_SIZE": "8"}
    done = subprocess.run([sys.executable, str(TUTORIAL / "train_functional.py")], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "epoch: 2 step: 4, loss is" in done.stdout
    assert "functional loop: 8 planned training step(s) checked against one device" in done.stdout and "(limit 1e-05): OK" in done.stdout


@pytest.mark.slow
def test_the_functional_script_runs_on_8_mpi_ranks():
    done = subprocess.run(["bash", str(TUTORIAL / "run.sh"), "8", "functional"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "functional loop: 8 planned training step(s) checked against one device" in done.stdout


def test_functional_ops_trace_and_run_like_their_primitives():
    from autostrat import ops
    x, w = ms.Tensor(np.arange(6.0, dtype=np.float32).reshape(2, 3)), ms.Tensor(np.ones((3, 4), np.float32))
    assert np.array_equal(ops.matmul(x, w).asnumpy(), ops.MatMul()(x, w).asnumpy())
    assert ops.mean(x, 1, keep_dims=True).shape == (2, 1) and float(ops.sum(x, None).asnumpy()) == 15.0
    assert ops.softmax(x, -1).asnumpy().sum(axis=-1) == pytest.approx([1.0, 1.0])
    assert ops.transpose(x, (1, 0)).shape == (3, 2) and ops.reshape(x, (3, 2)).shape == (3, 2)

    class Net(nn.Cell):
        def __init__(self):
            super().__init__()
            self.weight = ms.Parameter(np.ones((64, 64), np.float32))

        def construct(self, x):
            return ops.relu(ops.matmul(x, self.weight))

    from autostrat.frontend.tracing import trace
    assert [op.op_type for op in trace(Net(), ms.Tensor(shape=(8, 64))).ops.values()] == ["MatMul", "ReLU"]
    with pytest.raises(ConfigError, match="softmax takes tensors, then axis"):
        ops.softmax(x, -1, 3)


def test_cell_shard_seeds_the_cells_inputs_and_the_search_propagates_from_them():
    """MindSpore 2.x's ``Cell.shard``: the FFN's input split 8 ways by rows; the whole plan
    follows (data parallel: nothing to redistribute), and it trains as one device does."""
    ms.set_auto_parallel_context(parallel_mode="auto_parallel", device_num=8)
    net = FFN().shard(((8, 1),))
    plan = ms.parallelize(net, ms.Tensor(shape=(64, 64)))
    assert plan.ops["shard_input_0"].origin == "seed" and str(plan.ops["dense1.matmul"].strategy) == "((8, 1), (1, 1))"
    assert plan.total_bytes == 0
    from autostrat.frontend.train import train
    loss = nn.WithLossCell(FFN().shard(((8, 1),)), nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"))
    cell = nn.TrainOneStepCell(loss, nn.Momentum(loss.backbone.trainable_params(), 0.1, 0.9))
    report = train(cell, (ms.Tensor(shape=(64, 64)), ms.Tensor(shape=(64,), dtype="int32")), steps=2, log=None)
    assert report.ok, report.text
    with pytest.raises(ConfigError, match="parameter_plan is not supported"):
        FFN().shard(((8, 1),), parameter_plan={"dense1.weight": (8, 1)})
    with pytest.raises(ConfigError, match="FFN.shard: 2 input strategies for 1 inputs"):
        ms.parallelize(FFN().shard(((8, 1), (8, 1))), ms.Tensor(shape=(64, 64)))


def test_sequential_cell_softmax_and_the_functional_shard_plan_as_mindspore_names_them():
    ms.set_auto_parallel_context(parallel_mode="auto_parallel", device_num=8)
    net = nn.SequentialCell([nn.Dense(64, 32), nn.ReLU(), nn.Dense(32, 16), nn.Softmax()])
    assert len(net) == 4 and isinstance(net[3], nn.Softmax)
    ms.shard(net, ((8, 1),))  # MindSpore 2.x: ms.shard(cell, in_strategy) is cell.shard
    plan = ms.parallelize(net, nn.Tensor(shape=(64, 64)))
    assert plan.ops["shard_input_0"].origin == "seed" and plan.ops["3.softmax"].op_type == "Softmax"
    assert str(plan.ops["3.softmax"].strategy) == "((8, 1),)" and plan.total_bytes == 0  # data parallel all through
    with pytest.raises(ConfigError, match="shard: expected a Cell, got function"):
        ms.shard(lambda x: x, ((8, 1),))
    from autostrat.parallel import Layout
    assert Layout is ms.Layout
    with pytest.raises(ConfigError, match="SequentialCell: entry '1' must be a Cell, got int"):
        nn.SequentialCell([nn.ReLU(), 3])


def test_the_scaled_and_truncated_initializers_keep_mindspores_bounds():
    from autostrat.common.initializer import HeUniform, TruncatedNormal, XavierUniform
    xavier = initializer(XavierUniform(), [64, 32]).make()  # fan_in 32, fan_out 64
    he = initializer(HeUniform(), [64, 32]).make()           # fan_in 32, gain sqrt(2)
    assert np.abs(xavier).max() <= np.sqrt(6 / 96) < 1.05 * np.abs(xavier).max()
    assert np.abs(he).max() <= np.sqrt(2) * np.sqrt(3 / 32) < 1.05 * np.abs(he).max()
    truncated = initializer(TruncatedNormal(1.0, a=-1.0, b=1.0), [4000]).make()
    assert np.abs(truncated).max() <= 1.0 and 0.5 < truncated.std() < 0.6  # a normal cut at one sigma: std 0.54
    with pytest.raises(ConfigError, match="HeUniform: mode is fan_in or fan_out"):
        HeUniform(mode="fan_both")


def test_mindspores_other_context_keys_warn_alias_or_refuse_by_name():
    mindspore_keys.forget_warnings()
    with pytest.warns(UserWarning, match="comm_fusion is accepted and has no effect in autostrat"):
        ms.set_auto_parallel_context(comm_fusion={"allreduce": {"mode": "auto"}}, device_num=8)
    assert ms.get_auto_parallel_context("device_num") == 8
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per key
        ms.set_auto_parallel_context(comm_fusion={})
    ms.set_auto_parallel_context(auto_parallel_search_mode="integer_programming")  # MindSpore's deprecated alias
    assert ms.get_auto_parallel_context("search_mode") == "integer_programming"
    with pytest.raises(ConfigError, match="'grad_accumulation_step' is not supported: gradient accumulation is not built"):
        ms.set_auto_parallel_context(grad_accumulation_step=4)
    with pytest.raises(ConfigError, match="unknown auto-parallel context key 'gradient_fp16_sync'"):
        ms.set_auto_parallel_context(gradient_fp16_sync=True)
