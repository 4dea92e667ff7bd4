"""2-D tensor-parallel Layouts (issue #31): the shard calls of MindSpore's samples
high_dimension_tensor_parallel.py (``enable_nd_tp``) and advanced_distributed_operator_parallel.py
(a dim split over two device axes), on networks of the samples' shapes, run on 8 ranks (threads)
equal to one device; the collectives are those MindSpore 2.10's IR shows for the same calls
(tests/fixtures/mindspore/README.md, "2-D tensor parallel")."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import autostrat as ms
from autostrat import nn, ops
from autostrat.common.initializer import initializer
from autostrat.errors import ConfigError, LayoutError
from autostrat.frontend.train import TrainOneStepCell, WithLossCell
from autostrat.parallel import Layout
from autostrat.runtime import launcher
from autostrat.runtime.job import make_job
from autostrat.runtime.local import run_job_locally

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures" / "mindspore"


@pytest.fixture(autouse=True)
def _clean():
    ms.set_auto_parallel_context(parallel_mode="semi_auto_parallel", device_num=8)
    yield
    ms.reset_auto_parallel_context()


class HighDimension(nn.Cell):
    """high_dimension_tensor_parallel.py's Network."""

    def __init__(self):
        super().__init__()
        self.fc1_weight = ms.Parameter(initializer("normal", [256, 512], ms.float32))
        self.fc2_weight = ms.Parameter(initializer("normal", [512, 256], ms.float32))
        self.matmul1 = ops.MatMul()
        self.relu = ops.ReLU()
        self.matmul2 = ops.MatMul()

    def construct(self, x):
        x = self.matmul1(x, self.fc1_weight)
        x = self.relu(x)
        return self.matmul2(x, self.fc2_weight)


def high_dimension_net() -> HighDimension:
    """The sample's shard calls, as it writes them (keyword in_strategy)."""
    net = HighDimension()
    in_layout = Layout((2, 4), ("x", "y"))
    net.matmul1.add_prim_attr("enable_nd_tp", True)
    net.matmul1.shard(in_strategy=(in_layout("None", ("x", "y")), in_layout("x", "y")))
    net.relu.shard(in_strategy=(in_layout("None", ("y", "x")),))
    net.matmul2.add_prim_attr("enable_nd_tp", True)
    net.matmul2.shard(in_strategy=(in_layout("None", ("y", "x")), in_layout("y", "x")))
    return net


class Advanced(nn.Cell):
    """advanced_distributed_operator_parallel.py's Network, its Flatten left to the input
    (a batch of 32 images of 28 x 28 arrives as [32, 784])."""

    def __init__(self):
        super().__init__()
        self.fc1_weight = ms.Parameter(initializer("normal", [28 * 28, 512], ms.float32))
        self.fc2_weight = ms.Parameter(initializer("normal", [512, 512], ms.float32))
        self.fc3_weight = ms.Parameter(initializer("normal", [512, 10], ms.float32))
        self.matmul1 = ops.MatMul()
        self.relu1 = ops.ReLU()
        self.matmul2 = ops.MatMul()
        self.relu2 = ops.ReLU()
        self.matmul3 = ops.MatMul()

    def construct(self, x):
        x = self.matmul1(x, self.fc1_weight)
        x = self.relu1(x)
        x = self.matmul2(x, self.fc2_weight)
        x = self.relu2(x)
        return self.matmul3(x, self.fc3_weight)


def advanced_net() -> Advanced:
    """The sample's shard calls, as it writes them (positional)."""
    net = Advanced()
    layout = Layout((2, 2, 2), ("dp", "sp", "mp"))
    net.matmul1.shard((layout("mp", ("sp", "dp")), layout(("sp", "dp"), "None")))
    net.relu1.shard(((4, 1),))
    layout2 = Layout((8,), ("tp",))
    net.matmul2.shard((layout2("None", "tp"), layout2("tp", "None")))
    net.relu2.shard(((8, 1),))
    return net


def _collectives(plan) -> list[tuple[str, str, int]]:
    return [(f"{edge.tensor}->{edge.consumer}", step.kind, step.bytes)
            for edge in plan.redistributions for step in edge.plan.steps if step.bytes]


