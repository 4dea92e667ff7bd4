"""MindSpore's Layout API (issue #18, section 3): layouts as seeds in Python, YAML and strategy
checkpoints; strategies in any axis order (`Placement`) computing exactly what one device does;
redistributions between them at the brute-force minimum; the search offering the orders a
Layout seed starts (`search.orders`)."""

from __future__ import annotations

import itertools
import json
import math
import re
from pathlib import Path

import numpy as np
import pytest

import autostrat as ms
from autostrat import nn
from autostrat.errors import ConfigError, LayoutError
from autostrat.frontend.config import load_config
from autostrat.frontend.run import plan_config
from autostrat.layout import DeviceMatrix, Layout, Strategy, TensorMap
from autostrat.layout.named import NamedLayout, as_named
from autostrat.layout.placement import Placement, default_placement
from autostrat.models import FFN
from autostrat.redistribution import redistribution_cost
from autostrat.rules import get_op, make_rule, op_types
from autostrat.runtime.job import make_job
from autostrat.runtime.kernels import run_kernel
from autostrat.runtime.local import run_job_locally
from autostrat.strategies import generate_strategies
from tests.oracle import random_inputs, run_sliced
from tests.redistribution_oracle import all_layouts, oracle_cost, primes

FIXTURES = Path(__file__).parent / "fixtures" / "mindspore"
MP_DP = NamedLayout((4, 2), ("mp", "dp"))  # MindSpore's fixture: mp the major axis (1), dp the minor (0)


@pytest.fixture(autouse=True)
def _clean():
    yield
    ms.reset_auto_parallel_context()


def _layout_ffn() -> FFN:
    """The FFN with MindSpore's fixture seeds (ffn_layout_mindspore.py): dense1's MatMul on
    (dp, mp) x (mp, None) over [4, 2] named (mp, dp), and the ReLU with its rows over (dp, mp)."""
    net = FFN()
    net.dense1.matmul.shard(in_strategy=(MP_DP("dp", "mp"), MP_DP("mp", "None")))
    net.relu.shard(in_strategy=(MP_DP(("dp", "mp"), "None"),))
    return net


def test_a_layout_names_axes_from_the_right_as_mindspore_prints_them():
    """The tensor maps of MindSpore's own IR (fixtures/mindspore/ffn_layout_step_parallel_begin.txt)."""
    ir = (FIXTURES / "ffn_layout_step_parallel_begin.txt").read_text()
    printed = re.findall(r"'tensor_map': (\(.*?\)), 'interleaved", ir)
    ours = [MP_DP("dp", "mp").tensor_map, MP_DP("mp", "None").tensor_map, MP_DP(("mp", "dp"), "None").tensor_map]
    assert printed == [str(t) for t in ours] == ["(0, 1)", "(1, -1)", "((1, 0), -1)"]
    assert MP_DP("dp", "mp").parts() == (2, 4) and MP_DP(("dp", "mp"), "None").parts() == (8, 1)


@pytest.mark.parametrize("make, message", [
    (lambda: NamedLayout((2, 4), ("dp",)), "alias_name must be a tuple of 2 strings"),
    (lambda: NamedLayout((2, 4), ("dp", "dp")), "alias names must be distinct"),
    (lambda: NamedLayout((2, 0), ("dp", "mp")), "device_matrix must be a tuple of positive integers"),
    (lambda: NamedLayout((2, 4), ("dp", "mp"), rank_list=[1, 0, 2, 3, 4, 5, 6, 7]), "rank_list is not supported"),
    (lambda: MP_DP("dp", "tp"), "unknown axis name 'tp'"),
    (lambda: MP_DP("dp", ("dp", "mp")), "axis 'dp' splits two dims"),
])
def test_bad_layouts_are_refused_by_name(make, message):
    with pytest.raises(LayoutError, match=re.escape(message)):
        make()


