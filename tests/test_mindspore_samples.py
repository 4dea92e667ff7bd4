"""MindSpore's own parallel samples (issue #31) run with only `mindspore` renamed in their imports:
the harness (tests/mindspore_samples.py), the MindSpore names they use, each against an
independent computation, MindSpore's step counting in LossMonitor and its batch semantics in
Model.train, and the Model.train sample end to end on 8 MPI ranks."""

from __future__ import annotations

import re
import struct
import warnings

import numpy as np
import pytest

import autostrat as ms
import autostrat.dataset as ds
from autostrat import nn, ops, train
from autostrat.errors import ConfigError
from autostrat.frontend import mindspore_keys, ms_context
from autostrat.frontend.tensor import Tensor
from tests.mindspore_samples import MNIST_COUNT, SAMPLE_FILES, SAMPLES, rename_imports, run_sample, write_mnist


@pytest.fixture(autouse=True)
def _clean():
    yield
    ms.reset_auto_parallel_context()
    ms_context.reset_context()
    mindspore_keys.forget_warnings()


# --- the harness ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(SAMPLE_FILES))
def test_renaming_changes_only_the_import_lines(name):
    original = (SAMPLES / SAMPLE_FILES[name]).read_text()
    renamed = rename_imports(original)
    changed = [(a, b) for a, b in zip(original.splitlines(), renamed.splitlines()) if a != b]
    assert len(original.splitlines()) == len(renamed.splitlines()) and changed
    for before, after in changed:
        assert before.lstrip().startswith(("import mindspore", "from mindspore")), before
        assert after == before.replace("mindspore", "autostrat", 1)
    assert "import mindspore" not in renamed and "from mindspore" not in renamed


def test_renaming_refuses_to_touch_anything_but_imports():
    with pytest.raises(AssertionError, match="renaming changed more than import statements"):
        rename_imports('text = """\nfrom mindspore import nn\n"""\n')  # an import line inside a string
    assert rename_imports("x = 'mindspore'  # import mindspore\n") == "x = 'mindspore'  # import mindspore\n"


def test_the_synthetic_mnist_is_in_mnists_idx_format(tmp_path):
    folder = write_mnist(tmp_path, count=5)
    images = (folder / "train-images-idx3-ubyte").read_bytes()
    labels = (folder / "train-labels-idx1-ubyte").read_bytes()
    assert struct.unpack(">IIII", images[:16]) == (2051, 5, 28, 28) and len(images) == 16 + 5 * 784
    assert struct.unpack(">II", labels[:8]) == (2049, 5) and len(labels) == 13 and max(labels[8:]) <= 9
    rows = list(ds.MnistDataset(str(folder), shuffle=False))
    assert [row[0].shape for row in rows] == [(28, 28, 1)] * 5 and rows[0][0].dtype == np.uint8
    assert rows[3][0][2, 5, 0] == images[16 + 3 * 784 + 2 * 28 + 5] and [int(row[1]) for row in rows] == list(labels[8:])
    assert rows[0][1].dtype == np.uint32


# --- datasets ---------------------------------------------------------------------------------


def test_mnist_shards_deal_rows_in_turn_from_one_shuffled_order(tmp_path):
    write_mnist(tmp_path, count=10)
    labels = [int(row[1]) for row in ds.MnistDataset(str(tmp_path), shuffle=False)]
    shard = [[int(row[1]) for row in ds.MnistDataset(str(tmp_path), num_shards=4, shard_id=i, shuffle=False)] for i in range(4)]
    # MindSpore's distributed sampler: shard i reads rows i, i+4, ... and wraps to ceil(10/4) = 3 rows each.
    assert shard == [[labels[j % 10] for j in range(i, 12, 4)] for i in range(4)]
    shuffled = [[row[0].tobytes() for row in ds.MnistDataset(str(tmp_path), num_shards=2, shard_id=i)] for i in range(2)]
    everything = {row[0].tobytes() for row in ds.MnistDataset(str(tmp_path), shuffle=False)}
    assert set(shuffled[0]) | set(shuffled[1]) == everything and not set(shuffled[0]) & set(shuffled[1])
    with pytest.raises(ConfigError, match=r"MnistDataset: num_shards must be a positive integer and shard_id one of 0..num_shards-1, "
                                          r"got num_shards=2, shard_id=2"):
        ds.MnistDataset(str(tmp_path), num_shards=2, shard_id=2)
    with pytest.raises(ConfigError, match="MnistDataset: expected train-images-idx3-ubyte and t10k-images-idx3-ubyte with its "
                                          "labels file in"):
        ds.MnistDataset(str(tmp_path / "empty"))


