"""MindSpore 2.x's functional loop (value_and_grad, jit, grad reducers, optimizer(grads)) plans
and runs the whole training step, honours the context, and is checked against one device.

The networks and loops have the shape of MindSpore's parallel samples (sharding_propagation,
distributed_operator_parallel, distributed_optimizer_parallel, recompute), with autostrat's
names and small sizes; ranks are threads here, MPI ranks in the last (slow) test.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import autostrat as ms
from autostrat import nn, ops
from autostrat.errors import ConfigError
from autostrat.frontend import mindspore_keys, ms_context
from autostrat.runtime.launcher import find_mpiexec

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def _clean():
    yield
    ms.reset_auto_parallel_context()
    ms_context.reset_context()
    mindspore_keys.forget_warnings()


class Network(nn.Cell):
    """recompute/train.py's network, 32 inputs instead of MNIST's 784."""

    def __init__(self):
        super().__init__()
        self.layer1 = nn.Dense(32, 64)
        self.relu1 = ops.ReLU()
        self.layer2 = nn.Dense(64, 64)
        self.relu2 = ops.ReLU()
        self.layer3 = nn.Dense(64, 16)

    def construct(self, x):
        return self.layer3(self.relu2(self.layer2(self.relu1(self.layer1(x)))))


def batches(count: int = 3, rows: int = 8) -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(4)
    return [(rng.standard_normal((rows, 32)).astype(np.float32), rng.integers(0, 16, rows).astype(np.int32))
            for _ in range(count)]


def loop(net, optimizer, data, jit: bool = True, reducer=None, has_aux: bool = True):
    """The samples' loop over `data`: the losses, as floats."""
    loss_fn = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")

    def forward_fn(x, y):
        logits = net(x)
        return loss_fn(logits, y), logits

    grad_fn = ms.value_and_grad(forward_fn, None, net.trainable_params(), has_aux=has_aux)

    def train_step(x, y):
        (loss, _), grads = grad_fn(x, y)
        optimizer(reducer(grads) if reducer else grads)
        return loss

    step = ms.jit(train_step) if jit else train_step
    return [float(step(x, y).asnumpy()) for x, y in data], grad_fn


def planned(grad_fn):
    """The plan of the one planned step `grad_fn`'s loop ran."""
    [step] = grad_fn.steps.values()
    return step.plan


def test_the_jit_loop_plans_one_training_step_and_trains_as_model_train(capsys, monkeypatch):
    """sharding_propagation/train.py's shape: a seed, Momentum, @jit. The step is one plan with
    its update ops split, checked against one device, and equals Model.train's run."""
    monkeypatch.setenv("AUTOSTRAT_CHECK", "1")
    ms.set_auto_parallel_context(parallel_mode="auto_parallel", device_num=8, full_batch=True)
    data = batches()
    ms.set_seed(1)
    net = Network()
    net.layer1.matmul.shard(((2, 1), (4, 1)))
    losses, grad_fn = loop(net, nn.Momentum(net.trainable_params(), 0.1, 0.9), data)
    plan = planned(grad_fn)
    assert "optimizer/layer1.weight" in plan.ops and str(plan.ops["net.layer1.matmul"].strategy) == "((2, 1), (4, 1))"
    out = capsys.readouterr().out
    assert "functional loop: one training step planned whole (forward, loss, backward, gradient synchronisation, " \
           "Momentum update) on 8 devices, auto_parallel; global batch 8 rows" in out
    assert "functional loop, step 1 against one device" in out and "measured = predicted on every rank" in out
    ms.set_seed(1)
    again = Network()
    again.layer1.matmul.shard(((2, 1), (4, 1)))
    seen = []
    ms.Model(again, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"),
             nn.Momentum(again.trainable_params(), 0.1, 0.9)).train(1, data, callbacks=[ms.LossMonitor(log=seen.append)])
    assert [float(line.split("loss is ")[1]) for line in seen] == pytest.approx(losses, rel=1e-5)
    for (name, mine), (_, theirs) in zip(net.parameters_and_names(), again.parameters_and_names()):
        np.testing.assert_allclose(mine.asnumpy(), theirs.asnumpy(), rtol=1e-5, atol=1e-6, err_msg=name)


