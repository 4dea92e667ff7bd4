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


def on_mesh(splits, repeat: int, axes: tuple[int, ...]) -> bool:
    """Whether the device matrix of a candidate with `splits` repeating its work `repeat` times
    is made of whole mesh `axes` in their order: each split above 1, then the repeat, the
    product of the next few axes.

    A candidate's device matrix is its splits in factor order with its repeated number innermost
    (MindSpore's convention), so on a mesh of 128 servers x 8 devices a batch split over the
    servers with the hidden dim split inside each is on it, and so is the batch split over the
    servers repeated inside each (Megatron's LayerNorm); a split of 8 over the outer devices, a
    part of the server axis, is not. Redistributions between layouts on one mesh stay searches
    over few axes; between mixed ones they were the most costly of a 1024-device search.

    Example:
        >>> on_mesh((128, 1, 8), 1, (128, 8)), on_mesh((1, 1), 1024, (128, 8)), on_mesh((8, 128), 1, (128, 8))
        (True, True, False)
    """
    index = 0
    for size in [split for split in splits if split > 1] + [repeat]:
        product = 1
        while product < size and index < len(axes):
            product *= axes[index]
            index += 1
        if product != size:
            return False
    return index == len(axes)


def divisors(number: int) -> list[int]:
    """Every divisor of `number`, ascending.

    Example:
        >>> divisors(12)
        [1, 2, 3, 4, 6, 12]
    """
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
                        values: frozenset[int] | None = None, mesh: tuple[int, ...] | None = None) -> tuple[Strategy, ...]:
    """Every candidate strategy of `rule` on `device_num` devices, in a deterministic order;
    with `values` (`split_values`), only those whose every split is one of them; with `mesh`
    (axis sizes, outer first), only those whose device matrix is made of its axes (`on_mesh`).

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
        else [d for d in divisors(math.gcd(size, device_num)) if values is None or d in values]
        for factor, size in zip(rule.factors, rule.factor_sizes)
    ]
    compounds = _compound_dims(rule)
    found = {(1,) * len(rule.factors)}
    for splits in _products(options, device_num):
        used = math.prod(splits)
        if (used == device_num or allow_repeated) and _contiguous(splits, rule.factor_sizes, compounds) and (
                mesh is None or on_mesh(splits, device_num // used, mesh)):
            found.add(splits)
    strategies = [Strategy(rule, splits, device_num) for splits in sorted(found)]
    if allow_repeated and rule.op_type in LINEAR_OP_TYPES and not rule.reduction:
        strategies += [Strategy(rule, s.splits, device_num, sums_partials=True) for s in strategies if s.repeat > 1]
    return tuple(strategies) + ring_strategies(rule, strategies)


def ring_strategies(rule: Rule, strategies) -> tuple[Strategy, ...]:
    """The ring variant (`Strategy.ring`) of each of `strategies` whose carrier split a ring
    can run over (none without a ring pair), after them all: the enumeration-order tie-break
    then keeps the form without a ring where both cost the same.

    Example (fused attention on 4 devices: the query rows over 4, or over 2 and the heads over 2,
    can ring; its three other candidates come first):
        >>> from autostrat.rules import make_rule
        >>> rule = make_rule("FlashAttentionScore", [(1, 2, 8, 4)] * 3, head_num=2)
        >>> [str(s) for s in generate_strategies(rule, 4)[3:]]
        ['((1, 1, 4, 1), (1, 1, 4, 1), (1, 1, 4, 1))', '((1, 2, 2, 1), (1, 2, 2, 1), (1, 2, 2, 1))']
    """
    if not rule.ring:
        return ()
    streamed, carrier = (rule.factors.index(f) for f in rule.ring)
    return tuple(Strategy(rule, s.splits, s.device_num, ring=True) for s in strategies
                 if not s.sums_partials and s.splits[carrier] > 1 and rule.factor_sizes[streamed] % s.splits[carrier] == 0)


def _products(options: list[list[int]], limit: int, prefix: tuple[int, ...] = ()):
    """Every choice of one option per factor whose product divides `limit`."""
    if len(prefix) == len(options):
        yield prefix
        return
    used = math.prod(prefix)
    for option in options[len(prefix)]:
        if limit % (used * option) == 0:
            yield from _products(options, limit, prefix + (option,))