def test_the_samples_transforms_compute_mindspores_formulas(tmp_path):
    write_mnist(tmp_path, count=4)
    data = ds.MnistDataset(str(tmp_path), shuffle=False)
    data = data.map([ds.vision.Rescale(1.0 / 255.0, 0), ds.vision.Normalize(mean=(0.1307,), std=(0.3081,)), ds.vision.HWC2CHW()], "image")
    data = data.map(ds.transforms.TypeCast(ms.int32), "label").batch(3)
    (image, label), (rest, _) = list(data)
    raw = np.frombuffer((tmp_path / "train-images-idx3-ubyte").read_bytes()[16:], np.uint8).reshape(4, 1, 28, 28)
    expected = (raw[:3].astype(np.float64) / 255.0 - 0.1307) / 0.3081
    assert image.shape == (3, 1, 28, 28) and image.dtype == np.float32 and rest.shape == (1, 1, 28, 28)
    np.testing.assert_allclose(image, expected, rtol=1e-5, atol=1e-5)
    assert label.dtype == np.int32 and label.tolist() == list((tmp_path / "train-labels-idx1-ubyte").read_bytes()[8:11])
    with pytest.raises(ConfigError, match=r"Dataset.map: input_columns must name columns of \['image', 'label'\], got 'img'"):
        ds.MnistDataset(str(tmp_path)).map(ds.vision.HWC2CHW(), "img")
    with pytest.raises(ConfigError, match="Dataset.map: 'output_columns' is not supported"):
        ds.MnistDataset(str(tmp_path)).map(ds.vision.HWC2CHW(), "image", output_columns=["x"])


# --- ops and layers ---------------------------------------------------------------------------


def test_flatten_keeps_the_batch_dim_and_plans_as_a_reshape():
    x = np.arange(2 * 3 * 4 * 5, dtype=np.float32).reshape(2, 3, 4, 5)
    assert np.array_equal(ops.Flatten()(Tensor(x)).asnumpy(), x.reshape(2, 60))
    assert np.array_equal(nn.Flatten()(Tensor(x)).asnumpy(), x.reshape(2, 60))
    assert nn.Flatten(1, 2)(Tensor(x)).shape == (2, 12, 5) and nn.Flatten(0, -1)(Tensor(x)).shape == (120,)
    with pytest.raises(ConfigError, match=r"Flatten: start_dim 2 and end_dim 1 do not name dims in order of an input of shape \[2, 3, 4, 5\]"):
        nn.Flatten(2, 1)(Tensor(x))

    class Net(nn.Cell):
        def __init__(self):
            super().__init__()
            self.flatten = ops.Flatten()
            self.weight = ms.Parameter(np.ones((60, 8), np.float32))
            self.matmul = ops.MatMul()

        def construct(self, x):
            return self.matmul(self.flatten(x), self.weight)

    ms.set_auto_parallel_context(parallel_mode="auto_parallel", device_num=8)
    net = Net()
    net.matmul.shard(((8, 1), (1, 1)))
    plan = ms.parallelize(net, Tensor(shape=(16, 3, 4, 5)))
    assert plan.ops["flatten"].op_type == "Reshape" and plan.layouts["flatten:0"].shape == (16, 60)
    assert str(plan.ops["flatten"].strategy) == "((8, 1, 1, 1),)" and plan.total_bytes == 0  # the batch split flows through