def test_the_loop_without_jit_recomputes_the_marked_ops_through_a_grad_reducer(capsys):
    """recompute/train.py's shape: data parallel, gradients_mean, relu.recompute(), a
    DistributedGradReducer, no jit: the ops are recomputed in the planned backward."""
    ms.set_auto_parallel_context(parallel_mode="data_parallel", device_num=4, gradients_mean=True)
    net = Network()
    net.relu1.recompute()
    net.relu2.recompute()
    optimizer = nn.SGD(net.trainable_params(), 1e-2)
    losses, grad_fn = loop(net, optimizer, batches(), jit=False, reducer=nn.DistributedGradReducer(optimizer.parameters))
    recomputed = sorted(name for name in planned(grad_fn).graph.ops if name.startswith("recompute/"))
    assert recomputed == ["recompute/net.relu1", "recompute/net.relu2"]
    out = capsys.readouterr().out
    assert "recomputed in the backward: net.relu2, net.relu1" in out
    assert "gradients: the mean over each parameter's replicas (DistributedGradReducer, gradients_mean=True)" in out
    assert losses[-1] < losses[0]


def _one_sgd_step(reducer_mean):
    ms.set_auto_parallel_context(parallel_mode="data_parallel", device_num=4, full_batch=True)
    ms.set_seed(2)
    net = Network()
    before = [p.asnumpy().copy() for p in net.trainable_params()]
    optimizer = nn.SGD(net.trainable_params(), 0.1)
    reducer = nn.DistributedGradReducer(optimizer.parameters, mean=reducer_mean)
    loop(net, optimizer, batches(1), reducer=reducer)
    return [b - p.asnumpy() for b, p in zip(before, net.trainable_params())]


def test_distributed_grad_reducer_averages_or_sums_the_replicas_gradients():
    """MindSpore's DistributedGradReducer: mean=True averages the 4 data-parallel replicas'
    gradients (one device's whole-batch gradient), mean=False sums them (4 times as much)."""
    averaged, summed = _one_sgd_step(True), _one_sgd_step(False)
    for mean, total in zip(averaged, summed):
        np.testing.assert_allclose(total, 4 * mean, rtol=1e-4, atol=1e-7)  # float32 parameters: steps differ by rounding
    assert max(float(np.abs(step).max()) for step in averaged) > 1e-4


def test_the_parallel_optimizer_splits_the_loops_update(capsys):
    """distributed_optimizer_parallel.py's shape: semi_auto_parallel, enable_parallel_optimizer."""
    ms.set_auto_parallel_context(parallel_mode="semi_auto_parallel", device_num=4, enable_parallel_optimizer=True,
                                 parallel_optimizer_config={"parallel_optimizer_threshold": 0})
    net = Network()
    _, grad_fn = loop(net, nn.SGD(net.trainable_params(), 1e-2), batches(1))
    plan = planned(grad_fn)
    assert plan.optimizer_shard is not None
    assert "optimizer sharded (enable_parallel_optimizer): updates split: layer1.bias over 4, layer1.weight over 4" \
        in capsys.readouterr().out


def test_the_loop_saves_the_strategy_checkpoint_and_the_ir(tmp_path, capsys):
    ms.set_context(save_graphs=2, save_graphs_path=str(tmp_path / "ir"))
    ms.set_auto_parallel_context(parallel_mode="semi_auto_parallel", device_num=2,
                                 strategy_ckpt_config={"save_file": str(tmp_path / "strategy.json")})
    net = Network()
    loop(net, nn.SGD(net.trainable_params(), 1e-2), batches(1))
    assert "layer1.weight" in (tmp_path / "strategy.json").read_text()
    assert list((tmp_path / "ir" / "rank_0").iterdir())
    out = capsys.readouterr().out
    assert f"strategy checkpoint saved to {tmp_path / 'strategy.json'}" in out and "IR dumped to" in out


def _changed(grads):
    return tuple(ms.Tensor(g.asnumpy() * 0.5) for g in grads)


