"""The matmul communication lower bound (Al Daas et al., SPAA 2022) and a plan's ratio to it
(issue #19): the general solver against the paper's closed forms, the bound against what every
load-balanced strategy of small products must move, and every byte of shipped plans charged once."""

from __future__ import annotations

import itertools
import math
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autostrat.cost.lower_bound import MatmulDims, communication_bound, matmul_dims
from autostrat.frontend.config import load_config
from autostrat.frontend.run import plan_config
from autostrat.layout import DeviceMatrix, Layout, TensorMap
from autostrat.redistribution import plan_redistribution
from autostrat.rules import make_rule
from autostrat.search.bounds import FLAG, PlanBounds, op_charges, plan_bounds
from autostrat.strategies import generate_strategies


def _paper_words(m: int, n: int, k: int, devices: float) -> float:
    """The paper's three cases for m ≥ n ≥ k, minus the words a device owns."""
    m, n, k = sorted((m, n, k), reverse=True)
    if devices <= m / n:
        touched = n * k + (m * n + m * k) / devices
    elif devices <= m * n / k**2:
        touched = 2 * math.sqrt(m * n * k**2 / devices) + m * n / devices
    else:
        touched = 3 * (m * n * k / devices) ** (2 / 3)
    return touched - (m * n + m * k + n * k) / devices


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 4096), st.integers(1, 4096), st.integers(1, 4096), st.integers(2, 100_000))
def test_the_solver_equals_the_papers_three_cases(m, n, k, devices):
    # The bound is symmetric in which matrix is largest: A m x k, B k x n, C m x n in any order.
    expected = _paper_words(m, n, k, devices)
    bound = communication_bound(MatmulDims(1, m, n, k), devices, 2)
    assert bound.words == pytest.approx(max(expected, 0.0), rel=1e-9, abs=1e-9)
    assert bound.bytes == pytest.approx(2 * bound.words, rel=1e-12)
    big, middle, small = sorted((m, n, k), reverse=True)
    regime = "1-D" if devices < big / middle else "3-D" if devices > big * middle / small**2 else "2-D"
    if bound.words > 0 and devices not in (big / middle, big * middle / small**2):
        assert bound.regime == regime


@pytest.mark.parametrize("m, n, k", [(4096, 64, 16), (1000, 300, 7), (512, 128, 32), (96, 32, 2)])
def test_the_bound_is_continuous_where_the_cases_meet(m, n, k):
    big, middle, small = sorted((m, n, k), reverse=True)
    for boundary in (big / middle, big * middle / small**2):
        if boundary <= 1:
            continue
        below, above = (communication_bound(MatmulDims(1, m, n, k), boundary * factor, 4) for factor in (1 - 1e-9, 1 + 1e-9))
        assert above.words == pytest.approx(below.words, rel=1e-6)
        assert below.regime != above.regime


def test_a_batch_as_large_as_the_device_count_needs_no_communication():
    for batch, devices in ((8, 8), (64, 8), (16, 4)):
        bound = communication_bound(MatmulDims(batch, 128, 64, 32), devices, 4)
        assert (bound.words, bound.bytes, bound.regime) == (0.0, 0.0, "none")
    assert communication_bound(MatmulDims(4, 128, 64, 32), 8, 4).words > 0
    assert communication_bound(MatmulDims(1, 128, 64, 32), 1, 4).regime == "none"


@pytest.mark.parametrize("transpose_a, transpose_b", [(False, False), (True, False), (False, True), (True, True)])
def test_a_broadcast_2d_operand_is_the_plain_product_of_the_batch_folded_rows(transpose_a, transpose_b):
    batch, m, k, n = 6, 16, 8, 12
    a = (batch, k, m) if transpose_a else (batch, m, k)
    b = (n, k) if transpose_b else (k, n)
    batched = matmul_dims(make_rule("BatchMatMul", [a, b], transpose_a=transpose_a, transpose_b=transpose_b))
    plain = matmul_dims(make_rule("MatMul", [(batch * m, k), (k, n)]))
    assert batched == plain == MatmulDims(1, batch * m, n, k)
    for devices in (2, 8, 64, 1024):
        assert communication_bound(batched, devices, 4) == communication_bound(plain, devices, 4)


