"""Per-cell pipeline stages as MindSpore's pipeline sample marks them (`search.cell_stages`):
plain sub-cells marked, the flatten before them and the loss after them unmarked; the stage of
every op, marks against the network's order refused, `PipelineGradReducer`, and runs (threads,
Model.train, 8 MPI ranks) equal to one device that show their stages."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from autostrat import nn, ops, reset_auto_parallel_context, set_auto_parallel_context
from autostrat.errors import ConfigError
from autostrat.frontend.train import train, training_plan
from autostrat.runtime import launcher

ROOT = Path(__file__).resolve().parent.parent

STAGE_LINE = ("pipeline: 2 stages x 4 devices, 4 micro-batches, 1f1b (pipeline_stage of cells; stage 0: backbone.layer1, "
              "backbone.relu1, backbone.layer2 + unmarked backbone.flatten; stage 1: backbone.relu2, backbone.layer3 + "
              "unmarked loss_fn.one_hot, loss_fn.softmax_cross_entropy, loss_fn.reduce_mean)")


@pytest.fixture(autouse=True)
def _clean_context():
    reset_auto_parallel_context()
    yield
    reset_auto_parallel_context()


class MatMulCell(nn.Cell):
    """The sample's MatMulCell: one MatMul with its own Parameter."""

    def __init__(self, rows: int = 64, columns: int = 32):
        super().__init__()
        values = np.random.default_rng(3).standard_normal((rows, columns)).astype(np.float32) / 8
        self.param = nn.Parameter(nn.Tensor(values), name="param")
        self.matmul = ops.MatMul()

    def construct(self, x):
        return self.matmul(x, self.param)


class Network(nn.Cell):
    """The sample's Network on 8 x 8 images: flatten (a Reshape), layer1, relu1, layer2, relu2, layer3."""

    def __init__(self):
        super().__init__()
        self.flatten = ops.Reshape()
        self.layer1 = MatMulCell()
        self.relu1 = nn.ReLU()
        self.layer2 = nn.Dense(32, 32)
        self.relu2 = nn.ReLU()
        self.layer3 = nn.Dense(32, 10)

    def construct(self, x):
        x = self.flatten(x, (x.shape[0], 64))
        x = self.relu1(self.layer1(x))
        x = self.relu2(self.layer2(x))
        return self.layer3(x)


def _marked(net: Network, stages=(0, 0, 0, 1, 1)) -> Network:
    """The sample's marking (layer1, relu1, layer2 on stage 0; relu2, layer3 on stage 1)."""
    for cell, stage in zip((net.layer1, net.relu1, net.layer2, net.relu2, net.layer3), stages):
        cell.pipeline_stage = stage
    return net


def _inputs(batch: int = 32):
    return nn.Tensor(shape=(batch, 1, 8, 8)), nn.Tensor(shape=(batch,), dtype="int32")


