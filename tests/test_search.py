"""Sharding propagation end to end: MindSpore's tutorial, backward and diamond propagation,
modes, warnings, checkpoints, dumps and determinism."""

from __future__ import annotations

import json

import numpy as np
import pytest

from autostrat import ops
from autostrat.errors import ConfigError
from autostrat.frontend import trace
from autostrat.models import FFN
from autostrat.nn import Cell, Parameter, Tensor
from autostrat.search import SearchOptions, load_checkpoint_seeds, search
from autostrat.search.dump import annotated_text, sliced_text


def tutorial_plan(device_num: int = 8):
    net = FFN()
    net.dense1.matmul.shard(((2, 1), (1, 4)))
    return search(trace(net, Tensor(shape=(64, 64)), device_num=device_num), device_num)


def strategies(plan) -> dict[str, str]:
    return {name: str(op.strategy) for name, op in plan.ops.items()}


def test_mindspore_tutorial_plan():
    plan = tutorial_plan()
    assert strategies(plan) == {
        "dense1.matmul": "((2, 1), (1, 4))",
        "dense1.bias_add": "((2, 4), (4,))",
        "relu": "((2, 4),)",
        "dense2.matmul": "((2, 4), (4, 1))",
        "dense2.bias_add": "((2, 4), (4,))",
    }
    [edge] = plan.redistributions
    assert (edge.tensor, edge.consumer) == ("dense2.matmul:0", "dense2.bias_add")
    assert [step.kind for step in edge.plan.steps] == ["ReduceScatter"] and edge.plan.cost == 6144
    # MindSpore and JAX resolve the partial sum with an AllReduce: 2 (g-1) s / g = 12 288 bytes.
    assert plan.total_bytes == 6144 < 2 * 3 * (32 * 64 * 4) // 4


class MatMulReLU(Cell):
    def __init__(self):
        super().__init__()
        self.weight = Parameter(np.zeros((32, 64), np.float32))
        self.matmul = ops.MatMul()
        self.relu = ops.ReLU()

    def construct(self, x):
        return self.relu(self.matmul(x, self.weight))


def test_propagation_runs_backward_to_producers():
    net = MatMulReLU()
    net.relu.shard(((1, 8),))
    plan = search(trace(net, Tensor(shape=(64, 32)), device_num=8), 8)
    assert str(plan.ops["matmul"].strategy) == "((1, 1), (1, 8))"
    assert plan.ops["matmul"].origin == "propagated from relu" and plan.total_bytes == 0


class Diamond(Cell):
    def __init__(self):
        super().__init__()
        self.relu, self.sigmoid, self.tanh, self.add = ops.ReLU(), ops.Sigmoid(), ops.Tanh(), ops.Add()

    def construct(self, x):
        y = self.relu(x)
        return self.add(self.sigmoid(y), self.tanh(y))


def test_diamond_takes_the_seed_everywhere():
    net = Diamond()
    net.relu.shard(((8, 1),))
    plan = search(trace(net, Tensor(shape=(64, 32)), device_num=8), 8)
    assert strategies(plan) == {"relu": "((8, 1),)", "sigmoid": "((8, 1),)", "tanh": "((8, 1),)", "add": "((8, 1), (8, 1))"}
    assert plan.total_bytes == 0


def test_unreached_ops_get_all_ones_and_a_warning():
    plan = search(trace(Diamond(), Tensor(shape=(64, 32)), device_num=8), 8)
    assert set(strategies(plan).values()) == {"((1, 1),)", "((1, 1), (1, 1))"}
    assert all(op.origin == "default" for op in plan.ops.values())
    assert plan.warnings == ("4 op(s) reached by no seed keep the all-ones strategy: relu, sigmoid, tanh, add",)


def test_conflicting_seeds_get_a_redistribution_and_a_warning():
    net = Diamond()
    net.relu.shard(((8, 1),))
    net.sigmoid.shard(((1, 8),))
    plan = search(trace(net, Tensor(shape=(64, 32)), device_num=8), 8)
    assert str(plan.ops["sigmoid"].strategy) == "((1, 8),)" and plan.total_bytes > 0
    assert any(w.startswith("seeds of relu and sigmoid disagree on relu:0: a redistribution of") for w in plan.warnings)


class SharedWeight(Cell):
    def __init__(self):
        super().__init__()
        self.weight = Parameter(np.zeros((64, 64), np.float32))
        self.first, self.second = ops.MatMul(), ops.MatMul()

    def construct(self, x):
        return self.second(self.first(x, self.weight), self.weight)


def test_a_shared_parameter_seeded_two_ways_is_a_config_error():
    net = SharedWeight()
    net.first.shard(((1, 1), (1, 8)))
    net.second.shard(((1, 8), (8, 1)))
    with pytest.raises(ConfigError, match=r"parameter weight is shared by first and second, whose strategies want it in different layouts"):
        search(trace(net, Tensor(shape=(64, 64)), device_num=8), 8)


def test_data_parallel_and_semi_auto_modes():
    net = FFN()
    net.dense2.matmul.shard(((1, 1), (1, 8)))
    graph = trace(net, Tensor(shape=(64, 64)), device_num=8)
    dp = search(graph, 8, SearchOptions(mode="data_parallel"))
    assert all(op.origin == "data parallel" for op in dp.ops.values())
    assert str(dp.ops["dense2.matmul"].strategy) == "((8, 1), (1, 1))" and dp.total_bytes == 0
    semi = search(graph, 8, SearchOptions(mode="semi_auto_parallel"))
    assert str(semi.ops["dense2.matmul"].strategy) == "((1, 1), (1, 8))" and semi.ops["dense2.matmul"].origin == "seed"
    assert str(semi.ops["relu"].strategy) == "((8, 1),)"
    alone = search(graph, 8, SearchOptions(mode="stand_alone"))
    assert alone.device_num == 1 and alone.total_bytes == 0


