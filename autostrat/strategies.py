"""Candidate strategies of a rule for `device_num` devices.

A candidate gives every factor a split that divides its size; need-replication factors stay
whole; inside a compound dim a minor factor is split only once every factor before it is fully
split (so every rank's slice stays one contiguous block). The splits' product must equal
`device_num`, or divide it when repeated calculation is allowed; the all-ones strategy is always
a candidate. Candidates come in ascending lexicographic order of their splits in factor order,
so the all-ones strategy is first and the order never depends on anything but the rule.

Beyond a few devices the candidates come from a logical mesh (as in Alpa and XLA's
auto-sharding): the devices seen as a few axes, servers x devices per server by default, and
every factor split by the product of some of them. The number of candidates of an op then no
longer grows with the device count (an attention BatchMatMul has 917 candidates on 1024 devices,
20 on a 128 x 8 mesh), and the redistributions between them are few collectives over few axes. The
device matrix stays in factor order, so a candidate is still a MindSpore strategy; a split a
seed uses is always a candidate split too, so the seed's neighbours can follow it.
"""

from __future__ import annotations

import math
from functools import cache

from autostrat.errors import ConfigError, LayoutError
from autostrat.cost.hardware import DEVICES_PER_SERVER  # the inner axis of the "auto" mesh
from autostrat.layout import Strategy
from autostrat.rules import Rule


EVERY_DIVISOR_UP_TO = 16  # "auto" keeps every divisor as a split up to this many devices
# Ops linear in every input: with repeated calculation they may also add partial sums
# (`Strategy.sums_partials`), so that gradients accumulate before they are reduced.
LINEAR_OP_TYPES = frozenset({"Add", "Sub"})


def mesh_axes(device_num: int, mesh="auto") -> tuple[int, ...] | None:
    """The logical mesh's axis sizes, outer first, or None when every divisor is a split.

    `mesh` is "auto" (every divisor up to `EVERY_DIVISOR_UP_TO` devices, else servers x
    devices per server), "full" (every divisor), or the axis sizes, whose product must be
    `device_num`.

    Example:
        >>> mesh_axes(1024), mesh_axes(8), mesh_axes(96), mesh_axes(64, (4, 16)), mesh_axes(64, "full")
        ((128, 8), None, (12, 8), (4, 16), None)
    """
    mesh = check_mesh(mesh)
    if mesh == "full" or (mesh == "auto" and device_num <= EVERY_DIVISOR_UP_TO):
        return None
    if mesh == "auto":
        inner = math.gcd(DEVICES_PER_SERVER, device_num)
        return (device_num // inner, inner) if 1 < inner < device_num else (device_num,)
    if math.prod(mesh) != device_num:
        raise ConfigError(f"mesh {list(mesh)} has {math.prod(mesh)} devices but device_num is {device_num}")
    return mesh


def check_mesh(mesh):
    """`mesh` as `mesh_axes` takes it ("auto", "full" or a tuple of axis sizes), else a `ConfigError`."""
    if mesh in ("auto", "full"):
        return mesh
    if isinstance(mesh, (list, tuple)) and mesh and all(isinstance(a, int) and not isinstance(a, bool) and a >= 1 for a in mesh):
        return tuple(mesh)
    raise ConfigError(f"mesh must be 'auto', 'full' or a list of positive axis sizes such as [128, 8], got {mesh!r}")


def split_values(axes: tuple[int, ...] | None, seeded: frozenset[int] = frozenset()) -> frozenset[int] | None:
    """The splits a factor may take on mesh `axes`: the products of any of its axes, and every
    split in `seeded`; None (every divisor) without a mesh.

    Example:
        >>> sorted(split_values((128, 8))), sorted(split_values((8, 8), frozenset({4, 16})))
        ([1, 8, 128, 1024], [1, 4, 8, 16, 64])
    """
    if axes is None:
        return None
    values = {1}
    for size in axes:
        values |= {value * size for value in values}
    return frozenset(values | seeded)


def repeat_values(axes: tuple[int, ...] | None) -> frozenset[int] | None:
    """How many devices a candidate may repeat its work over on mesh `axes`: the products of
    its inner axes (None: any number, without a mesh).

    The repeated number is the innermost axis of a candidate's device matrix (MindSpore's
    convention), so its splits take the outer devices: with these repeats they are whole outer
    axes (a batch split over servers, repeated inside each, as Megatron's LayerNorm), never a
    part of one (8 of 128 servers, repeated over 1024 / 8).

    Example:
        >>> sorted(repeat_values((128, 8))), repeat_values(None)
        ([1, 8, 1024], None)
    """
    if axes is None:
        return None
    return frozenset(math.prod(axes[index:]) for index in range(len(axes) + 1))


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
def generate_strategies(rule: Rule, device_num: int, allow_repeated: bool = False,
                        values: frozenset[int] | None = None, repeats: frozenset[int] | None = None) -> tuple[Strategy, ...]:
    """Every candidate strategy of `rule` on `device_num` devices, in a deterministic order;
    with `values` (`split_values`), only those whose every split is one of them; with `repeats`
    (`repeat_values`), only those repeating their work over one of them.

    Example (the counts MindSpore users meet first):
        >>> from autostrat.rules import make_rule
        >>> len(generate_strategies(make_rule("MatMul", [(64, 64), (64, 64)]), 8))
        11
        >>> [str(s) for s in generate_strategies(make_rule("ReLU", [(64, 32)]), 8)]
        ['((1, 1),)', '((1, 8),)', '((2, 4),)', '((4, 2),)', '((8, 1),)']
        >>> len(generate_strategies(make_rule("BatchMatMul", [(1024, 32, 2048, 128), (1024, 32, 128, 2048)]), 1024))
        917
        >>> len(generate_strategies(make_rule("BatchMatMul", [(1024, 32, 2048, 128), (1024, 32, 128, 2048)]), 1024,
        ...                         values=split_values((128, 8))))
        20
    """
    if not isinstance(device_num, int) or device_num < 1:
        raise LayoutError(f"device_num must be a positive integer, got {device_num!r}")
    options = [
        [1] if factor in rule.need_replication
        else [d for d in _divisors(math.gcd(size, device_num)) if values is None or d in values]
        for factor, size in zip(rule.factors, rule.factor_sizes)
    ]
    compounds = _compound_dims(rule)
    found = {(1,) * len(rule.factors)}
    for splits in _products(options, device_num):
        used = math.prod(splits)
        repeat = device_num // used
        if (repeat == 1 or allow_repeated and (repeats is None or repeat in repeats)) and _contiguous(splits, rule.factor_sizes, compounds):
            found.add(splits)
    strategies = [Strategy(rule, splits, device_num) for splits in sorted(found)]
    if allow_repeated and rule.op_type in LINEAR_OP_TYPES and not rule.reduction:
        strategies += [Strategy(rule, s.splits, device_num, sums_partials=True) for s in strategies if s.repeat > 1]
    return tuple(strategies)


def _products(options: list[list[int]], limit: int, prefix: tuple[int, ...] = ()):
    """Every choice of one option per factor whose product divides `limit`."""
    if len(prefix) == len(options):
        yield prefix
        return
    used = math.prod(prefix)
    for option in options[len(prefix)]:
        if limit % (used * option) == 0:
            yield from _products(options, limit, prefix + (option,))