def _step(net: Network, optimizer=None):
    set_auto_parallel_context(parallel_mode="semi_auto_parallel", device_num=8, pipeline_stages=2)
    loss = nn.WithLossCell(net, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"))
    return nn.TrainOneStepCell(nn.PipelineCell(loss, 4), optimizer or nn.SGD(net.trainable_params(), 1e-2))


# Every op's stage, written out from the sample's marking: forward ops by hand, a backward op
# as its forward op, an update as its parameter's first reader.
FORWARD_STAGES = {
    "backbone.flatten": 0, "backbone.layer1.matmul": 0, "backbone.relu1.relu": 0, "backbone.layer2.matmul": 0,
    "backbone.layer2.bias_add": 0, "backbone.relu2.relu": 1, "backbone.layer3.matmul": 1, "backbone.layer3.bias_add": 1,
    "loss_fn.one_hot": 1, "loss_fn.softmax_cross_entropy": 1, "loss_fn.reduce_mean": 1,
}
PARAMETER_STAGES = {"layer1.param": 0, "layer2.weight": 0, "layer2.bias": 0, "layer3.weight": 1, "layer3.bias": 1}


def _expected_stage(op: str) -> int:
    if op.startswith("optimizer/"):
        return PARAMETER_STAGES[op.removeprefix("optimizer/")]
    return FORWARD_STAGES[op.removeprefix("bprop/").split("/")[0]]


def test_every_op_runs_on_the_stage_the_samples_marks_give_it():
    plan = training_plan(_step(_marked(Network())), None, _inputs())[0]
    pipeline = plan.pipeline
    assert pipeline.origin == "pipeline_stage of cells" and pipeline.shared == frozenset()  # SGD: no step counters
    assert set(FORWARD_STAGES) <= set(pipeline.op_stages)
    assert {op: stage for op, stage in pipeline.op_stages.items()} == {op: _expected_stage(op) for op in pipeline.op_stages}
    assert pipeline.summary().splitlines()[0] == STAGE_LINE
    assert pipeline.to_dict()["cells"][0] == "backbone.layer1, backbone.relu1, backbone.layer2 + unmarked backbone.flatten"


@pytest.mark.parametrize("stages, message", [
    ((0, 0, 1, 0, 1), r"cell backbone.relu2 \(stage 0\) reads the output of cell backbone.layer2 \(stage 1\); stages must "
                      r"follow the network's order"),
    ((1, None, 0, 1, 1), r"cell backbone.layer2 \(stage 0\) reads the output of op backbone.relu1.relu \(unmarked: the "
                         r"stage of what it reads\) \(stage 1\)"),
    ((0, 0, 0, 0, 2), r"cell backbone.layer3 is marked for stage 2, but pipeline_stages is 2 \(stages 0 to 1\)"),
    ((0, 0, 0, 0, 0), r"no op runs on stage 1 of 2 \(pipeline_stages\)"),
])
def test_marks_against_the_networks_order_are_refused_naming_the_cells(stages, message):
    net = Network()
    for cell, stage in zip((net.layer1, net.relu1, net.layer2, net.relu2, net.layer3), stages):
        if stage is not None:
            cell.pipeline_stage = stage
    with pytest.raises(ConfigError, match=message):
        training_plan(_step(net), None, _inputs())


def test_a_run_of_the_marked_stages_equals_one_device():
    """On 8 threads, 2 stages x 4 devices, 4 micro-batches: loss curve and parameters equal the
    stand-alone run's, bytes as predicted, activations and gradients sent between the stages;
    the report shows the stages."""
    net = _marked(Network())
    report = train(_step(net, nn.Momentum(net.trainable_params(), 0.1, 0.9)), _inputs(), steps=3, log=None)
    assert report.ok, report.text
    assert report.loss_error <= 1e-5 and report.parameter_error <= 1e-5
    assert report.result.bytes_match and all(phases["pipeline"] > 0 for phases in report.result.measured)
    assert report.result.measured_peaks == report.result.predicted_peaks
    assert STAGE_LINE in report.text


def test_the_cell_list_split_is_still_searched():
    """No marks: a stack of repeated layers is split by the search, as before."""
    from autostrat.models import TransformerStack
    set_auto_parallel_context(parallel_mode="auto_parallel", device_num=8, pipeline_stages=2)
    net = TransformerStack(layers=4, hidden=32, heads=4, seq=8, batch=8)
    cell = nn.TrainOneStepCell(nn.PipelineCell(net, 4), nn.SGD(net.trainable_params(), 0.1))
    pipeline = training_plan(cell, None, net.example_inputs())[0].pipeline
    assert pipeline.origin == "searched" and pipeline.split.bounds == ((0, 3), (3, 6)) and not pipeline.cells


# -- PipelineGradReducer -----------------------------------------------------------------------


def test_the_grad_reducer_divides_by_the_loss_scale_and_otherwise_passes_the_gradients_on():
    net = Network()
    parameters = net.trainable_params()
    grads = tuple(nn.Tensor(np.full(p.shape, 3.0, np.float32)) for p in parameters)
    plain = nn.PipelineGradReducer(parameters)
    assert plain.is_pipeline_grad_reducer and plain.parameters == tuple(parameters) and plain.opt_shard is None
    assert plain(grads) == grads  # the plan's synchronisation already summed and reduced them
    scaled = nn.PipelineGradReducer(parameters, scale_sense=2.0)(grads)
    assert all(np.array_equal(g.asnumpy(), np.full(p.shape, 1.5, np.float32)) for g, p in zip(scaled, parameters))


@pytest.mark.parametrize("make, message", [
    (lambda p: nn.PipelineGradReducer(p, scale_sense=0), "scale_sense must be a positive finite number, got 0"),
    (lambda p: nn.PipelineGradReducer([1.0]), "parameters must be Parameters .optimizer.parameters., got float"),
    (lambda p: nn.PipelineGradReducer(p, opt_shard="yes"), "opt_shard must be None, True or False, got 'yes'"),
    (lambda p: nn.PipelineGradReducer(p)((p[0],)), "1 gradients for 5 parameters"),
    (lambda p: nn.PipelineGradReducer(p, opt_shard=True)(p), "opt_shard=True disagrees with the context's "
                                                             "enable_parallel_optimizer=False"),
])
def test_the_grad_reducer_refuses_what_it_cannot_mean(make, message):
    with pytest.raises(ConfigError, match=message):
        make(Network().trainable_params())


# -- as a MindSpore user writes it ---------------------------------------------------------------

SCRIPT = textwrap.dedent('''
    import math
    import numpy as np
    import autostrat as ms
    import autostrat.dataset as ds
    from autostrat import nn, ops, Parameter
    from autostrat.communication import init
    from autostrat.common.initializer import initializer, HeUniform
    from autostrat.train import LossMonitor, Model

    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.SEMI_AUTO_PARALLEL, pipeline_stages=2)
    init()
    ms.set_seed(1)


    class MatMulCell(nn.Cell):
        def __init__(self):
            super().__init__()
            self.param = Parameter(initializer(HeUniform(math.sqrt(5)), [64, 32]), name="param")
            self.matmul = ops.MatMul()

        def construct(self, x):
            return self.matmul(x, self.param)


    class Network(nn.Cell):
        def __init__(self):
            super().__init__()
            self.flatten = ops.Reshape()
            self.layer1 = MatMulCell()
            self.relu1 = nn.ReLU()
            self.layer2 = nn.Dense(32, 32)
            self.relu2 = nn.ReLU()
            self.layer3 = nn.Dense(32, 10)

        def construct(self, x):
            x = self.flatten(x, (x.shape[0], 64))
            x = self.relu1(self.layer1(x))
            x = self.relu2(self.layer2(x))
            return self.layer3(x)


    net = Network()
    net.layer1.pipeline_stage = 0
    net.relu1.pipeline_stage = 0
    net.layer2.pipeline_stage = 0
    net.relu2.pipeline_stage = 1
    net.layer3.pipeline_stage = 1
    rng = np.random.default_rng(0)
    images = rng.standard_normal((64, 1, 8, 8)).astype(np.float32)
    labels = rng.integers(0, 10, 64).astype(np.int32)
    data_set = ds.NumpySlicesDataset((images, labels), column_names=["image", "label"], shuffle=False).batch(32)
    optimizer = nn.SGD(net.trainable_params(), 1e-2)
    loss_fn = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    net_with_loss = nn.PipelineCell(nn.WithLossCell(net, loss_fn), 4)
    model = Model(net_with_loss, optimizer=optimizer)
    model.train(2, data_set, callbacks=[LossMonitor(1)])
''')


def _check_script_output(done) -> None:
    assert done.returncode == 0, done.stdout + done.stderr
    assert STAGE_LINE in done.stdout
    assert "measured = predicted on every rank" in done.stdout and "(limit 1e-05): OK" in done.stdout
    assert done.stdout.count("loss is") == 4  # 2 epochs of 2 steps


def test_model_train_of_the_marked_sample_on_8_threads_checks_itself(tmp_path):
    (tmp_path / "pipeline.py").write_text(SCRIPT)
    env = os.environ | {"AUTOSTRAT_CHECK": "1", "RANK_SIZE": "8", "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "pipeline.py"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    _check_script_output(done)


@pytest.mark.slow
def test_model_train_of_the_marked_sample_on_8_mpi_ranks_checks_itself(tmp_path):
    (tmp_path / "pipeline.py").write_text(SCRIPT)
    env = os.environ | {"AUTOSTRAT_CHECK": "1", "PYTHONPATH": str(ROOT)}
    command = [str(launcher.find_mpiexec()), "-n", "8", sys.executable, "pipeline.py"]
    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    _check_script_output(done)
