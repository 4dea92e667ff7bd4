"""Candidate strategies: the counts the issue fixes, order, any device_num, repeated calculation."""

from __future__ import annotations

import math

from autostrat.rules import make_rule
from autostrat.strategies import generate_strategies


def test_matmul_64_on_8_devices_has_11_candidates():
    assert len(generate_strategies(make_rule("MatMul", [(64, 64), (64, 64)]), 8)) == 11


def test_elementwise_64x32_on_8_devices_has_5_candidates():
    assert len(generate_strategies(make_rule("Add", [(64, 32), (64, 32)]), 8)) == 5


def test_all_ones_comes_first_and_the_order_is_lexicographic():
    strategies = generate_strategies(make_rule("MatMul", [(64, 64), (64, 64)]), 8)
    splits = [s.splits for s in strategies]
    assert splits[0] == (1, 1, 1) and splits == sorted(splits)
    assert all(math.prod(s) == 8 for s in splits[1:])


def test_any_device_num_works():
    rule = make_rule("MatMul", [(24, 48), (48, 36)])
    for device_num in (3, 5, 6, 12):
        strategies = generate_strategies(rule, device_num)
        for strategy in strategies[1:]:
            assert math.prod(strategy.splits) == device_num
            assert all(size % split == 0 for size, split in zip(rule.factor_sizes, strategy.splits))
    assert len(generate_strategies(rule, 5)) == 1  # no size is divisible by 5: only all-ones
    assert len(generate_strategies(rule, 6)) > 1


def test_repeated_calculation_admits_every_divisor():
    rule = make_rule("ReLU", [(64, 32)])
    used = sorted({math.prod(s.splits) for s in generate_strategies(rule, 8, allow_repeated=True)})
    assert used == [1, 2, 4, 8]
    assert len(generate_strategies(rule, 8, allow_repeated=True)) == 1 + 2 + 3 + 4


def test_need_replication_factors_are_never_split():
    rule = make_rule("Softmax", [(64, 32)])
    assert [str(s) for s in generate_strategies(rule, 8)] == ["((1, 1),)", "((8, 1),)"]


def test_compound_dims_split_major_factor_first():
    rule = make_rule("Reshape", [(4, 6, 8)], shape=(24, 8))  # (f0 f1) f2: f1 only once f0 is whole
    for strategy in generate_strategies(rule, 8, allow_repeated=True):
        if strategy.split("f1") > 1:
            assert strategy.split("f0") == 4


def test_generation_is_deterministic_and_cached():
    rule = make_rule("BatchMatMul", [(4, 12, 24), (4, 24, 12)])
    first = [str(s) for s in generate_strategies(rule, 8)]
    again = make_rule("BatchMatMul", [(4, 12, 24), (4, 24, 12)])
    assert [str(s) for s in generate_strategies(again, 8)] == first
    assert generate_strategies(again, 8) is generate_strategies(rule, 8)