def test_layout_seeds_that_do_not_fit_the_op_are_refused_by_name():
    rule = make_rule("MatMul", [(64, 64), (64, 64)])
    other = NamedLayout((2, 4), ("dp", "mp"))
    cases = [
        ((MP_DP("dp", "mp"), other("mp", "None")), "must share one device matrix"),
        ((MP_DP("dp", "mp"), MP_DP("dp", "None")), "factor 'k' is split into 4 parts by input 0 dim 1 but into 2 parts"),
        ((MP_DP("dp", "mp"), MP_DP("None", "mp")), "factor 'k' is split into 4 parts by input 0 dim 1 but into 1 parts"),
    ]
    for layouts, message in cases:
        with pytest.raises(LayoutError, match=re.escape(message)):
            Strategy.from_tuples(rule, layouts, 8, where="matmul")
    with pytest.raises(LayoutError, match=r"device matrix \(4, 2\) has 8 devices; device_num is 16"):
        Strategy.from_tuples(rule, (MP_DP("dp", "mp"), MP_DP("mp", "None")), 16)
    same_parts_other_axes = (NamedLayout((2, 2, 2), ("a", "b", "c"))("a", "c"),
                             NamedLayout((2, 2, 2), ("a", "b", "c"))("b", "None"))
    with pytest.raises(LayoutError, match="factor 'k' is split by device axes"):
        Strategy.from_tuples(rule, same_parts_other_axes, 8)


def test_a_layout_in_the_tuple_order_is_the_tuple_strategy():
    rule = make_rule("MatMul", [(64, 64), (64, 64)])
    tuple_order = NamedLayout((2, 4), ("dp", "mp"))
    placed = Strategy.from_tuples(rule, (tuple_order("dp", "mp"), tuple_order("mp", "None")), 8)
    assert placed == Strategy.from_tuples(rule, ((2, 4), (4, 1)), 8) and placed.placement is None
    reordered = Strategy.from_tuples(rule, (MP_DP("dp", "mp"), MP_DP("mp", "None")), 8)
    assert reordered != placed and reordered.to_tuples() == placed.to_tuples()
    assert str(reordered) == "((2, 4), (4, 1)) on [4, 2]: (0, 1), (1, -1)"


def _placements(strategy: Strategy):
    """`strategy` with its device axes refined to primes and put in every order (at most 24):
    any order, and a factor over several axes, not always adjacent."""
    default = default_placement(strategy.splits, strategy.device_num)
    sizes, owner = [], []  # per prime axis (major first): its size and the factor owning it (-1: repeated)
    factor_of = {axis: index for index, axes in enumerate(default.axes) for axis in axes}
    for position, size in enumerate(default.matrix):
        axis = len(default.matrix) - 1 - position
        for prime in primes(size):
            sizes.append(prime)
            owner.append(factor_of.get(axis, -1))
    for order in itertools.islice(itertools.permutations(range(len(sizes))), 24):
        matrix = tuple(sizes[i] for i in order)
        axes = tuple(tuple(len(order) - 1 - position for position, i in enumerate(order) if owner[i] == factor)
                     for factor in range(len(strategy.splits)))
        yield Strategy(strategy.rule, strategy.splits, strategy.device_num, strategy.sums_partials, placement=Placement(matrix, axes))


@pytest.mark.parametrize("op_type", op_types())
def test_every_placement_matches_the_single_device_result(op_type):
    """The oracle of tests/test_oracle.py over strategies in other axis orders: every candidate
    on 8 devices (repeated calculation included) in up to 24 orders of its prime axes."""
    rng = np.random.default_rng(sum(map(ord, op_type)) + 1)
    placed = 0
    for example in get_op(op_type).examples:
        rule = make_rule(op_type, example.shapes, **example.attrs)
        inputs = random_inputs(example, rng)
        expected = run_kernel(op_type, inputs, example.attrs)
        for strategy in generate_strategies(rule, 8, True):
            for variant in _placements(strategy):
                got = run_sliced(variant, inputs, example.attrs)
                for g, e in zip(got, expected):
                    np.testing.assert_allclose(g, e, rtol=1e-9, atol=1e-9, err_msg=f"{op_type} {variant}")
                placed += variant.placement is not None
    assert placed > 0  # orders other than the tuples' were run


