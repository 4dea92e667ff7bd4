"""Strategy checkpoints of Layout-sharded nets, both ways, both formats (issue #31): the files
MindSpore 2.10 saved for two samples' shard calls (tests/fixtures/mindspore/README.md, "2-D tensor
parallel") seed autostrat op for op, and the files autostrat writes hold MindSpore's layouts
field for field and load into MindSpore. MindSpore is not needed: its files are fixtures."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

import autostrat as ms
from autostrat import nn
from autostrat.errors import ConfigError
from autostrat.layout import DeviceMatrix, Layout, Strategy, TensorMap
from autostrat.search.mindspore_checkpoint import decode, encode, read_mindspore_plan
from autostrat.search.mindspore_layouts import expanded, merged
from tests.test_layout_2d import Advanced, HighDimension, advanced_net, high_dimension_net

FIXTURES = Path(__file__).parent / "fixtures" / "mindspore"
SAMPLES = {  # net with the sample's shard calls, the same net unsharded, its input shape
    "hd": (high_dimension_net, HighDimension, (1024, 256)),
    "adv": (advanced_net, Advanced, (32, 784)),
}


@pytest.fixture(autouse=True)
def _clean():
    yield
    ms.reset_auto_parallel_context()


def _plan(sample: str, sharded: bool = True, **config):
    make_sharded, make_plain, shape = SAMPLES[sample]
    ms.set_auto_parallel_context(parallel_mode="semi_auto_parallel", device_num=8,
                                 **({"strategy_ckpt_config": config} if config else {}))
    return ms.parallelize(make_sharded() if sharded else make_plain(), nn.Tensor(shape=shape))


def _ops_mindspore_names(plan) -> dict[str, str]:
    """MindSpore's node name (``MatMul_fc1_weight``) -> the plan's op computing it."""
    return {f"{op.op_type}_{name}": op.name for op in plan.graph.ops.values() for name in op.inputs
            if plan.graph.tensors[name].kind == "parameter"}


@pytest.mark.parametrize("suffix", ["json", "ckpt"])
@pytest.mark.parametrize("sample", ["hd", "adv"])
def test_mindspores_layout_checkpoint_seeds_the_samples_shard_calls_op_for_op(sample, suffix):
    """Every op MindSpore's file names gets the strategy the sample's shard calls give it
    (axis order included), though MindSpore wrote an empty strategy for the Layout-sharded ones
    and cut fc1_weight's dim into sub-dims: the parameter's layout seeds it."""
    path = FIXTURES / f"layout2d_{sample}_strategy.{suffix}"
    seeded = _plan(sample, sharded=False, load_file=str(path))
    ms.reset_auto_parallel_context()
    sharded = _plan(sample)
    names = _ops_mindspore_names(sharded)
    written = json.loads((FIXTURES / f"layout2d_{sample}_strategy.json").read_text())["parallel_strategy_item"]
    assert sorted(written) == sorted(names)
    assert [name for name, item in written.items() if not item["parallel_strategy"]] != []
    for name, op in names.items():
        assert seeded.ops[op].strategy == sharded.ops[op].strategy, name


def test_the_protobuf_and_the_json_mindspore_wrote_hold_the_same_seeds_and_layouts():
    for sample in SAMPLES:
        seeds_ckpt, layouts_ckpt = read_mindspore_plan(FIXTURES / f"layout2d_{sample}_strategy.ckpt")
        seeds_json, layouts_json = read_mindspore_plan(FIXTURES / f"layout2d_{sample}_strategy.json")
        assert seeds_ckpt == seeds_json
        assert {name: layout[:2] for name, layout in layouts_ckpt.items()} == {
            name: (layout[0], tuple(merged(list(layout[1]), list(layout[2]), _shape(layout[2]), name)))
            for name, layout in layouts_json.items() if name in layouts_ckpt}
    assert layouts_ckpt["fc1_weight"] == ((2, 2, 2), ([1, 2], -1), None)
    assert layouts_json["fc1_weight"] == ((2, 2, 2), (1, 2, -1), (2, 392, 512))


def _shape(tensor_shape) -> tuple[int, ...]:
    """fc1_weight's [2, 392, 512] is [784, 512]; the other fixtures' shapes are not cut."""
    return (784, 512) if tuple(tensor_shape) == (2, 392, 512) else tuple(tensor_shape)


@pytest.mark.parametrize("sample", ["hd", "adv"])
def test_autostrats_json_holds_mindspores_layouts_field_for_field(sample, tmp_path):
    """The parameters' layout items equal MindSpore's (a dim over two axes cut into sub-dims);
    the strategy items too, except where MindSpore wrote an empty one for a Layout-sharded op,
    which it cannot load: there autostrat writes the tuples the layouts imply."""
    path = tmp_path / "s.json"
    plan = _plan(sample, save_file=str(path))
    ours, theirs = json.loads(path.read_text()), json.loads((FIXTURES / f"layout2d_{sample}_strategy.json").read_text())
    for name in plan.graph.parameters():
        mine = {k: v for k, v in ours["parallel_layout_item"][name.name].items() if k != "slice_shape"}
        assert mine == theirs["parallel_layout_item"][name.name], name.name
    for name, item in theirs["parallel_strategy_item"].items():
        tuples = [list(part) for part in plan.ops[_ops_mindspore_names(plan)[name]].strategy.to_tuples()]
        assert ours["parallel_strategy_item"][name] == {"parallel_strategy": item["parallel_strategy"] or tuples, "stage": 0}


def _by_name(fields: dict, kind: str, key: str) -> dict:
    return {item[key]: item for item in fields[kind]}


@pytest.mark.parametrize("sample", ["hd", "adv"])
def test_autostrats_protobuf_holds_mindspores_layouts_and_round_trips(sample, tmp_path):
    """Writing a dim over two axes no longer fails: one tensor_map message per dim, as MindSpore
    writes it; the layout items decode equal to MindSpore's, and both files re-encode byte for byte."""
    path = tmp_path / "s.ckpt"
    plan = _plan(sample, save_file=str(path))
    data, fixture = path.read_bytes(), (FIXTURES / f"layout2d_{sample}_strategy.ckpt").read_bytes()
    ours, theirs = decode(data), decode(fixture)
    assert encode(ours) == data and encode(theirs) == fixture
    layouts, mindspore = (_by_name(f, "parallel_layout_item", "param_name") for f in (ours, theirs))
    assert {t.name for t in plan.graph.parameters()} <= set(mindspore)
    assert all(layouts[name] == mindspore[name] for name in layouts)
    if sample == "adv":
        assert layouts["fc1_weight"]["parallel_layouts"][0]["tensor_map"] == [{"dim": [1, 2]}, {"dim": [-1]}]
    seeds, _ = read_mindspore_plan(path)
    assert seeds == {name: (tuple(map(tuple, item["parallel_strategy"])), None)
                     for name, item in json.loads((FIXTURES / f"layout2d_{sample}_compiled_from_autostrat.json")
                                                  .read_text())["parallel_strategy_item"].items()}


