"""Factor rules: the notation, the rule value, the registry and one module per op family."""

from autostrat.rules import attention, elementwise, grad, matmul, moe, nn, optimizer, reduce, shape  # noqa: F401  (they register ops)
from autostrat.rules.notation import parse_equation
from autostrat.rules.registry import Example, OpDef, get_op, make_rule, op_types, register
from autostrat.rules.rule import Rule, RuleSpec

__all__ = ["Example", "OpDef", "Rule", "RuleSpec", "get_op", "make_rule", "op_types", "parse_equation", "register"]