def test_placed_layouts_are_among_the_brute_force_oracles_layouts_and_priced_at_its_minimum():
    """The exhaustive redistribution test (test_redistribution_oracle.py) enumerates every layout
    over every ordering of prime axes; the layouts of placed strategies are among them, and the
    planner prices the pairs between placed and tuple-order strategies at the oracle's minimum."""
    rule = make_rule("MatMul", [(24, 12), (12, 24)])
    layouts = {str(layout) for layout in all_layouts(8, (24, 24))}
    strategies = [s for base in generate_strategies(rule, 8, True)[::2] for s in itertools.islice(_placements(base), 6)]
    outputs = [s.output_layouts[0] for s in strategies]
    assert {str(layout.normalized()) for layout in outputs} <= layouts
    consumer = make_rule("ReLU", [(24, 24)])
    reads = [s.input_layouts[0] for base in generate_strategies(consumer, 8) for s in itertools.islice(_placements(base), 4)]
    pairs = [(src, dst) for src in outputs[::5] for dst in reads[::3]]
    assert len(pairs) > 50 and all(redistribution_cost(src, dst) == oracle_cost(src, dst) for src, dst in pairs)


def test_a_layout_seeded_plan_reads_its_seeds_layouts_where_they_lie_and_runs_as_one_device():
    """The Layout seeds of MindSpore's fixture: the search offers dense1's BiasAdd the placement
    that reads the MatMul's partial output where it lies (one ReduceScatter, 6 144 bytes; in tuple
    orders only, a ReduceScatter, two AllToAlls and a permute, 11 776), and the plan runs on 8
    threads equal to one device with the bytes it predicted."""
    ms.set_auto_parallel_context(parallel_mode="auto_parallel", device_num=8)
    plan = ms.parallelize(_layout_ffn(), nn.Tensor(shape=(64, 64)))
    assert plan.total_bytes == 6144
    assert [step.kind for e in plan.redistributions for step in e.plan.steps] == ["ReduceScatter"]
    assert str(plan.ops["dense1.bias_add"].strategy) == "((8, 1), (1,)) on [4, 2]: ((0, 1), -1), (-1,)"
    ops = {op["name"]: op for op in plan.to_dict()["ops"]}  # the plan JSON keeps the order too
    assert ops["dense1.bias_add"]["in_layout"][0] == {"device_matrix": [4, 2], "tensor_map": [[0, 1], -1]}
    assert all(("in_layout" in op) == (plan.ops[name].strategy.placement is not None) for name, op in ops.items())
    check = run_job_locally(make_job(plan, steps=1))
    assert check.bytes_match and check.results_match, check.text


def test_the_ir_prints_layout_seeds_as_mindspores_in_layout(tmp_path):
    ms.set_auto_parallel_context(parallel_mode="auto_parallel", device_num=8)
    plan = ms.parallelize(_layout_ffn(), nn.Tensor(shape=(64, 64)))
    ir = plan.dump_ir(tmp_path)[0].read_text()
    mindspore = (FIXTURES / "ffn_layout_step_parallel_begin.txt").read_text()
    ours = re.search(r"\{in_layout: \(.*?\)\}", ir.split("dense1.matmul:0 = ")[1]).group(0)
    theirs = re.search(r"\{in_layout: \(.*?\)\}", mindspore).group(0)
    assert ours == theirs


def test_layout_seeds_load_from_yaml_and_refuse_another_device_count(tmp_path):
    path = tmp_path / "layout.yaml"
    path.write_text("""parallel_mode: auto_parallel
device_num: 8
model: {name: FFN}
inputs:
  - {shape: [64, 64], dtype: float32}
strategies:
  dense1.matmul:
    layout: {device_matrix: [4, 2], alias_name: [mp, dp]}
    in: [[dp, mp], [mp, None]]
  relu:
    layout: {device_matrix: [4, 2], alias_name: [mp, dp]}
    in: [[[dp, mp], None]]
""")
    config = load_config(path)
    assert config.strategies["relu"] == ((MP_DP(("dp", "mp"), "None"),), None)
    ms.set_auto_parallel_context(parallel_mode="auto_parallel", device_num=8)
    python = ms.parallelize(_layout_ffn(), nn.Tensor(shape=(64, 64)))
    plan, _ = plan_config(config)
    assert {n: str(o.strategy) for n, o in plan.ops.items()} == {n: str(o.strategy) for n, o in python.ops.items()}
    with pytest.raises(ConfigError, match="a Layout names its 8 devices' axes and cannot be scaled to 16 devices"):
        plan_config(config, 16)
    path.write_text(path.read_text().replace("alias_name: [mp, dp]}\n    in: [[dp, mp]", "alias_name: [mp]}\n    in: [[dp, mp]"))
    with pytest.raises(ConfigError, match=r"strategies.dense1.matmul: Layout: alias_name must be a tuple of 2 strings"):
        load_config(path)