@pytest.mark.parametrize("sample", ["hd", "adv"])
def test_mindspore_compiled_autostrats_layout_checkpoints_tuples_in_its_own_axis_order(sample, tmp_path):
    """MindSpore 2.10 loaded autostrat's files (no shard call in its script) and compiled
    autostrat's strategy tuples, op for op; it reads no axis order from a strategy checkpoint,
    so each parameter lies where the tuples put it by default (MindSpore's compiled layout)."""
    path = tmp_path / "s.json"
    plan = _plan(sample, save_file=str(path))
    compiled = json.loads((FIXTURES / f"layout2d_{sample}_compiled_from_autostrat.json").read_text())
    assert json.loads(path.read_text())["parallel_strategy_item"] == compiled["parallel_strategy_item"]
    for name, op_name in _ops_mindspore_names(plan).items():
        op = plan.graph.ops[op_name]
        default = Strategy.from_tuples(op.rule, plan.ops[op_name].strategy.to_tuples(), 8)
        parameter = name.partition("_")[2]
        item = compiled["parallel_layout_item"][parameter]
        stored = Layout(DeviceMatrix(tuple(item["dev_matrix"])), TensorMap(tuple(item["tensor_map"])), tuple(item["tensor_shape"]))
        assert default.input_layouts[op.inputs.index(parameter)].equivalent(stored), name
    moved = {"hd": "fc2_weight", "adv": "fc1_weight"}[sample]  # a Layout's order, not the tuples'
    assert not plan.layouts[moved].equivalent(_compiled_layout(compiled, moved))


def _compiled_layout(compiled: dict, name: str) -> Layout:
    item = compiled["parallel_layout_item"][name]
    return Layout(DeviceMatrix(tuple(item["dev_matrix"])), TensorMap(tuple(item["tensor_map"])), tuple(item["tensor_shape"]))


def test_sub_dims_cut_and_merge_back():
    for matrix, entries, shape in [([2, 2, 2], [[1, 2], -1], (784, 512)), ([2, 4], [[0, 1], -1], (64, 8)),
                                   ([2, 2, 2], [-1, [2, 0, 1]], (4, 64)), ([8], [0, -1], (512, 512))]:
        tensor_map, tensor_shape = expanded(matrix, entries, shape)
        assert merged(tensor_map, tensor_shape, shape, "ckpt") == entries
    assert expanded([2, 2, 2], [-1, [2, 0, 1]], (4, 64)) == ([-1, 2, 0, 1], [4, 2, 2, 16])


@pytest.mark.parametrize("edit, message", [
    (lambda d: d["parallel_layout_item"].pop("fc1_weight"),
     "MatMul_fc1_weight has an empty strategy (MindSpore writes one for an op sharded by Layouts) and the file holds "
     "no layout of fc1_weight to seed it from"),
    (lambda d: d["parallel_layout_item"]["fc1_weight"].update(tensor_shape=[3, 392, 512]),
     "parallel_layout_item.fc1_weight: tensor_shape [3, 392, 512] does not cut the parameter's shape [784, 512] into sub-dims"),
    (lambda d: d["parallel_layout_item"]["fc1_weight"].update(tensor_map=[1, 2]),
     "parallel_layout_item.fc1_weight: tensor_map [1, 2] and tensor_shape [2, 392, 512] differ in length"),
])
def test_broken_layout_items_are_refused_by_name(tmp_path, edit, message):
    data = json.loads((FIXTURES / "layout2d_adv_strategy.json").read_text())
    edit(data)
    path = tmp_path / "broken.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ConfigError, match=re.escape(message)):
        _plan("adv", sharded=False, load_file=str(path))
