"""Strategy checkpoints saved by MindSpore 2.10 (tests/fixtures/mindspore, made by its dry run)
load as seeds: protobuf and JSON alike, names resolved against the traced Cell tree, and the
plan they give is MindSpore's own."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest

from autostrat import nn, ops, reset_auto_parallel_context, set_auto_parallel_context
from autostrat.common.initializer import initializer
from autostrat.errors import ConfigError
from autostrat.frontend import trace
from autostrat.frontend.api import parallelize, plan_for
from autostrat.frontend.context import current_context
from autostrat.frontend.train import TrainOneStepCell, WithLossCell, train
from autostrat.models import FFN
from autostrat.search.mindspore_checkpoint import decode, encode, read_mindspore_checkpoint, resolve_names

FIXTURES = Path(__file__).parent / "fixtures" / "mindspore"
MINDSPORE_PLAN = {"dense1.matmul": "((2, 1), (1, 4))", "dense1.bias_add": "((2, 4), (4,))",
                  "dense2.matmul": "((2, 4), (4, 1))", "dense2.bias_add": "((2, 1), (1,))"}


@pytest.fixture(autouse=True)
def _clean():
    yield
    reset_auto_parallel_context()


@pytest.mark.parametrize("phase", ["fwd", "train"])
def test_the_protobuf_and_the_json_mindspore_wrote_hold_the_same_seeds(phase):
    binary = read_mindspore_checkpoint(FIXTURES / f"ffn_{phase}_strategy.ckpt")
    text = read_mindspore_checkpoint(FIXTURES / f"ffn_{phase}_strategy.json")
    assert binary == text and binary["MatMul_dense1.weight"] == (((2, 1), (1, 4)), None) and len(binary) == 4


def test_the_layouts_decode_with_negative_tensor_map_entries():
    layouts = decode((FIXTURES / "ffn_train_strategy.ckpt").read_bytes())["parallel_layout_item"]
    by_name = {item["param_name"]: item["parallel_layouts"][0] for item in layouts}
    assert by_name["dense1.weight"]["tensor_map"] == [{"dim": [-1, 0]}] and by_name["dense1.weight"]["dev_matrix"] == [{"dim": [2, 4]}]
    assert set(by_name) == {"dense1.weight", "dense1.bias", "dense2.weight", "dense2.bias", "moments.dense1.weight",
                            "moments.dense1.bias", "moments.dense2.weight", "moments.dense2.bias"}


@pytest.mark.parametrize("phase", ["fwd", "train"])
def test_the_encoder_writes_mindspores_bytes_exactly(phase):
    data = (FIXTURES / f"ffn_{phase}_strategy.ckpt").read_bytes()
    assert encode(decode(data)) == data


def test_packed_and_unpacked_repeated_numbers_decode_alike():
    assert decode(bytes([0x08, 0x02, 0x08, 0x01]), "Dims") == decode(bytes([0x0A, 0x02, 0x02, 0x01]), "Dims") == {"dim": [2, 1]}
    minus_one = bytes([0x08]) + bytes([0xFF] * 9 + [0x01])
    assert decode(minus_one, "Dims") == {"dim": [-1]}


@pytest.mark.parametrize("suffix", ["ckpt", "json"])
def test_a_mindspore_checkpoint_gives_mindspores_own_plan(suffix):
    """The tutorial FFN on 8 devices seeded by MindSpore's checkpoint: MindSpore's strategies,
    and its AllReduce of dense2's partial sum (12 288 bytes per device, as its IR shows)."""
    set_auto_parallel_context(parallel_mode="auto_parallel", device_num=8,
                              strategy_ckpt_load_file=str(FIXTURES / f"ffn_fwd_strategy.{suffix}"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the AllReduce between two loaded seeds was in MindSpore's plan: no warning
        plan = parallelize(FFN(), nn.Tensor(shape=(64, 64)))
    assert {name: str(plan.ops[name].strategy) for name in MINDSPORE_PLAN} == MINDSPORE_PLAN
    assert plan.total_bytes == 12288 and [step.kind for e in plan.redistributions for step in e.plan.steps] == ["AllReduce"]


def test_a_mindspore_training_checkpoint_seeds_a_training_step_that_equals_one_device():
    set_auto_parallel_context(parallel_mode="auto_parallel", device_num=8,
                              strategy_ckpt_load_file=str(FIXTURES / "ffn_train_strategy.ckpt"))
    net = FFN()
    cell = TrainOneStepCell(WithLossCell(net, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")),
                            nn.Momentum(net.trainable_params(), 0.1, 0.9))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        report = train(cell, (nn.Tensor(shape=(64, 64)), nn.Tensor(shape=(64,), dtype="int32")), steps=2, log=None)
    assert report.ok, report.text
    from autostrat.frontend.train import training_plan
    plan = training_plan(cell, None, (nn.Tensor(shape=(64, 64)), nn.Tensor(shape=(64,), dtype="int32")))[0]
    assert {name: str(plan.ops["backbone." + name].strategy) for name in MINDSPORE_PLAN} == MINDSPORE_PLAN


def test_bad_mindspore_checkpoints_are_refused(tmp_path):
    broken = tmp_path / "broken.ckpt"
    broken.write_bytes((FIXTURES / "ffn_fwd_strategy.ckpt").read_bytes()[:-7])
    with pytest.raises(ConfigError, match="not a MindSpore strategy checkpoint"):
        read_mindspore_checkpoint(broken)
    graph = trace(FFN(), nn.Tensor(shape=(64, 64)))
    with pytest.raises(ConfigError, match="MindSpore op 'MatMul_dense3.weight' \\(MatMul reading parameter 'dense3.weight'\\) matches no op"):
        resolve_names(graph, {"MatMul_dense3.weight": 1}, "ckpt")


class TutorialDense(nn.Cell):
    """MindSpore's tutorial Dense (MatMul + Add, weight (in, out)), as its FFN is written there."""

    def __init__(self, in_channels, out_channels):
        super().__init__()
        self.weight = nn.Parameter(initializer("normal", (in_channels, out_channels)))
        self.bias = nn.Parameter(initializer("normal", (out_channels,)))
        self.matmul, self.add = ops.MatMul(), ops.Add()

    def construct(self, x):
        return self.add(self.matmul(x, self.weight), self.bias)


class TutorialFFN(nn.Cell):
    def __init__(self):
        super().__init__()
        self.dense1, self.relu, self.dense2 = TutorialDense(64, 64), ops.ReLU(), TutorialDense(64, 64)

    def construct(self, x):
        return self.dense2(self.relu(self.dense1(x)))


def _tutorial_plan(phase: str, seeded: bool = False, **context):
    """The tutorial FFN's plan on 8 devices (a Momentum step when training), under `context`;
    `seeded`: with the tutorial's ``dense1.matmul.shard(((2, 1), (1, 4)))``."""
    set_auto_parallel_context(parallel_mode="auto_parallel", device_num=8, **context)
    net = TutorialFFN()
    if seeded:
        net.dense1.matmul.shard(((2, 1), (1, 4)))
    if phase == "fwd":
        return plan_for(net, (nn.Tensor(shape=(64, 64)),), current_context())
    cell = TrainOneStepCell(WithLossCell(net, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")),
                            nn.Momentum(net.trainable_params(), 0.1, 0.9))
    return plan_for(cell, (nn.Tensor(shape=(64, 64)), nn.Tensor(shape=(64,), dtype="int32")), current_context())


def _by_name(fields: dict) -> tuple[dict, dict]:
    strategies = {item["node_name"]: item["parallel_strategys"] for item in fields["parallel_strategy_item"]}
    return strategies, {item["param_name"]: item["parallel_layouts"] for item in fields["parallel_layout_item"]}


@pytest.mark.parametrize("phase", ["fwd", "train"])
def test_mindspores_plan_saved_by_autostrat_is_the_protobuf_mindspore_saved(tmp_path, phase):
    """Seeded by MindSpore's checkpoint, autostrat's protobuf checkpoint holds MindSpore's items
    (names, strategies, stages, every parameter's and state's layout) field for field; only the
    save counter ``current_stage`` and MindSpore's hash order of the items differ."""
    mindspore = FIXTURES / f"ffn_{phase}_strategy.ckpt"
    _tutorial_plan(phase, strategy_ckpt_load_file=str(mindspore), strategy_ckpt_save_file=str(tmp_path / "s.ckpt"))
    ours, theirs = decode((tmp_path / "s.ckpt").read_bytes()), decode(mindspore.read_bytes())
    assert _by_name(ours) == _by_name(theirs) and len(ours["parallel_layout_item"]) == (8 if phase == "train" else 4)


@pytest.mark.parametrize("phase", ["fwd", "train"])
def test_mindspores_plan_saved_by_autostrat_is_the_json_mindspore_saved(tmp_path, phase):
    mindspore = FIXTURES / f"ffn_{phase}_strategy.json"
    _tutorial_plan(phase, strategy_ckpt_load_file=str(mindspore), strategy_ckpt_save_file=str(tmp_path / "s.json"))
    ours, theirs = json.loads((tmp_path / "s.json").read_text()), json.loads(mindspore.read_text())
    assert ours["parallel_strategy_item"] == theirs["parallel_strategy_item"]
    for layout in ours["parallel_layout_item"].values():
        del layout["slice_shape"]  # autostrat's addition, for re-slicing tools
    assert ours["parallel_layout_item"] == theirs["parallel_layout_item"]


@pytest.mark.parametrize("phase", ["fwd", "train"])
def test_mindspore_compiled_the_strategies_of_autostrats_checkpoint(tmp_path, phase):
    """MindSpore 2.10 (dry run, see fixtures/mindspore/README.md) compiled the unseeded tutorial
    FFN from autostrat's protobuf checkpoint and saved what it compiled: autostrat's strategies,
    not MindSpore's own (dense2's bias Add ((2, 4), (4,)) or ((8, 1), (1,)) where MindSpore
    picks ((2, 1), (1,))). The fixture is MindSpore's file; this asserts autostrat still
    writes the plan MindSpore compiled."""
    _tutorial_plan(phase, seeded=True, strategy_ckpt_save_file=str(tmp_path / "s.json"))
    compiled = json.loads((FIXTURES / f"ffn_{phase}_compiled_from_autostrat.json").read_text())["parallel_strategy_item"]
    own = json.loads((FIXTURES / f"ffn_{phase}_strategy.json").read_text())["parallel_strategy_item"]
    written = json.loads((tmp_path / "s.json").read_text())["parallel_strategy_item"]
    assert written == compiled and compiled["Add_dense2.bias"] != own["Add_dense2.bias"]


def _gpt_plan(**context):
    """configs/gpt.yaml's GPT on 8 devices under `context`: seeded by its Megatron seeds unless
    a checkpoint is loaded."""
    from autostrat.frontend.config import load_config
    from autostrat.frontend.run import plan_config
    config = load_config(Path(__file__).parent.parent / "configs" / "gpt.yaml")
    if "strategy_ckpt_load_file" in context:
        set_auto_parallel_context(parallel_mode="auto_parallel", device_num=8, **context)
        return plan_for(config.network(), config.inputs, current_context())
    set_auto_parallel_context(**context)
    return plan_config(config)[0]


def test_mindspores_gpt_checkpoint_seeds_its_plan_and_autostrat_writes_it_back(tmp_path):
    """MindSpore 2.10 compiled the GPT sample (fixtures/mindspore/gpt_mindspore.py, the same Cell
    tree) with the config's Megatron seeds; that checkpoint seeds autostrat's GPT, whose
    checkpoint then holds MindSpore's 32 items as MindSpore wrote them."""
    mindspore = FIXTURES / "gpt_megatron_strategy.json"
    plan = _gpt_plan(strategy_ckpt_load_file=str(mindspore), strategy_ckpt_save_file=str(tmp_path / "s.json"))
    ours = json.loads((tmp_path / "s.json").read_text())["parallel_strategy_item"]
    assert ours == json.loads(mindspore.read_text())["parallel_strategy_item"] and len(ours) == 32
    assert plan.total_bytes == 236544  # MindSpore's plan, priced by autostrat


def test_mindspore_compiled_autostrats_gpt_plan():
    """MindSpore compiled the GPT sample from autostrat's protobuf checkpoint without a shard
    call of its own and saved what it compiled: autostrat's items, 6 of which differ from
    MindSpore's own choice for the same Megatron seeds."""
    from autostrat.search.checkpoint import mindspore_items
    written = mindspore_items(_gpt_plan())
    compiled = json.loads((FIXTURES / "gpt_compiled_from_autostrat.json").read_text())["parallel_strategy_item"]
    own = json.loads((FIXTURES / "gpt_megatron_strategy.json").read_text())["parallel_strategy_item"]
    assert written == compiled
    assert sorted(name for name in own if own[name] != compiled[name]) == [
        "BiasAdd_blocks.0.attention.projection.bias", "BiasAdd_blocks.0.ffn2.bias", "BiasAdd_blocks.1.attention.projection.bias",
        "BiasAdd_blocks.1.ffn2.bias", "LayerNorm_ln_final.gamma", "MatMul_lm_head.weight"]