def _cross_entropy(logits, targets):
    """Cross entropy by hand: -sum(target * log_softmax(logits)) per row."""
    shifted = logits - logits.max(axis=1, keepdims=True)
    log_softmax = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    return -(targets * log_softmax).sum(axis=1)


def test_cross_entropy_loss_is_mindspores_formula():
    rng = np.random.default_rng(0)
    logits, labels = rng.standard_normal((6, 10)).astype(np.float32), rng.integers(0, 10, 6).astype(np.int32)
    one_hot = np.eye(10)[labels]
    got = nn.CrossEntropyLoss()(Tensor(logits), Tensor(labels)).asnumpy()
    assert got == pytest.approx(_cross_entropy(logits, one_hot).mean(), rel=1e-5)
    smoothed = nn.CrossEntropyLoss(reduction="none", label_smoothing=0.2)(Tensor(logits), Tensor(labels)).asnumpy()
    np.testing.assert_allclose(smoothed, _cross_entropy(logits, 0.8 * one_hot + 0.02), rtol=1e-5)
    probabilities = rng.dirichlet(np.ones(10), 6).astype(np.float32)
    summed = nn.CrossEntropyLoss(reduction="sum")(Tensor(logits), Tensor(probabilities)).asnumpy()
    assert summed == pytest.approx(_cross_entropy(logits, probabilities).sum(), rel=1e-5)
    with pytest.raises(ConfigError, match="CrossEntropyLoss: weight is not supported"):
        nn.CrossEntropyLoss(weight=Tensor(np.ones(10, np.float32)))
    with pytest.raises(ConfigError, match="CrossEntropyLoss: ignore_index is not supported .*, got 0"):
        nn.CrossEntropyLoss(ignore_index=0)
    with pytest.raises(ConfigError, match="CrossEntropyLoss: reduction must be 'none', 'mean' or 'sum', got 'max'"):
        nn.CrossEntropyLoss(reduction="max")


def test_print_prints_eagerly_and_warns_that_a_plan_prints_nothing(capsys):
    ops.Print()("out is:", Tensor(np.array([1.5, 2.0], np.float32)))
    assert capsys.readouterr().out == "out is: [1.5 2. ]\n"

    class Net(nn.Cell):
        def __init__(self):
            super().__init__()
            self.relu, self.print = ops.ReLU(), ops.Print()

        def construct(self, x):
            out = self.relu(x)
            self.print("out is:", out)
            return out

    ms.set_auto_parallel_context(parallel_mode="data_parallel", device_num=2)
    with pytest.warns(UserWarning, match="ops.Print in a cell run under a parallel plan prints nothing"):
        plan = ms.parallelize(Net(), Tensor(shape=(4, 4)))
    assert list(plan.ops) == ["relu"] and capsys.readouterr().out == ""


def test_primitive_recompute_recomputes_that_op_in_the_backward():
    from autostrat.frontend.train import training_plan

    class Net(nn.Cell):
        def __init__(self):
            super().__init__()
            self.dense1, self.relu1, self.dense2 = nn.Dense(16, 16), ops.ReLU(), nn.Dense(16, 4)

        def construct(self, x):
            return self.dense2(self.relu1(self.dense1(x)))

    ms.set_auto_parallel_context(parallel_mode="data_parallel", device_num=2)
    net = Net()
    net.relu1.recompute()
    loss = nn.WithLossCell(net, nn.CrossEntropyLoss())
    plan, _, _ = training_plan(loss, nn.SGD(net.trainable_params(), 0.1), (Tensor(shape=(8, 16)), Tensor(shape=(8,), dtype="int32")))
    assert [name for name in plan.graph.ops if name.startswith("recompute/")] == ["recompute/backbone.relu1"]