def test_a_shared_batch_is_its_own_class_and_other_op_types_have_no_dims():
    assert matmul_dims(make_rule("BatchMatMul", [(2, 3, 8, 12), (2, 3, 8, 12)], transpose_b=True)) == MatmulDims(6, 8, 8, 12)
    assert matmul_dims(make_rule("BatchMatMul", [(5, 8, 12), (5, 12, 4)])) == MatmulDims(5, 8, 4, 12)
    assert matmul_dims(make_rule("Add", [(4, 8), (4, 8)])) is None


def _one_copy_layouts(shape: tuple[int, ...], devices: int) -> list[Layout]:
    """Layouts holding one copy of a tensor spread evenly: every dim split, the splits' product
    `devices`, the split dims on the device matrix in every order."""
    layouts = []
    for splits in itertools.product(range(1, devices + 1), repeat=len(shape)):
        if math.prod(splits) != devices or any(size % split for size, split in zip(shape, splits)):
            continue
        split_dims = [dim for dim, split in enumerate(splits) if split > 1]
        for order in itertools.permutations(split_dims):
            axis = {dim: len(order) - 1 - position for position, dim in enumerate(order)}  # counted from the right
            tensor_map = tuple(axis.get(dim, -1) for dim in range(len(shape)))
            layouts.append(Layout(DeviceMatrix(tuple(splits[dim] for dim in order)), TensorMap(tensor_map), shape))
    return layouts


def _least_bytes(strategy, devices: int, dtype: str = "float32") -> int:
    """The fewest bytes per device a strategy moves from one evenly spread copy of its inputs
    to one of its output: the inputs and the output are redistributed independently."""
    total = 0
    for layout in strategy.input_layouts:
        total += min(plan_redistribution(source, layout, dtype).cost for source in _one_copy_layouts(layout.shape, devices))
    output = strategy.output_layouts[0]
    return total + min(plan_redistribution(output, target, dtype).cost for target in _one_copy_layouts(output.shape, devices))


PRODUCTS = [
    ("MatMul", [(16, 8), (8, 12)], {}),
    ("MatMul", [(32, 8), (4, 8)], {"transpose_b": True}),
    ("BatchMatMul", [(2, 8, 6), (2, 6, 8)], {}),
    ("BatchMatMul", [(2, 8, 6), (6, 4)], {}),
]


@pytest.mark.parametrize("devices", [2, 4, 8])
@pytest.mark.parametrize("op_type, shapes, attrs", PRODUCTS, ids=[f"{p[0]}{p[1]}" for p in PRODUCTS])
def test_no_load_balanced_strategy_moves_less_than_the_bound(op_type, shapes, attrs, devices):
    rule = make_rule(op_type, shapes, **attrs)
    bound = communication_bound(matmul_dims(rule), devices, 4)
    balanced = [s for s in generate_strategies(rule, devices, allow_repeated=False) if math.prod(s.splits) == devices]
    assert balanced
    least = min(_least_bytes(strategy, devices) for strategy in balanced)
    assert least >= bound.bytes * (1 - 1e-9), (least, bound)


@pytest.mark.parametrize("devices", [2, 4])
def test_in_the_1d_case_the_best_strategy_reaches_the_bound(devices):
    # m = 64, k = 8, n = 4: P < m/k = 8 is the 1-D case; splitting m and gathering B attains it.
    rule = make_rule("MatMul", [(64, 8), (8, 4)])
    bound = communication_bound(matmul_dims(rule), devices, 4)
    assert bound.regime == "1-D" and bound.bytes == pytest.approx(8 * 4 * (1 - 1 / devices) * 4)
    balanced = [s for s in generate_strategies(rule, devices) if math.prod(s.splits) == devices]
    assert min(_least_bytes(strategy, devices) for strategy in balanced) / bound.bytes == pytest.approx(1.0, rel=1e-12)


def _plan(path: str, **overrides):
    return plan_config(load_config(path, **overrides))[0]