def test_searching_twice_gives_byte_identical_json_and_dumps(tmp_path):
    first, second = tutorial_plan(), tutorial_plan()
    assert first.to_json() == second.to_json()
    first.dump_ir(tmp_path / "a")
    second.dump_ir(tmp_path / "b")
    for name in ("step_parallel_begin_0000.ir", "step_parallel_end_0001.ir"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()


def test_tutorial_dumps_match_golden(golden):
    plan = tutorial_plan()
    golden("ffn_step_parallel_begin_0000.ir", annotated_text(plan))
    golden("ffn_step_parallel_end_0001.ir", sliced_text(plan))


def test_strategy_checkpoint_round_trip(tmp_path):
    plan = tutorial_plan()
    path = tmp_path / "strategy.json"
    plan.save_strategy(path)
    data = json.loads(path.read_text())
    weight = data["parallel_layout_item"]["dense1.weight"]
    # MindSpore's layout: the size-1 axis of the MatMul's [2, 1, 4] left out, as MindSpore writes it.
    assert (weight["dev_matrix"], weight["tensor_map"], weight["slice_shape"]) == ([2, 4], [-1, 0], [64, 16])
    seeds = load_checkpoint_seeds(path)
    assert seeds["dense2.matmul"] == (((2, 4), (4, 1)), None)
    from autostrat.frontend.config import apply_seeds

    graph = apply_seeds(trace(FFN(), Tensor(shape=(64, 64)), device_num=8), seeds, 8)
    assert strategies(search(graph, 8)) == strategies(plan)


@pytest.mark.parametrize(
    "text, message",
    [
        ("{", r"not valid JSON at line 1, column 2"),
        ('{"items": []}', r"expected a JSON object with a 'parallel_strategy_item' list"),
        ('{"parallel_strategy_item": [{"node": "relu"}]}', r"parallel_strategy_item\[0\]: expected \{\"node_name\": ..., \"parallel_strategys\""),
        (
            '{"parallel_strategy_item": [{"node_name": "relu", "parallel_strategys": {"parallel_strategy": [8]}}]}',
            r"parallel_strategy_item\[0\].parallel_strategys.parallel_strategy: expected a list of \{\"dim\": \[...\]\}, got \[8\]",
        ),
    ],
)
def test_checkpoint_errors(tmp_path, text, message):
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message):
        load_checkpoint_seeds(path)


def test_megatron_seeds_make_every_middle_layer_communicate_like_megatron():
    from autostrat.frontend.config import apply_seeds
    from autostrat.models import GPT, megatron_seeds

    batch, seq, hidden, layers = 4, 16, 64, 3
    net = GPT(layers=layers, hidden=hidden, heads=8, seq=seq, batch=batch, vocab=128)
    graph = apply_seeds(trace(net, *net.example_inputs(), device_num=8), megatron_seeds(layers, 8), 8)
    plan = search(graph, 8)
    allreduce = 2 * 7 * (batch * seq * hidden * 4) // 8  # ring AllReduce of one [batch*seq, hidden] activation
    middle = [e for e in plan.redistributions if e.consumer.startswith("blocks.1.")]
    # Megatron-LM: one AllReduce after attention and one after the FFN. The plan sends the same bytes
    # as ReduceScatter + AllGather pairs (the LayerNorms run on row slices in between).
    assert sum(e.plan.cost for e in middle) == 2 * allreduce
    assert all(step.kind in ("ReduceScatter", "AllGather", "AllReduce", "Slice") for e in middle for step in e.plan.steps)
    assert all(op.origin != "default" for op in plan.ops.values())


def test_plans_are_identical_across_processes_and_hash_seeds(tmp_path):
    import os
    import subprocess
    import sys

    outputs = []
    for seed in ("1", "2"):
        out = tmp_path / f"plan{seed}.json"
        env = dict(os.environ, PYTHONHASHSEED=seed)
        subprocess.run([sys.executable, "-m", "autostrat", "search", "configs/gpt.yaml", "--out", str(out), "--dump-ir", str(tmp_path / seed)], check=True, env=env, capture_output=True)
        outputs.append(out.read_bytes() + (tmp_path / seed / "step_parallel_end_0001.ir").read_bytes())
    assert outputs[0] == outputs[1]
    assert b'"primitives": [' in outputs[0]


def test_strategy_checkpoint_through_the_context(tmp_path):
    from autostrat import parallelize, reset_auto_parallel_context, set_auto_parallel_context

    path = tmp_path / "ckpt.json"
    try:
        set_auto_parallel_context(parallel_mode="auto_parallel", device_num=8, strategy_ckpt_save_file=str(path))
        net = FFN()
        net.dense1.matmul.shard(((2, 1), (1, 4)))
        saved = parallelize(net, Tensor(shape=(64, 64)))
        set_auto_parallel_context(strategy_ckpt_save_file="", strategy_ckpt_load_file=str(path))
        loaded = parallelize(FFN(), Tensor(shape=(64, 64)))  # no .shard: the seeds come from the file
    finally:
        reset_auto_parallel_context()
    assert strategies(loaded) == strategies(saved)
    assert all(op.origin == "seed" for op in loaded.ops.values())
