"""Factor notation, rule construction, and the rules of every registered op (golden)."""

from __future__ import annotations

import pytest

from autostrat.rules import Rule, RuleSpec, get_op, make_rule, op_types, parse_equation, register
from autostrat.rules.registry import Example, unregister


def test_parse_simple_compound_and_broadcast_dims():
    assert parse_equation("m k, k n -> m n") == (((("m",), ("k",)), (("k",), ("n",))), ((("m",), ("n",)),))
    assert parse_equation("(a b) c -> a b c")[0] == (((("a", "b"), ("c",)),))
    assert parse_equation("a 1, b -> a b")[0][0] == (("a",), ())


def test_parse_scalar_operands():
    inputs, outputs = parse_equation("a b -> ")
    assert inputs == ((("a",), ("b",)),) and outputs == ((),)


def test_reduction_and_need_replication_kinds():
    rule = Rule.build("Test", RuleSpec("b c, b c -> b", need_replication="c"), [(4, 6), (4, 6)])
    assert rule.reduction == frozenset() and rule.need_replication == {"c"}
    rule = Rule.build("Test", RuleSpec("b c, b c -> b"), [(4, 6), (4, 6)])
    assert rule.reduction == {"c"}


def test_compound_factor_sizes_are_inferred_from_the_given_ones():
    rule = Rule.build("Test", RuleSpec("(a b) c -> a b c", sizes={"a": 4}), [(12, 5)])
    assert rule.sizes == {"a": 4, "b": 3, "c": 5}
    assert rule.output_shapes == ((4, 3, 5),)


def test_reshape_builds_compound_factors():
    rule = make_rule("Reshape", [(24, 48)], shape=(24, 6, 8))
    assert str(rule) == "f0 (f1 f2) -> f0 f1 f2"
    rule = make_rule("Reshape", [(6, 4)], shape=(4, 6))
    # 6 = 2 x 3 and 4 = 2 x 2 share a leading 2; the rest does not nest and must stay whole.
    assert rule.inputs[0][0][0] == rule.outputs[0][0][0] and rule.sizes[rule.inputs[0][0][0]] == 2
    assert len(rule.need_replication) == 4


def test_registration_is_unique():
    with pytest.raises(ValueError, match="already registered"):
        register("MatMul", examples=[Example(((2, 2), (2, 2)))])(lambda shapes: RuleSpec("m k, k n -> m n"))


def test_a_new_op_is_a_few_lines():
    @register("TestSwap", examples=[Example(((4, 6),))])
    def swap(shapes):
        return RuleSpec("a b -> b a")

    try:
        assert "TestSwap" in op_types() and str(make_rule("TestSwap", [(4, 6)])) == "a b -> b a"
    finally:
        unregister("TestSwap")


def test_registry_lists_ops_alphabetically():
    assert list(op_types()) == sorted(op_types())


def test_rules_of_every_example_match_the_golden_file(golden):
    lines = []
    for op_type in op_types():
        for example in get_op(op_type).examples:
            rule = make_rule(op_type, example.shapes, **example.attrs)
            shapes = " ".join(str(list(s)) for s in example.shapes)
            lines.append(f"{op_type} {shapes} {example.attrs}: {rule} => {[list(s) for s in rule.output_shapes]}")
    golden("rules.txt", "\n".join(lines) + "\n")