def test_a_loop_that_changes_the_gradients_updates_unsplit_unless_a_setting_needs_the_step():
    ms.set_auto_parallel_context(parallel_mode="data_parallel", device_num=2)
    net = Network()
    before = net.layer1.weight.asnumpy().copy()
    optimizer = nn.SGD(net.trainable_params(), 0.1)
    loop(net, optimizer, batches(1), reducer=_changed)
    assert not np.array_equal(before, net.layer1.weight.asnumpy())
    ms.set_auto_parallel_context(enable_parallel_optimizer=True)
    before = net.layer1.weight.asnumpy().copy()
    with pytest.raises(ConfigError, match=r"^enable_parallel_optimizer=True needs the whole training step planned, but "
                                          r"the functional loop computes value_and_grad by itself \(its gradients are read"):
        loop(net, optimizer, batches(1), reducer=_changed)
    assert np.array_equal(before, net.layer1.weight.asnumpy())


def test_recompute_on_a_loop_that_changes_the_gradients_is_refused():
    ms.set_auto_parallel_context(parallel_mode="data_parallel", device_num=2)
    net = Network()
    net.relu1.recompute()
    with pytest.raises(ConfigError, match=r"^recompute\(\) on net.relu1 needs the whole training step planned"):
        loop(net, nn.SGD(net.trainable_params(), 0.1), batches(1), reducer=_changed)


class Stack(nn.Cell):
    """Two repeated layers (a CellList, which pipeline stages split) and a head."""

    def __init__(self):
        super().__init__()
        self.layers = nn.CellList([nn.Dense(32, 32), nn.Dense(32, 32)])
        self.head = nn.Dense(32, 16)

    def construct(self, x):
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


