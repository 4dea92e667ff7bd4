"""Candidate strategies of a rule for `device_num` devices.

A candidate gives every factor a split that divides its size; need-replication factors stay
whole; inside a compound dim a minor factor is split only once every factor before it is fully
split (so every rank's slice stays one contiguous block). The splits' product must equal
`device_num`, or divide it when repeated calculation is allowed; the all-ones strategy is always
a candidate. Candidates come in ascending lexicographic order of their splits in factor order,
so the all-ones strategy is first and the order never depends on anything but the rule.
"""

from __future__ import annotations

import math
from functools import cache

from autostrat.errors import LayoutError
from autostrat.layout import Strategy
from autostrat.rules import Rule


def _divisors(number: int) -> list[int]:
    return [d for d in range(1, number + 1) if number % d == 0]


def _compound_dims(rule: Rule) -> list[tuple[int, ...]]:
    """Factor indices of every dim made of several factors, major first."""
    index = {factor: i for i, factor in enumerate(rule.factors)}
    return sorted(
        {tuple(index[f] for f in dim) for operand in rule.inputs + rule.outputs for dim in operand if len(dim) > 1}
    )


def _contiguous(splits: tuple[int, ...], sizes: tuple[int, ...], compounds) -> bool:
    for dim in compounds:
        for position, factor in enumerate(dim[1:], start=1):
            if splits[factor] > 1 and any(splits[f] != sizes[f] for f in dim[:position]):
                return False
    return True


@cache
def generate_strategies(rule: Rule, device_num: int, allow_repeated: bool = False) -> tuple[Strategy, ...]:
    """Every candidate strategy of `rule` on `device_num` devices, in a deterministic order.

    Example (the counts MindSpore users meet first):
        >>> from autostrat.rules import make_rule
        >>> len(generate_strategies(make_rule("MatMul", [(64, 64), (64, 64)]), 8))
        11
        >>> [str(s) for s in generate_strategies(make_rule("ReLU", [(64, 32)]), 8)]
        ['((1, 1),)', '((1, 8),)', '((2, 4),)', '((4, 2),)', '((8, 1),)']
    """
    if not isinstance(device_num, int) or device_num < 1:
        raise LayoutError(f"device_num must be a positive integer, got {device_num!r}")
    options = [
        [1] if factor in rule.need_replication else _divisors(math.gcd(size, device_num))
        for factor, size in zip(rule.factors, rule.factor_sizes)
    ]
    compounds = _compound_dims(rule)
    found = {(1,) * len(rule.factors)}
    for splits in _products(options, device_num):
        used = math.prod(splits)
        if (used == device_num or allow_repeated) and _contiguous(splits, rule.factor_sizes, compounds):
            found.add(splits)
    return tuple(Strategy(rule, splits, device_num) for splits in sorted(found))


def _products(options: list[list[int]], limit: int, prefix: tuple[int, ...] = ()):
    """Every choice of one option per factor whose product divides `limit`."""
    if len(prefix) == len(options):
        yield prefix
        return
    used = math.prod(prefix)
    for option in options[len(prefix)]:
        if limit % (used * option) == 0:
            yield from _products(options, limit, prefix + (option,))