SHIPPED = {
    "gpt_train": ("configs/gpt_train.yaml", {}),
    "gpt_pipeline": ("configs/gpt_pipeline.yaml", {}),
    "gpt_train_zero": ("configs/gpt_train.yaml", {"enable_parallel_optimizer": True,
                                                  "parallel_optimizer_config": {"parallel_optimizer_threshold": 0}}),
    "ffn": ("configs/ffn.yaml", {}),
}


@pytest.mark.parametrize("name", SHIPPED)
def test_every_byte_of_a_plan_is_charged_to_one_op(name):
    path, overrides = SHIPPED[name]
    plan = _plan(path, **overrides)
    charges = op_charges(plan)
    assert set(charges) == set(plan.graph.ops) and min(charges.values()) >= 0
    assert sum(charges.values()) == plan.total_bytes > 0
    # Partial sums are their producer's: every summing step's bytes land on an op that made partial values.
    summing = {plan.graph.tensors[edge.tensor].producer for edge in plan.redistributions if not edge.shares
               for step in edge.plan.steps if step.kind in ("AllReduce", "ReduceScatter") and step.before.partial}
    assert all(charges[op] > 0 for op in summing - {None})


def test_a_row_split_products_partial_sum_is_charged_to_it():
    plan = _plan("configs/gpt.yaml")
    name = "blocks.0.attention.projection.matmul"
    out = [edge for edge in plan.redistributions if edge.tensor == plan.graph.ops[name].outputs[0] and not edge.shares]
    assert out and all(step.before.partial for step in out[0].plan.steps[:1])
    assert op_charges(plan)[name] == plan.bytes_into(name) + sum(edge.cost for edge in out)
    assert op_charges(plan)[out[0].consumer] == plan.bytes_into(out[0].consumer) - out[0].cost


LINE = re.compile(r"communication: (\d+\.\d\d)× the per-op lower bounds \(matmul-family ops send ([\d,]+) of the plan's "
                  r"([\d,]+) bytes per device; their bounds sum to ([\d,]+): Al Daas et al\. 2022, each for its op alone, "
                  r"not a bound on the plan\); (\d+) op\(s\) above 1\.5× their own")


def test_the_megatron_gpt_training_plan_against_its_bound():
    plan = _plan("configs/gpt_train.yaml")
    bounds = plan_bounds(plan)
    assert {op.op for op in bounds.ops} == {name for name, node in plan.graph.ops.items() if node.op_type in ("MatMul", "BatchMatMul")}
    assert all(math.isfinite(op.ratio) for op in bounds.ops if op.bound.bytes > 0)
    assert all(op.ratio is None for op in bounds.ops if op.bound.bytes == 0)
    assert [op.op for op in bounds.flagged] == [op.op for op in bounds.ops if op.ratio is not None and op.ratio > FLAG]
    ratio, charged, total, bound, flagged = LINE.fullmatch(bounds.line).groups()
    assert float(ratio) == pytest.approx(bounds.charged / bounds.bound, abs=0.005)
    assert (int(charged.replace(",", "")), int(total.replace(",", ""))) == (bounds.charged, plan.total_bytes)
    assert int(bound.replace(",", "")) == round(bounds.bound) and int(flagged) == len(bounds.flagged) > 0
    lines = plan.table().splitlines()
    assert lines[lines.index(f"total bytes per device: {plan.total_bytes}") + 1] == bounds.line
    assert "lower bound" not in plan.to_json()  # the JSON, and so the plan digests, stay as they were


def test_a_plan_without_a_bounded_product_says_so():
    plan = _plan("configs/gpt.yaml")
    zero = tuple(op for op in plan_bounds(plan).ops if op.bound.bytes == 0)  # the attention's batched products
    assert zero and PlanBounds(zero, plan.total_bytes).line == (
        f"communication: every matmul-family op's lower bound is 0 (matmul-family ops send "
        f"{sum(op.charged for op in zero):,} of the plan's {plan.total_bytes:,} bytes per device)")
    assert PlanBounds((), plan.total_bytes).line == (
        f"communication: no matmul-family op to bound (the plan sends {plan.total_bytes:,} bytes per device)")