def test_the_high_dimension_sample_runs_as_one_device_with_mindspores_gathers_and_scatters():
    """MindSpore's IR for these calls: per MatMul an AllGather of the activation (over y, 4
    ranks; then over x, 2), the product, and a ReduceScatter of its partial sum (over x, 2; then
    over y, 4). The same four collectives here, as redistributions between the three seeds of
    each MatMul (`layout.nd_tp`); a [1024, 32] float32 piece gathered over 4 ranks sends
    3 x 131 072 bytes."""
    plan = ms.parallelize(high_dimension_net(), nn.Tensor(shape=(1024, 256)))
    assert str(plan.ops["matmul1"].strategy) == "((1, 2), (2, 4))"
    assert str(plan.ops["matmul2"].strategy) == "((1, 4), (4, 2)) on [2, 4]: (-1, 0), (0, 1)"
    assert _collectives(plan) == [
        ("matmul1.nd_tp_input:0->matmul1", "AllGather", 393216),
        ("matmul1:0->matmul1.nd_tp_output", "ReduceScatter", 262144),
        ("matmul2.nd_tp_input:0->matmul2", "AllGather", 262144),
        ("matmul2:0->matmul2.nd_tp_output", "ReduceScatter", 393216),
    ]
    ir = (FIXTURES / "layout2d_hd_step_parallel_end.txt").read_text()
    mindspore = re.findall(r"= (AllGather|ReduceScatter)\(.*instance name: forward_op.*?rank_size: I64\((\d+)\)", ir)
    steps = [step for edge in plan.redistributions for step in edge.plan.steps if step.bytes]
    assert [(step.kind, str(step.group_size)) for step in steps] == mindspore == [
        ("AllGather", "4"), ("ReduceScatter", "2"), ("AllGather", "2"), ("ReduceScatter", "4")]
    assert [step.groups[0] for step in steps] == [(0, 1, 2, 3), (0, 4), (0, 4), (0, 1, 2, 3)]  # rank 0's: y, x, x, y
    check = run_job_locally(make_job(plan, steps=1))
    assert check.bytes_match and check.results_match, check.text


def test_the_3d_form_scatters_the_rows_as_mindspore_does():
    """The page's 3-D form, ``(layout(("z", "y"), "x"), layout(("x", "z"), "y"))``: MindSpore's IR
    reduce-scatters the product's rows (no transpose around the ReduceScatter), so the output's
    rows lie on (z, x); here too, and the result is one device's. (MindSpore keeps the weight
    split over z as given and gathers it before the product; autostrat keeps it in the product's
    layout, z repeated: the same result, more parameter memory.)"""
    ir = (FIXTURES / "layout2d_hd3_step_parallel_end.txt").read_text()
    two_d = (FIXTURES / "layout2d_hd_step_parallel_end.txt").read_text()
    assert "ReduceScatter" in ir and "PrimFunc_Transpose" not in ir and "PrimFunc_Transpose" in two_d
    net = HighDimension()
    layout = Layout((2, 2, 2), ("z", "y", "x"))
    net.matmul1.add_prim_attr("enable_nd_tp", True)
    net.matmul1.shard(in_strategy=(layout(("z", "y"), "x"), layout(("x", "z"), "y")))
    plan = ms.parallelize(net, nn.Tensor(shape=(1024, 256)))
    out = plan.ops["matmul1.nd_tp_output"].strategy
    assert str(out.input_layouts[0].tensor_map) == "((2, 0), 1)"
    assert str(plan.ops["matmul1"].strategy) == "((2, 2), (2, 2)) on [2, 2, 2]: (2, 0), (0, 1)"
    check = run_job_locally(make_job(plan, steps=1))
    assert check.bytes_match and check.results_match, check.text