def test_a_strategy_checkpoint_keeps_the_axis_order_and_mindspores_layouts(tmp_path):
    """autostrat's checkpoint of the Layout-seeded FFN: MindSpore's parameter layout for
    dense1.weight is the one MindSpore saved for the same seeds (fixture), and reloading the
    checkpoint into an unseeded FFN gives every strategy back, orders included."""
    path = tmp_path / "strategy.json"
    ms.set_auto_parallel_context(parallel_mode="auto_parallel", device_num=8, strategy_ckpt_save_file=str(path))
    saved = ms.parallelize(_layout_ffn(), nn.Tensor(shape=(64, 64)))
    ours = json.loads(path.read_text())
    theirs = json.loads((FIXTURES / "ffn_layout_strategy.json").read_text())
    weight = {k: v for k, v in ours["parallel_layout_item"]["dense1.weight"].items() if k != "slice_shape"}
    assert weight == theirs["parallel_layout_item"]["dense1.weight"]
    assert ours["parallel_strategy_item"]["MatMul_dense1.weight"] == theirs["parallel_strategy_item"]["MatMul_dense1.weight"]
    ms.reset_auto_parallel_context()
    ms.set_auto_parallel_context(parallel_mode="auto_parallel", device_num=8, strategy_ckpt_load_file=str(path))
    loaded = ms.parallelize(FFN(), nn.Tensor(shape=(64, 64)))
    assert {n: str(o.strategy) for n, o in loaded.ops.items()} == {n: str(o.strategy) for n, o in saved.ops.items()}


@pytest.mark.parametrize("suffix", ["json", "ckpt"])
def test_a_checkpoint_mindspore_saved_from_layouts_seeds_their_axis_order(suffix):
    """MindSpore keeps only tuples in its strategy items; the parameter's layout item keeps the
    order, which autostrat reads back: dense1's MatMul gets MindSpore's in_layout again."""
    from tests.test_mindspore_checkpoint import TutorialFFN
    ms.set_auto_parallel_context(parallel_mode="auto_parallel", device_num=8,
                                 strategy_ckpt_load_file=str(FIXTURES / f"ffn_layout_strategy.{suffix}"))
    plan = ms.parallelize(TutorialFFN(), nn.Tensor(shape=(64, 64)))
    assert str(plan.ops["dense1.matmul"].strategy) == "((2, 4), (4, 1)) on [4, 2]: (0, 1), (1, -1)"
    assert plan.layouts["dense1.weight"].equivalent(Layout(DeviceMatrix((4, 2)), TensorMap((1, -1)), (64, 64)))


def test_as_named_round_trips_a_placed_strategy():
    rule = make_rule("BatchMatMul", [(4, 8, 16, 8), (4, 8, 8, 16)])
    base = Strategy.from_tuples(rule, ((2, 2, 1, 2), (2, 2, 2, 1)), 8)
    for variant in itertools.islice(_placements(base), 1, 6):
        named = tuple(as_named(variant.device_matrix.shape, layout.tensor_map.entries) for layout in variant.input_layouts)
        assert Strategy.from_tuples(rule, named, 8) == variant


def test_tuple_seeded_configs_get_no_order_candidates():
    """The orders a Layout seed starts are all the search adds: the shipped GPT config, seeded
    with tuples, has the candidates it had before (no placement anywhere)."""
    from autostrat.search.problem import build_problem
    plan, _ = plan_config(load_config("configs/gpt.yaml"))
    problem = build_problem(plan.graph, 8)
    assert not any(s.placement for candidates in problem.candidates.values() for s in candidates if isinstance(s, Strategy))
    assert math.prod(problem.candidates["blocks.0.attention.query.matmul"][0].splits) > 1
