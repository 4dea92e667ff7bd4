"""The MindSpore-style front end: context, tensors, cells, primitives, tracing."""

from __future__ import annotations

import numpy as np
import pytest

from autostrat import ops
from autostrat.errors import ConfigError, LayoutError, RuleError
from autostrat.frontend import (
    current_context,
    get_auto_parallel_context,
    reset_auto_parallel_context,
    set_auto_parallel_context,
    trace,
)
from autostrat.models import FFN, GPT, MLP, ResNet
from autostrat.nn import Cell, Dense, Tensor
from autostrat.rules import op_types


@pytest.fixture(autouse=True)
def fresh_context():
    reset_auto_parallel_context()
    yield
    reset_auto_parallel_context()


def test_context_round_trip_and_frozen_snapshot():
    set_auto_parallel_context(parallel_mode="auto_parallel", search_mode="sharding_propagation", device_num=8)
    snapshot = current_context()
    assert get_auto_parallel_context("parallel_mode") == "auto_parallel" and snapshot.device_num == 8
    set_auto_parallel_context(device_num=4)
    assert snapshot.device_num == 8 and current_context().device_num == 4


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"parallel_mod": "auto_parallel"}, r"unknown auto-parallel context key 'parallel_mod'; valid keys: parallel_mode, search_mode"),
        ({"parallel_mode": "hybrid"}, r"parallel_mode must be one of auto_parallel, data_parallel, semi_auto_parallel, stand_alone; got 'hybrid'"),
        ({"search_mode": "dynamic_programming"}, r"search_mode must be one of integer_programming, sharding_propagation; got 'dynamic_programming'"),
        ({"device_num": 0}, r"device_num must be a positive integer, got 0"),
        ({"global_rank": -1}, r"global_rank must be a non-negative integer, got -1"),
        ({"device_num": 4, "global_rank": 4}, r"global_rank 4 must be below device_num 4"),
        ({"full_batch": "yes"}, r"full_batch must be True or False, got 'yes'"),
        ({"strategy_ckpt_save_file": 3}, r"strategy_ckpt_save_file must be a file path string, got 3"),
        ({"refine": "gurobi"}, r"refine must be one of None, cpsat, solve; got 'gurobi'"),
        ({"coarsen": "more"}, r"coarsen must be one of none, exact, layers; got 'more'"),
        ({"refine_time_limit": 0}, r"refine_time_limit must be a positive number of seconds, got 0"),
        ({"max_device_memory": "16 parsecs"}, r"max_device_memory must be a positive number of bytes or a string such as '16GB', got '16 parsecs'"),
        ({"cost_model": "joules"}, r"cost_model must be one of bytes, time; got 'joules'"),
        ({"device_flops": "fast"}, r"device_flops must be a number such as 9.894e\+14, got 'fast'"),
        ({"inter_server_bandwidth": 0}, r"inter_server_bandwidth must be a finite number > 0 \(bytes/s\), got 0"),
        ({"intra_server_latency": -1e-6}, r"intra_server_latency must be a finite number >= 0 \(seconds\), got -1e-06"),
        ({"devices_per_server": 2.5}, r"devices_per_server must be a positive integer, got 2.5"),
    ],
)
def test_context_errors(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        set_auto_parallel_context(**kwargs)


def test_hardware_keys_reach_the_search():
    set_auto_parallel_context(cost_model="time", device_flops="1e15", inter_server_bandwidth=25e9, devices_per_server=4)
    options = current_context().search_options()
    assert options.cost_model == "time" and options.hardware.device_flops == 1e15
    assert options.hardware.inter_server_bandwidth == 25e9 and options.hardware.devices_per_server == 4
    assert options.hardware.intra_server_bandwidth == 450e9  # the default H100 server's NVLink


def test_context_get_unknown_key():
    with pytest.raises(ConfigError, match="unknown auto-parallel context key 'devices'"):
        get_auto_parallel_context("devices")


def test_tensor_from_data_or_shape():
    assert Tensor(np.zeros((2, 3), np.int32)).dtype == "int32"
    assert Tensor(shape=[4, 5], dtype=np.float16).dtype == "float16"
    with pytest.raises(ConfigError, match=r"a Tensor needs input data, or shape="):
        Tensor()
    with pytest.raises(ConfigError, match=r"Tensor shape must be positive integers, got \(0, 2\)"):
        Tensor(shape=(0, 2))
    with pytest.raises(ConfigError, match=r"expected a numpy dtype or its name such as 'float32', got 'floaty'"):
        Tensor(shape=(2,), dtype="floaty")
    with pytest.raises(ConfigError, match=r"has no data \(shape-only\)"):
        Tensor(shape=(2,)).asnumpy()


def test_tutorial_ffn_traces_with_attribute_path_names():
    graph = trace(FFN(), Tensor(shape=(64, 64)), device_num=8)
    assert list(graph.ops) == ["dense1.matmul", "dense1.bias_add", "relu", "dense2.matmul", "dense2.bias_add"]
    assert [t.name for t in graph.parameters()] == ["dense1.weight", "dense1.bias", "dense2.weight", "dense2.bias"]
    assert graph.ops["dense1.matmul"].inputs == ("x", "dense1.weight")
    assert graph.consumers("relu:0") == (("dense2.matmul", 0),)
    assert graph.outputs == ("dense2.bias_add:0",)
    assert sorted(graph.digraph.edges()) == sorted(
        [("dense1.matmul", "dense1.bias_add"), ("dense1.bias_add", "relu"), ("relu", "dense2.matmul"), ("dense2.matmul", "dense2.bias_add")]
    )


def test_seeds_are_recorded_and_validated_with_the_op_name():
    net = FFN()
    net.dense1.matmul.shard(((2, 1), (1, 4)))
    graph = trace(net, Tensor(shape=(64, 64)), device_num=8)
    assert graph.ops["dense1.matmul"].in_strategy == ((2, 1), (1, 4))
    assert not graph.ops["relu"].is_seeded
    net.dense2.matmul.shard(((2, 4), (8, 1)))
    with pytest.raises(LayoutError, match=r"^dense2.matmul: factor 'k' is split into 4 parts by input 0 dim 1 but into 8"):
        trace(net, Tensor(shape=(64, 64)), device_num=8)


def test_shape_errors_name_the_op():
    with pytest.raises(RuleError, match=r"^dense1.matmul: MatMul: input 1 dim 0 has size 64 but its factors give k=32"):
        trace(FFN(), Tensor(shape=(64, 32)))


def test_shard_form_is_checked():
    with pytest.raises(ConfigError, match=r"MatMul.shard in_strategy must be a tuple of tuples of integers such as \(\(2, 1\), \(1, 4\)\), or of Layouts such as \(layout\('dp', 'None'\),\), got \(2, 4\)"):
        ops.MatMul().shard((2, 4))


def test_a_primitive_called_twice_gets_a_stable_suffix():
    class Twice(Cell):
        def __init__(self):
            super().__init__()
            self.relu = ops.ReLU()

        def construct(self, x):
            return ops.Neg()(self.relu(self.relu(x)))

    graph = trace(Twice(), Tensor(shape=(4, 4)))
    assert list(graph.ops) == ["relu", "relu_1", "neg"]


def test_primitives_for_every_registered_op():
    assert all(hasattr(ops, op_type) for op_type in op_types())
    assert ops.ReduceSum(True).attrs == {"keep_dims": True}
    with pytest.raises(ConfigError, match=r"MatMul\(\) got unknown argument 'transpose_x1'; it accepts transpose_a, transpose_b"):
        ops.MatMul(transpose_x1=True)
    with pytest.raises(ConfigError, match=r"ReLU\(\) takes at most 0 arguments \(\), got 1"):
        ops.ReLU(1)
    with pytest.raises(ConfigError, match=r"Reshape takes tensors followed by shape; got 3 arguments"):
        ops.Reshape()(Tensor(np.ones(4)), (2, 2), 1)


def test_eager_calls_run_the_kernels():
    out = ops.ReduceSum(keep_dims=True)(Tensor(np.ones((2, 3), np.float32)), 1)
    assert out.shape == (2, 1) and out.asnumpy().tolist() == [[3.0], [3.0]]
    assert ops.Concat(1)((Tensor(np.ones((2, 1))), Tensor(np.zeros((2, 2))))).shape == (2, 3)


def test_cell_must_call_super_init():
    class Broken(Cell):
        def __init__(self):
            self.relu = ops.ReLU()

    with pytest.raises(ConfigError, match=r"Broken.__init__ must call super\(\).__init__\(\) before setting 'relu'"):
        Broken()


def test_construct_must_return_traced_tensors():
    class Nothing(Cell):
        def construct(self, x):
            return 3

    with pytest.raises(ConfigError, match=r"Nothing.construct must return the tensors it computed, got 3"):
        trace(Nothing(), Tensor(shape=(2,)))


def test_shape_only_tensor_from_outside_is_rejected():
    outside = Tensor(shape=(2, 2))

    class Leaky(Cell):
        def __init__(self):
            super().__init__()
            self.add = ops.Add()

        def construct(self, x):
            return self.add(x, outside)

    with pytest.raises(ConfigError, match=r"add: a shape-only tensor that is no input of construct was passed to it"):
        trace(Leaky(), Tensor(shape=(2, 2)))


def test_constants_and_shared_parameters():
    class Shared(Cell):
        def __init__(self):
            super().__init__()
            self.first = Dense(4, 4)
            self.second = Dense(4, 4)
            self.second.weight = self.first.weight  # tied weights
            self.scale = ops.Mul()

        def construct(self, x):
            return self.scale(self.second(self.first(x)), Tensor(np.float32(2)))

    graph = trace(Shared(), Tensor(shape=(2, 4)))
    assert graph.ops["second.matmul"].inputs[1] == "first.weight"
    assert graph.tensors["constant_0"].kind == "constant" and graph.values["constant_0"].asnumpy() == 2


def test_built_in_models_trace_and_run_eagerly():
    gpt = GPT(layers=1, hidden=32, heads=4, seq=8, batch=2, vocab=64)
    graph = trace(gpt, *gpt.example_inputs())
    assert graph.tensors[graph.outputs[0]].shape == ()
    assert {"BatchMatMul", "Softmax", "LayerNorm", "Gather", "OneHot", "Reshape", "Transpose", "GeLU"} <= {
        op.op_type for op in graph.ops.values()
    }
    loss = float(gpt(*gpt.example_inputs(with_data=True)).asnumpy())
    assert abs(loss - np.log(64)) < 0.5  # random initialisation predicts nearly uniformly
    assert len(trace(MLP(layers=3), Tensor(shape=(8, 64))).ops) == 8
    resnet = ResNet(blocks=1, channels=8, classes=4)
    assert "blocks.0.conv1.conv2d" in trace(resnet, Tensor(shape=(4, 3, 8, 8)), Tensor(shape=(4,), dtype="int32")).ops


def test_a_backward_op_seed_pins_the_training_step_and_is_refused_in_a_forward_pass():
    from autostrat.autodiff import SGD
    from autostrat.frontend.api import plan_for
    from autostrat.frontend.context import ParallelContext

    context = ParallelContext(device_num=4, parallel_mode="semi_auto_parallel")
    forward = {"dense1.matmul": (((1, 1), (1, 4)), None)}
    weight_gradient = {"bprop/dense1.matmul/mat_mul_1": (((1, 1), (1, 4)), None)}  # the weight's columns, not the rows' sums
    plan = plan_for(FFN(), (Tensor(shape=(64, 64)),), context, forward | weight_gradient, optimizer=SGD())
    op = plan.ops["bprop/dense1.matmul/mat_mul_1"]
    assert op.origin == "seed" and op.strategy.to_tuples() == ((1, 1), (1, 4))
    unseeded = plan_for(FFN(), (Tensor(shape=(64, 64)),), context, forward, optimizer=SGD())
    assert unseeded.ops["bprop/dense1.matmul/mat_mul_1"].strategy.to_tuples() == ((4, 1), (4, 1))
    with pytest.raises(ConfigError, match=r"strategies\.bprop/dense1\.matmul/mat_mul_1: the graph has no op named"):
        plan_for(FFN(), (Tensor(shape=(64, 64)),), context, forward | weight_gradient)
