"""Properties of every candidate on random shapes and device counts (hypothesis)."""

from __future__ import annotations

import math
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from autostrat.layout import Strategy
from autostrat.rules import make_rule
from autostrat.strategies import generate_strategies

SIZES = st.sampled_from([1, 2, 3, 4, 6, 8, 12, 16, 24])


@st.composite
def rules(draw):
    m, k, n, b = draw(SIZES), draw(SIZES), draw(SIZES), draw(SIZES)
    choice = draw(st.sampled_from(["MatMul", "BatchMatMul", "Add", "Reshape", "ReduceSum", "Gather"]))
    if choice == "MatMul":
        return make_rule("MatMul", [(m, k), (k, n)])
    if choice == "BatchMatMul":
        return make_rule("BatchMatMul", [(b, m, k), (b, k, n)])
    if choice == "Add":
        return make_rule("Add", [(m, n), (n,)])
    if choice == "Reshape":
        return make_rule("Reshape", [(m * k, n)], shape=(m, k * n))
    if choice == "ReduceSum":
        return make_rule("ReduceSum", [(m, k, n)], axis=1, keep_dims=draw(st.booleans()))
    return make_rule("Gather", [(k, n), (m,)], axis=0)


@settings(max_examples=150, deadline=None)
@given(rules(), st.integers(1, 12), st.booleans())
def test_candidates_round_trip_through_mindspore_tuples(rule, device_num, repeated):
    for strategy in generate_strategies(rule, device_num, repeated):
        again = Strategy.from_tuples(rule, strategy.to_tuples(), device_num, out_strategy=strategy.out_tuples())
        # MindSpore's tuples cannot say that an Add sums partial inputs: that much is lost.
        assert again == (replace(strategy, sums_partials=False) if strategy.sums_partials else strategy)
        assert strategy.device_matrix.device_num == device_num


@settings(max_examples=150, deadline=None)
@given(rules(), st.integers(1, 12))
def test_slices_divide_each_dim_by_its_strategy(rule, device_num):
    for strategy in generate_strategies(rule, device_num):
        for layout, parts, shape in zip(strategy.input_layouts, strategy.to_tuples(), rule.input_shapes):
            assert layout.slice_shape == tuple(size // p for size, p in zip(shape, parts))
        # The distinct slices tile the tensor once; replica groups differ by slice or by partial index.
        for layout in strategy.input_layouts + strategy.output_layouts:
            ranges = {layout.slice_range(rank) for rank in range(device_num)}
            assert len(ranges) == math.prod(layout.parts)
            partial = math.prod(layout.device_matrix.axis_size(a) for a in layout.partial)
            assert len(layout.replica_groups()) == len(ranges) * partial