def test_the_advanced_sample_trains_as_one_device():
    """A dim over two axes in another order than the device matrix's (("sp", "dp") on
    (dp, sp, mp)), a Layout over one axis, tuples: a training step (SGD) equal to one device's."""
    net = advanced_net()
    loss = WithLossCell(net, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"))
    cell = TrainOneStepCell(loss, nn.SGD(net.trainable_params(), 1e-2))
    plan = ms.parallelize(cell, nn.Tensor(shape=(32, 784)), nn.Tensor(shape=(32,), dtype=ms.int32))
    assert str(plan.ops["backbone.matmul1"].strategy) == "((2, 4), (4, 1)) on [2, 2, 2]: (0, (1, 2)), ((1, 2), -1)"
    check = run_job_locally(make_job(plan, steps=2))
    assert check.bytes_match and check.results_match, check.text


def test_a_weight_on_y_then_x_holds_the_numpy_slice_its_axes_name():
    """fc2_weight [512, 256] on ``layout("y", "x")`` over (2, 4) named (x, y): rank r sits at
    x = r // 4, y = r % 4 and holds rows y * 128 ... and columns x * 128 ...; the activation
    ``("None", ("y", "x"))`` holds columns block y * 2 + x of 8, y the major axis."""
    plan = ms.parallelize(high_dimension_net(), nn.Tensor(shape=(1024, 256)))
    weight = np.arange(512 * 256).reshape(512, 256)
    layout = plan.layouts["fc2_weight"]
    activation = plan.ops["relu"].strategy.input_layouts[0]
    for rank in range(8):
        x, y = divmod(rank, 4)
        (r0, r1), (c0, c1) = layout.slice_range(rank)
        np.testing.assert_array_equal(weight[r0:r1, c0:c1], weight[y * 128:(y + 1) * 128, x * 128:(x + 1) * 128])
        assert activation.slice_range(rank) == ((0, 1024), ((y * 2 + x) * 64, (y * 2 + x + 1) * 64))


@pytest.mark.parametrize("make, error, message", [
    (lambda: ops.ReLU().add_prim_attr("enable_nd_tp", True), ConfigError,
     "ReLU.add_prim_attr: autostrat acts on 'enable_nd_tp' of a MatMul or BatchMatMul only, got 'enable_nd_tp' on ReLU"),
    (lambda: ops.MatMul().add_prim_attr("primitive_target", "CPU"), ConfigError,
     "MatMul.add_prim_attr: autostrat acts on 'enable_nd_tp' of a MatMul or BatchMatMul only, got 'primitive_target'"),
    (lambda: ops.MatMul().add_prim_attr("enable_nd_tp", 1), ConfigError,
     "MatMul.add_prim_attr: enable_nd_tp is True or False, got 1"),
])
def test_prim_attrs_autostrat_does_not_act_on_are_refused(make, error, message):
    with pytest.raises(error, match=re.escape(message)):
        make()


@pytest.mark.parametrize("shard, error, message", [
    (lambda m, l: m.shard(((1, 8), (8, 1))), LayoutError, "matmul1: enable_nd_tp needs two Layouts (activation, weight)"),
    (lambda m, l: m.shard((l("None", ("x", "y")), l("x", "y")), out_strategy=(l("None", "y"),)), ConfigError,
     "matmul1: with enable_nd_tp the output's layout follows from the inputs'"),
    (lambda m, l: m.shard((l("None", ("x", "y")), Layout((8,), ("t",))("t", "None"))), LayoutError,
     "matmul1: enable_nd_tp: both Layouts must name one device matrix"),
])
def test_nd_tp_shards_it_cannot_run_are_refused_by_name(shard, error, message):
    net = HighDimension()
    net.matmul1.add_prim_attr("enable_nd_tp", True)
    shard(net.matmul1, Layout((2, 4), ("x", "y")))
    with pytest.raises(error, match=re.escape(message)):
        ms.parallelize(net, nn.Tensor(shape=(1024, 256)))


def test_keyword_and_positional_shards_of_layouts_plan_alike_and_run_as_one_device():
    """``shard(in_strategy=..., out_strategy=...)`` with Layouts (out: the output's layout the
    inputs imply, here on (y, x)) plans as the positional form does, and runs as one device."""
    layout = Layout((2, 4), ("x", "y"))
    plans = []
    for keyword in (True, False):
        net = HighDimension()
        matmul = ((layout("None", "None"), layout("None", ("y", "x"))), (layout("None", ("y", "x")),))
        relu = ((layout("None", ("y", "x")),), (layout("None", ("y", "x")),))
        for primitive, (ins, outs) in ((net.matmul1, matmul), (net.relu, relu)):
            primitive.shard(in_strategy=ins, out_strategy=outs) if keyword else primitive.shard(ins, outs)
        plans.append(ms.parallelize(net, nn.Tensor(shape=(1024, 256))))
    assert {n: str(o.strategy) for n, o in plans[0].ops.items()} == {n: str(o.strategy) for n, o in plans[1].ops.items()}
    assert str(plans[0].ops["matmul1"].strategy) == "((1, 1), (1, 8)) on [2, 4]: (-1, -1), (-1, (0, 1))"
    check = run_job_locally(make_job(plans[0], steps=1))
    assert check.bytes_match and check.results_match, check.text


def test_the_high_dimension_sample_trains_as_one_device():
    """The gathers and scatters of ``enable_nd_tp`` have their backward (Identity's): a training
    step (SGD) of the sample's net equals one device's, with the bytes it predicted."""
    net = high_dimension_net()
    loss = WithLossCell(net, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"))
    cell = TrainOneStepCell(loss, nn.SGD(net.trainable_params(), 1e-2))
    plan = ms.parallelize(cell, nn.Tensor(shape=(1024, 256)), nn.Tensor(shape=(1024,), dtype=ms.int32))
    check = run_job_locally(make_job(plan, steps=2))
    assert check.bytes_match and check.results_match, check.text


def test_without_enable_nd_tp_the_samples_layouts_are_refused_as_mindspore_refuses_them():
    """MindSpore 2.10 refuses the same shard calls without the attribute ("The shard size of
    reduce_dim is not equal for input0 and input1"); autostrat names the factor."""
    net = HighDimension()
    in_layout = Layout((2, 4), ("x", "y"))
    net.matmul1.shard(in_strategy=(in_layout("None", ("x", "y")), in_layout("x", "y")))
    with pytest.raises(LayoutError, match=re.escape("matmul1: factor 'k' is split into 8 parts by input 0 dim 1 but "
                                                    "into 2 parts by input 1 dim 0; both must agree")):
        ms.parallelize(net, nn.Tensor(shape=(1024, 256)))


class OneProduct(nn.Cell):
    """One MatMul or BatchMatMul of an activation and a weight."""

    def __init__(self, primitive, weight_shape):
        super().__init__()
        self.weight = ms.Parameter(initializer("normal", list(weight_shape), ms.float32))
        self.product = primitive

    def construct(self, x):
        return self.product(x, self.weight)


@pytest.mark.parametrize("primitive, weight_shape, input_shape, layouts", [
    # transpose_b: the weight is [n, k], so its Layout names (y, x) where the sample's names (x, y)
    (ops.MatMul(transpose_b=True), (512, 256), (64, 256), lambda l: (l("None", ("x", "y")), l("y", "x"))),
    (ops.BatchMatMul(), (4, 256, 512), (4, 64, 256), lambda l: (l("None", "None", ("x", "y")), l("None", "x", "y"))),
])
def test_nd_tp_with_a_transposed_weight_or_a_batch_runs_as_one_device(primitive, weight_shape, input_shape, layouts):
    net = OneProduct(primitive, weight_shape)
    net.product.add_prim_attr("enable_nd_tp", True)
    net.product.shard(in_strategy=layouts(Layout((2, 4), ("x", "y"))))
    plan = ms.parallelize(net, nn.Tensor(shape=input_shape))
    assert [step.kind for edge in plan.redistributions for step in edge.plan.steps if step.bytes][:2] == [
        "AllGather", "ReduceScatter"]
    check = run_job_locally(make_job(plan, steps=1))
    assert check.bytes_match and check.results_match, check.text


@pytest.mark.slow
def test_both_samples_train_on_8_mpi_ranks_as_one_device():
    """tests/mpi_layout_2d.py: one process per rank (mpiexec), each sample's net trained 2 steps."""
    command = [str(launcher.find_mpiexec()), "-n", "8", sys.executable, "-m", "mpi4py", "tests/mpi_layout_2d.py"]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600,
                            env=os.environ | {"PYTHONPATH": str(ROOT)})
    assert result.returncode == 0, result.stdout + result.stderr
    for sample in ("high_dimension_net", "advanced_net"):
        text = result.stdout.split(f"{sample}:")[1]
        assert "measured = predicted on every rank" in text and "(limit 1e-05): OK" in text, result.stdout