def test_comm_fusion_and_the_grad_reducer_say_what_they_do():
    ms.set_auto_parallel_context(parallel_mode="data_parallel", device_num=8)
    dense = nn.Dense(4, 4)
    with pytest.warns(UserWarning, match="Cell.set_comm_fusion is accepted and has no effect in autostrat"):
        dense.set_comm_fusion(0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per process
        dense.set_comm_fusion(1)
    grads = tuple(Tensor(np.ones(p.shape, np.float32)) for p in dense.trainable_params())
    assert nn.DistributedGradReducer(dense.trainable_params())(grads) is grads
    with pytest.raises(ConfigError, match=r"DistributedGradReducer\(mean=True\): gradients computed before the reducer were "
                                          r"synchronised with gradients_mean=False"):
        nn.DistributedGradReducer(dense.trainable_params(), mean=True)(grads)
    with pytest.raises(ConfigError, match="DistributedGradReducer: degree=4 is not supported"):
        nn.DistributedGradReducer(dense.trainable_params(), degree=4)


def test_the_sample_import_paths_exist():
    from autostrat.parallel.shard import Layout
    from autostrat.ops import value_and_grad
    from autostrat.common.initializer import HeUniform
    assert Layout is ms.Layout and value_and_grad is ms.value_and_grad and HeUniform is not None
    assert ms.parallel.shard is not ms.parallel.Layout and callable(ms.parallel.shard)  # the function, as in MindSpore
    assert train.ModelCheckpoint and train.CheckpointConfig and ds.vision.Rescale and ds.transforms.TypeCast


# --- Model.train: step counting, batch semantics, checkpoints -----------------------------------


def _mnist_model(device_num: int, model_parallel: bool = False, **settings):
    """The samples' network (Flatten, two Dense) and a Model training it with SGD: data parallel,
    or `model_parallel` (the first Dense's weight split by rows over every device: every rank
    computes on the whole global batch, so it needs the other ranks' rows)."""
    ms.reset_auto_parallel_context()
    mode = "semi_auto_parallel" if model_parallel else "data_parallel"
    ms.set_auto_parallel_context(parallel_mode=mode, device_num=device_num, **settings)
    ms.set_seed(1)
    net = nn.SequentialCell([nn.Flatten(), nn.Dense(28 * 28, 16), nn.ReLU(), nn.Dense(16, 10)])
    if model_parallel:
        net[0].reshape.shard(((1, 1, 1, 1),))  # every rank loads the whole input, not its rows to gather later
        net[1].matmul.shard(((1, 1), (device_num, 1)))
    return net, ms.Model(net, nn.CrossEntropyLoss(), nn.SGD(net.trainable_params(), 0.05))


def _sample_pipeline(dataset, batch_size: int):
    """The samples' create_dataset transforms."""
    dataset = dataset.map([ds.vision.Rescale(1.0 / 255.0, 0), ds.vision.Normalize(mean=(0.1307,), std=(0.3081,)),
                           ds.vision.HWC2CHW()], "image")
    return dataset.map(ds.transforms.TypeCast(ms.int32), "label").batch(batch_size)


def test_loss_monitor_counts_steps_over_the_whole_run(tmp_path):
    write_mnist(tmp_path, count=16)
    _, model = _mnist_model(2)
    lines = []
    model.train(10, _sample_pipeline(ds.MnistDataset(str(tmp_path), shuffle=False), 8), callbacks=[ms.LossMonitor(20, log=lines.append)])
    assert len(lines) == 1 and lines[0].startswith("epoch: 10 step: 2, loss is ")


def _trained_alone_on_the_shards_together(folder) -> dict:
    """One device trained as 4 ranks reading shards of the 32 images in `folder` train together
    (see the test below), by parameter name."""
    images = np.frombuffer((folder / "train-images-idx3-ubyte").read_bytes()[16:], np.uint8).reshape(32, 1, 28, 28)
    labels = np.frombuffer((folder / "train-labels-idx1-ubyte").read_bytes()[8:], np.uint8).astype(np.int32)
    images = ((images / 255.0 - 0.1307) / 0.3081).astype(np.float32)
    # Shard r reads rows r, r+4, ...: its step s takes the 4 of them from position 4s.
    order = [[r + 4 * (4 * step + k) for r in range(4) for k in range(4)] for step in range(2)]
    assert sorted(order[0] + order[1]) == list(range(32))
    alone, alone_model = _mnist_model(1, full_batch=True)
    alone_model.train(2, [(images[rows], labels[rows]) for rows in order])
    return {name: parameter.asnumpy() for name, parameter in alone.parameters_and_names()}


def test_sharded_ranks_train_as_one_device_on_their_rows_together(tmp_path, capsys):
    """full_batch=False: each of 4 ranks reads its shard (4 rows a step); the step is the global
    batch of 16 rows, rank r's rows at r*4.. -- as one device training on those rows stacked."""
    write_mnist(tmp_path, count=32)
    net, model = _mnist_model(4, model_parallel=True, gradients_mean=True)
    model.train(2, _sample_pipeline(ds.MnistDataset(str(tmp_path), num_shards=4, shard_id=0, shuffle=False), 4))
    assert "Model.train: plan for global batch 16 (4 rows per rank x 4 data-parallel ranks, full_batch=False)" in capsys.readouterr().out
    expected = _trained_alone_on_the_shards_together(tmp_path)
    for name, trained in net.parameters_and_names():
        np.testing.assert_allclose(trained.asnumpy(), expected[name], rtol=1e-5, atol=1e-6, err_msg=name)


@pytest.mark.slow
def test_sharded_mpi_ranks_train_as_one_device_on_their_rows_together(tmp_path):
    """The same under mpiexec: each of 4 processes reads only its own shard, and the first
    layer, split by its weight's rows, needs every rank's rows on every rank."""
    import subprocess
    import sys

    from autostrat.runtime import launcher
    from tests.mindspore_samples import ROOT

    write_mnist(tmp_path, count=32)
    command = [str(launcher.find_mpiexec()), "-n", "4", sys.executable, "-m", "mpi4py", "tests/mpi_sharded_training.py",
               str(tmp_path), str(tmp_path / "trained.npz")]
    env = launcher.mpi_environment(4) | {"PYTHONPATH": str(ROOT), "MPIEXEC_TIMEOUT": "240"}
    env.pop("RANK_SIZE", None)
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert done.stdout.count("Model.train: plan for global batch 16 (4 rows per rank x 4 data-parallel ranks") == 1
    trained, expected = np.load(tmp_path / "trained.npz"), _trained_alone_on_the_shards_together(tmp_path)
    assert sorted(trained.files) == sorted(expected)
    for name in expected:
        np.testing.assert_allclose(trained[name], expected[name], rtol=1e-5, atol=1e-6, err_msg=name)


def test_full_batch_means_every_rank_reads_the_whole_batch(tmp_path, capsys):
    write_mnist(tmp_path, count=16)
    net, model = _mnist_model(4, full_batch=True, gradients_mean=True)
    model.train(1, _sample_pipeline(ds.MnistDataset(str(tmp_path), shuffle=False), 16))
    assert "Model.train: plan for global batch 16 (every rank reads the whole batch, full_batch=True)" in capsys.readouterr().out
    alone, alone_model = _mnist_model(1, full_batch=True)
    alone_model.train(1, _sample_pipeline(ds.MnistDataset(str(tmp_path), shuffle=False), 16))
    for (name, trained), (_, expected) in zip(net.parameters_and_names(), alone.parameters_and_names()):
        np.testing.assert_allclose(trained.asnumpy(), expected.asnumpy(), rtol=1e-5, atol=1e-6, err_msg=name)
    with pytest.raises(ConfigError, match="Model.train: the dataset is split in 2 shards but 4 data-parallel ranks read it"):
        _mnist_model(4)[1].train(1, _sample_pipeline(ds.MnistDataset(str(tmp_path), num_shards=2, shard_id=0), 4))


def _read_mindspore_ckpt(path) -> dict:
    """A MindSpore .ckpt read with the protobuf package from checkpoint.proto's messages."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    proto = descriptor_pb2.FileDescriptorProto(name="checkpoint_test.proto", package="ckpt_test", syntax="proto2")
    tensor = proto.message_type.add(name="TensorProto")
    field = descriptor_pb2.FieldDescriptorProto
    tensor.field.add(name="dims", number=1, type=field.TYPE_INT64, label=field.LABEL_REPEATED)
    tensor.field.add(name="tensor_type", number=2, type=field.TYPE_STRING, label=field.LABEL_REQUIRED)
    tensor.field.add(name="tensor_content", number=3, type=field.TYPE_BYTES, label=field.LABEL_REQUIRED)
    checkpoint = proto.message_type.add(name="Checkpoint")
    value = checkpoint.nested_type.add(name="Value")
    value.field.add(name="tag", number=1, type=field.TYPE_STRING, label=field.LABEL_REQUIRED)
    value.field.add(name="tensor", number=2, type=field.TYPE_MESSAGE, type_name=".ckpt_test.TensorProto", label=field.LABEL_REQUIRED)
    checkpoint.field.add(name="value", number=1, type=field.TYPE_MESSAGE, type_name=".ckpt_test.Checkpoint.Value",
                         label=field.LABEL_REPEATED)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    message = message_factory.GetMessageClass(pool.FindMessageTypeByName("ckpt_test.Checkpoint"))()
    message.ParseFromString(path.read_bytes())
    types = {"Float32": np.float32, "Int32": np.int32}
    return {v.tag: np.frombuffer(v.tensor.tensor_content, types[v.tensor.tensor_type]).reshape(tuple(v.tensor.dims))
            for v in message.value}


def test_model_checkpoint_writes_mindspores_ckpt_whole_or_this_ranks_slices(tmp_path):
    write_mnist(tmp_path, count=16)
    data = _sample_pipeline(ds.MnistDataset(str(tmp_path), shuffle=False), 8)
    for integrated in (True, False):
        ms.reset_auto_parallel_context()
        ms.set_auto_parallel_context(parallel_mode="semi_auto_parallel", device_num=2)
        ms.set_seed(1)
        net = nn.SequentialCell([nn.Flatten(), nn.Dense(28 * 28, 16), nn.ReLU(), nn.Dense(16, 10)])
        net[1].matmul.shard(((1, 1), (2, 1)))  # weight [16, 784] split by rows: rank 0 holds rows 0-7
        config = train.CheckpointConfig(save_checkpoint_steps=1000, keep_checkpoint_max=1, integrated_save=integrated)
        saver = train.ModelCheckpoint(prefix="checkpoint", directory=tmp_path / f"rank_0_{integrated}", config=config)
        ms.Model(net, nn.CrossEntropyLoss(), nn.SGD(net.trainable_params(), 0.05)).train(3, data, callbacks=[saver])
        files = sorted(path.name for path in (tmp_path / f"rank_0_{integrated}").iterdir())
        assert files == ["checkpoint-3_2.ckpt"]  # epoch 3, its step 2: the last step
        saved = _read_mindspore_ckpt(tmp_path / f"rank_0_{integrated}" / files[0])
        whole = {name: parameter.asnumpy() for name, parameter in net.parameters_and_names()}
        assert list(saved) == list(whole) == ["1.weight", "1.bias", "3.weight", "3.bias"]
        # semi_auto_parallel: the unconfigured BiasAdd is data parallel, its bias whole on every rank.
        expected = whole if integrated else whole | {"1.weight": whole["1.weight"][:8]}
        for name in whole:
            assert np.array_equal(saved[name], expected[name]), name
    with pytest.raises(ConfigError, match="ModelCheckpoint: save_checkpoint_steps=4 asks for a checkpoint at step 4, before the "
                                          "run's last step 6: Model.train has the trained values only at its end"):
        ms.Model(net, nn.CrossEntropyLoss(), nn.SGD(net.trainable_params(), 0.05)).train(
            3, data, callbacks=[train.ModelCheckpoint(config=train.CheckpointConfig(save_checkpoint_steps=4))])
    with pytest.raises(ConfigError, match=r"CheckpointConfig: async_save=True is not supported \(only its default False\)"):
        train.CheckpointConfig(async_save=True)


@pytest.mark.slow
def test_the_model_train_sample_runs_on_8_mpi_ranks_like_one_device(tmp_path):
    """model_saving_loading/train_saving.py, only its imports renamed: every rank reads the 64
    synthetic images (2 steps of 32 an epoch, 10 epochs), its share of a 256-row global batch;
    the run equals one device, LossMonitor(20) prints once, at step 20, and every rank writes
    its slices of the parameters and rank 0 the strategy checkpoint."""
    run = run_sample("strategy_saving", tmp_path, ranks=8)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "Model.train: plan for global batch 256 (32 rows per rank x 8 data-parallel ranks, full_batch=False)" in run.stdout
    assert [line for line in run.stdout.splitlines() if "loss is" in line][0].startswith("epoch: 10 step: 2, loss is ")
    assert sum("loss is" in line for line in run.stdout.splitlines()) == 1
    assert "measured = predicted on every rank" in run.stdout and "(limit 1e-05): OK" in run.stdout
    assert (tmp_path / "src_strategy.ckpt").stat().st_size > 0
    slices = [_read_mindspore_ckpt(tmp_path / "src_checkpoints" / f"rank_{rank}" / "checkpoint-10_2.ckpt") for rank in range(8)]
    # layer1.matmul.shard(((2, 1), (1, 2))): weight [784, 512] split in two by columns, each half on 4 ranks.
    assert all(piece["layer1.weight"].shape == (784, 256) for piece in slices)
    halves = [piece["layer1.weight"].tobytes() for piece in slices]
    assert sorted(halves.count(half) for half in set(halves)) == [4, 4]  # two different halves, each on 4 ranks
    assert all(piece["layer3.weight"].shape == (256, 10) for piece in slices)  # ((2, 2), (2, 1)): rows split in 2
    assert MNIST_COUNT == 64


# What each functional-loop sample's settings make the run print on rank 0 (beyond its check):
# the path and mode planned, and what its settings did (stages staged, optimizer sharded,
# cells recomputed, IR dumped). train_saving.py (Model.train) has its own test above.
SAYS = {
    "sharding_propagation": ("Momentum update) on 8 devices, auto_parallel; global batch 256 rows", "IR dumped to ./rank_0 (save_graphs)"),
    "operator_parallel": ("SGD update) on 8 devices, semi_auto_parallel; global batch 256 rows",),
    "operator_parallel_layout": ("SGD update) on 8 devices, semi_auto_parallel; global batch 256 rows",),
    "optimizer_parallel": ("optimizer sharded (enable_parallel_optimizer): updates split: layer1.weight over 8, layer2.weight over 8",),
    "pipeline_parallel": ("global batch 128 rows: 4 data-parallel ranks' shares of 32 rows",
                          "pipeline: 2 stages of 4 devices, 4 micro-batches, 1f1b schedule",
                          "stage 0: backbone.layer1, backbone.relu1, backbone.layer2 + unmarked backbone.flatten"),
    "recompute": ("on 8 devices, data_parallel; global batch 64 rows: 8 data-parallel ranks' shares of 8 rows", "recomputed in the backward: net.relu2, net.relu1"),
    "high_dimension_tensor_parallel": ("Network(x) planned as a forward pass on 8 devices, semi_auto_parallel",),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(SAYS))
def test_a_sample_runs_unchanged_on_8_mpi_ranks_as_one_device_doing_what_its_settings_say(tmp_path, name):
    """The sample with only its imports renamed, ``mpiexec -n 8``, AUTOSTRAT_CHECK=1: every
    planned step (or call) checked against one device, bytes measured = predicted."""
    run = run_sample(name, tmp_path, ranks=8)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    for line in SAYS[name]:
        assert line in run.stdout, line
    if name == "high_dimension_tensor_parallel":
        assert re.search(r"net\(x\): 1 planned call\(s\) checked against one device: .*: OK", run.stdout)
    else:
        steps = 1 if name == "recompute" else 20  # recompute's ranks read 8 rows each: one batch
        assert re.search(rf"functional loop: {steps} planned training step\(s\) checked against one device .*"
                         rf"bytes per phase measured = predicted: OK", run.stdout)
    assert "Traceback" not in run.stderr