@pytest.mark.parametrize("full_batch", [True, False])
def test_a_loop_over_a_pipeline_cell_plans_its_stages(capsys, monkeypatch, full_batch):
    """distributed_pipeline_parallel.py's shape: pipeline_stages, an nn.PipelineCell the loss
    function only calls, @jit: the step is a pipeline plan, checked against one device. Without
    full_batch the global batch is the data-parallel ranks' shares (4 devices / 2 stages), as
    `Model.train` makes it."""
    monkeypatch.setenv("AUTOSTRAT_CHECK", "1")
    ms.set_auto_parallel_context(parallel_mode="semi_auto_parallel", device_num=4, pipeline_stages=2, full_batch=full_batch)
    net = Stack()
    optimizer = nn.SGD(net.trainable_params(), 1e-2)
    net_with_loss = nn.PipelineCell(nn.WithLossCell(net, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")), 2)
    grad_fn = ms.value_and_grad(lambda x, y: net_with_loss(x, y), None, optimizer.parameters)

    @ms.jit
    def train_one_step(x, y):
        loss, grads = grad_fn(x, y)
        optimizer(grads)
        return loss

    losses = [float(train_one_step(x, y).asnumpy()) for x, y in batches(2)]
    assert planned(grad_fn).pipeline.stages == 2 and losses[1] < losses[0]
    out = capsys.readouterr().out
    assert "pipeline: 2 stages of 2 devices, 2 micro-batches, 1f1b schedule" in out
    assert "functional loop, step 1 against one device" in out and "(limit 1e-05): OK" in out
    shares = "every rank given the whole batch" if full_batch else "2 data-parallel ranks' shares of 8 rows"
    assert f"global batch {8 if full_batch else 16} rows: {shares}" in out


def test_pipeline_stages_on_a_loop_without_stages_to_split_are_refused_before_a_step():
    ms.set_auto_parallel_context(parallel_mode="semi_auto_parallel", device_num=4, pipeline_stages=2)
    net = Network()
    before = net.layer1.weight.asnumpy().copy()
    with pytest.raises(ConfigError, match=r"pipeline"):
        loop(net, nn.SGD(net.trainable_params(), 0.1), batches(1))
    assert np.array_equal(before, net.layer1.weight.asnumpy())


def test_the_auxiliary_output_of_a_planned_step_is_refused_when_read():
    ms.set_auto_parallel_context(parallel_mode="data_parallel", device_num=2)
    net = Network()
    loss_fn = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    grad_fn = ms.value_and_grad(lambda x, y: (loss_fn(net(x), y), net(x)), None, net.trainable_params(), has_aux=True)
    (loss, logits), grads = grad_fn(*batches(1)[0])
    nn.SGD(net.trainable_params(), 0.1)(grads)
    assert loss.shape == ()
    with pytest.raises(ConfigError, match=r"output 1 of a call whose training step ran planned .* is not computed"):
        logits.asnumpy()


@pytest.mark.parametrize("full_batch, rows", [(False, 32), (True, 8)])
def test_full_batch_decides_the_global_batch_a_loop_plans(full_batch, rows):
    """full_batch=False: each rank's inputs are its share (run alone, every rank reads this
    process's batch: 4 shares of 8 rows); True: the batch as given."""
    ms.set_auto_parallel_context(parallel_mode="data_parallel", device_num=4, full_batch=full_batch)
    net = Network()
    _, grad_fn = loop(net, nn.SGD(net.trainable_params(), 0.1), batches(1))
    assert [info.shape[0] for info in planned(grad_fn).graph.inputs()] == [rows, rows]


def test_a_bare_call_under_auto_parallel_is_planned_and_checked(capsys, monkeypatch):
    monkeypatch.setenv("AUTOSTRAT_CHECK", "1")
    ms.set_auto_parallel_context(parallel_mode="semi_auto_parallel", device_num=4)
    net = Network()
    net.layer1.matmul.shard(((1, 1), (4, 1)))
    x = batches(1)[0][0]
    logits = net(ms.Tensor(x))
    [plan] = net.__dict__["_bare_plans"].values()
    assert str(plan.ops["layer1.matmul"].strategy) == "((1, 1), (4, 1))" and plan.graph.inputs()[0].shape == (32, 32)
    assert "Network(x) planned as a forward pass on 4 devices" in capsys.readouterr().out
    ms.reset_auto_parallel_context()
    np.testing.assert_allclose(logits.asnumpy(), net(ms.Tensor(x)).asnumpy(), rtol=1e-5, atol=1e-6)


SCRIPT = '''
import numpy as np
import autostrat as ms
from autostrat import nn, ops
from autostrat.communication import init, get_rank, get_group_size

ms.set_context(mode=ms.GRAPH_MODE)
ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.DATA_PARALLEL, gradients_mean=True)
init()
ms.set_seed(1)
{network}
net = Network()
net.relu1.recompute()
net.relu2.recompute()
rng = np.random.default_rng(get_rank())  # each rank its own share, as a sharded dataset gives it
data = [(rng.standard_normal((4, 32)).astype(np.float32), rng.integers(0, 16, 4).astype(np.int32)) for _ in range(2)]
optimizer = nn.SGD(net.trainable_params(), 1e-2)
loss_fn = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")

def forward_fn(data, target):
    logits = net(data)
    loss = loss_fn(logits, target)
    return loss, logits

grad_fn = ms.value_and_grad(forward_fn, None, net.trainable_params(), has_aux=True)
grad_reducer = nn.DistributedGradReducer(optimizer.parameters)
for i, (image, label) in enumerate(data * 2):
    (loss_value, _), grads = grad_fn(image, label)
    grads = grad_reducer(grads)
    optimizer(grads)
    if get_rank() == 0:
        print("step: %s, loss is %s" % (i, loss_value))
'''


@pytest.mark.slow
def test_the_recompute_loop_runs_on_8_mpi_ranks(tmp_path):
    """recompute/train.py's loop on 8 MPI ranks, each given its own share: the planned step is
    checked against one device on the gathered global batch (32 rows)."""
    import inspect

    source = inspect.getsource(Network).replace('    """recompute/train.py\'s network, 32 inputs instead of MNIST\'s 784."""\n', "")
    script = tmp_path / "train.py"
    script.write_text(SCRIPT.format(network=source))
    env = os.environ | {"AUTOSTRAT_CHECK": "1", "PYTHONPATH": str(ROOT), "MPIEXEC_TIMEOUT": "300"}
    done = subprocess.run([str(find_mpiexec()), "-n", "8", sys.executable, str(script)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "global batch 32 rows: 8 data-parallel ranks' shares of 4 rows (full_batch=False)" in done.stdout
    assert "recomputed in the backward: net.relu2, net.relu1" in done.stdout
    assert "step: 3, loss is" in done.stdout
    assert "functional loop: 4 planned training step(s) checked against one device" in done.stdout
