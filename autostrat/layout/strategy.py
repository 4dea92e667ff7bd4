"""Strategies: how many parts each factor of an op's rule is cut into.

Users write MindSpore tuples, one per input, one count per dim: ``((2, 1), (1, 4))``. Internally
a strategy is one split count per factor of the op's rule; the device matrix, the tensor map of
every operand and the partial axes of every output all follow from it:

- the device matrix has one axis per factor, in the rule's factor order, sized by its split
  (MatMul ``m k, k n -> m n`` with ``((2, 1), (1, 4))`` gives ``[2, 1, 4]``);
- when the splits use fewer devices than `device_num` (repeated calculation) one more axis of
  size ``device_num / product`` is appended as the last, fastest axis, as MindSpore does;
- each dim maps to the axes of its factors; an output is partial over the axes of split
  reduction factors.

A rule with a ring pair ``t over s`` (`rules.Rule.ring`) also has ring strategies (`ring`):
every dim of factor t then sits on the device axes of s (t's own split stays 1: each device
still works through all of t, one block at a time, passed around the devices of s), and an
output dim of t takes those axes from the partial ones (the op sums over s along the ring).
In strategy tuples the dims of t show the split of s: ``((2, 1, 4, 1),) * 3`` for attention.

A MindSpore ``Layout`` seed (`layout.named`) may put the factors on the device axes in any order
and a factor on several axes; the strategy then carries a `Placement` saying so. A placement that
gives every rank the same slices as the default one is dropped, so equal strategies compare equal.

This module sits below `autostrat.rules`, so it reads a rule through the attributes listed in
`FactorRule` rather than importing it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import cache, cached_property
from typing import Any, Protocol

from autostrat.errors import LayoutError
from autostrat.layout.device_matrix import DeviceMatrix
from autostrat.layout.layout import Layout, TensorMap, format_tuple, remembered_hash, without_hash
from autostrat.layout.named import is_layout_strategy
from autostrat.layout.placement import Placement, default_placement
from autostrat.layout.slicing import SliceContext
from autostrat.layout.strategy_check import placement_from_layouts, splits_from_tuples

Dims = tuple[tuple[str, ...], ...]  # per dim of one operand, its factors (major first)


class FactorRule(Protocol):
    """What a strategy needs from an op's rule (implemented by `autostrat.rules.Rule`)."""

    op_type: str
    factors: tuple[str, ...]
    factor_sizes: tuple[int, ...]
    inputs: tuple[Dims, ...]
    outputs: tuple[Dims, ...]
    input_shapes: tuple[tuple[int, ...], ...]
    output_shapes: tuple[tuple[int, ...], ...]
    reduction: frozenset[str]
    need_replication: frozenset[str]
    reduce_op: str
    ring: tuple[str, ...]


@cache
def canonical_placement(placement: Placement, splits: tuple[int, ...], factor_sizes: tuple[int, ...], device_num: int,
                        op_type: str) -> Placement | None:
    """`placement` of `splits` checked, in normal form (`Layout.normalized` of the factors seen
    as one tensor's dims); None when it splits every factor as `default_placement` does.
    Cached: re-placed candidates repeat across the layers of a model."""
    where = f"{op_type}: placement {placement}"
    if math.prod(placement.matrix) != device_num or len(placement.axes) != len(splits):
        raise LayoutError(f"{where}: expected a device matrix of {device_num} devices and axes for {len(splits)} factors")
    used = [axis for axes in placement.axes for axis in axes]
    if len(set(used)) != len(used) or any(not 0 <= axis < len(placement.matrix) for axis in used):
        raise LayoutError(f"{where}: every device axis may split one factor at most, and must exist")
    sizes = [math.prod(placement.matrix[len(placement.matrix) - 1 - a] for a in axes) for axes in placement.axes]
    if tuple(sizes) != splits:
        raise LayoutError(f"{where}: its axes split the factors into {tuple(sizes)} parts, not {splits}")
    normal = placement.factor_layout(factor_sizes).normalized()
    if normal == default_placement(splits, device_num).factor_layout(factor_sizes).normalized():
        return None
    return Placement(normal.device_matrix.shape, normal.tensor_map.entries)


@dataclass(frozen=True)
class Strategy:
    """A split count per factor of `rule`, for `device_num` devices.

    Example (MindSpore's tutorial MatMul):
        >>> from autostrat.rules import make_rule
        >>> rule = make_rule("MatMul", [(256, 784), (784, 64)])
        >>> strategy = Strategy.from_tuples(rule, ((2, 1), (1, 4)), device_num=8)
        >>> str(strategy), str(strategy.device_matrix)
        ('((2, 1), (1, 4))', '[2, 1, 4]')
        >>> [str(layout.tensor_map) for layout in strategy.input_layouts]
        ['(2, 1)', '(1, 0)']
    """

    rule: Any
    splits: tuple[int, ...]
    device_num: int
    # An op linear in every input (Add, Sub) may take inputs that are partial sums over the
    # repeated-calculation axis and leave its output partial there: each device adds its pieces,
    # and the sum is resolved once, after (Megatron's gradients of one activation read by Q, K
    # and V: three partial sums added before a single AllReduce).
    sums_partials: bool = False
    # Inputs (parameters this op reads first) kept between steps in their optimizer-shard layout
    # and gathered into `input_layouts` for use (ZeRO-3, `search.optimizer_shard`): the op's
    # computation is the same, only where its parameters rest differs.
    at_rest: tuple[int, ...] = ()
    # Where the factors sit on the devices when not in the default order (a Layout seed, or a
    # candidate following a neighbour's layout); None: the default (`default_placement`).
    placement: Placement | None = None
    # A ring strategy of a rule with a ring pair (module docstring): the streamed factor's
    # blocks are held over the carrier's devices and passed around them by the op.
    ring: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "splits", tuple(int(s) for s in self.splits))
        if len(self.splits) != len(self.rule.factors):
            raise LayoutError(f"{self.rule.op_type}: expected {len(self.rule.factors)} factor splits, got {self.splits}")
        if self.device_num < 1 or self.device_num % math.prod(self.splits):
            raise LayoutError(
                f"{self.rule.op_type}: splits {self.splits} use {math.prod(self.splits)} devices, "
                f"which does not divide device_num {self.device_num}"
            )
        if self.placement is not None:
            object.__setattr__(self, "placement", canonical_placement(
                self.placement, self.splits, tuple(self.rule.factor_sizes), self.device_num, self.rule.op_type))
        if self.sums_partials and (self.repeat == 1 or self.rule.reduction):
            raise LayoutError(f"{self.rule.op_type}: partial-sum inputs need a repeated-calculation axis and no reduction, "
                              f"got splits {self.splits} on {self.device_num} devices")
        if self.ring:
            _check_ring(self.rule, self.splits)

    def __hash__(self) -> int:
        # Remembered: the cost tables are shared by candidate tuples (`search.problem_edges.edge_table`),
        # hashed through every strategy's rule for every edge.
        return remembered_hash(self)

    def __getstate__(self) -> dict:
        return without_hash(self)

    @classmethod
    def from_tuples(cls, rule: FactorRule, in_strategy, device_num: int, out_strategy=None, where: str = "") -> Strategy:
        """Validate MindSpore strategy tuples (or MindSpore ``Layout`` s, see `layout.named`)
        against `rule` and convert them to factor splits (and a placement).

        `out_strategy` is only needed to split factors that no input has (OneHot's depth).
        Every problem raises `LayoutError` naming `where` (default: the op type).
        """
        where = where or rule.op_type
        in_strategy, ring = ring_from_operands(rule, in_strategy, where)
        if is_layout_strategy(in_strategy):
            splits, placement = placement_from_layouts(rule, in_strategy, out_strategy, device_num, where)
            return cls(rule, splits, device_num, placement=placement, ring=ring)
        splits = splits_from_tuples(rule, in_strategy, out_strategy, device_num, where)
        return cls(rule, splits, device_num, ring=ring)

    @property
    def repeat(self) -> int:
        """Size of the repeated-calculation axis (1 when the strategy uses every device)."""
        return self.device_num // math.prod(self.splits)

    def split(self, factor: str) -> int:
        return self.splits[self.rule.factors.index(factor)]

    @cached_property
    def _placement(self) -> Placement:
        return self.placement or default_placement(self.splits, self.device_num)

    @cached_property
    def device_matrix(self) -> DeviceMatrix:
        return DeviceMatrix(self._placement.matrix)

    def factor_axes(self, factor: str) -> tuple[int, ...]:
        """The device axes (counted from the right, major first) that carry `factor`."""
        return self._placement.axes[self.rule.factors.index(factor)]

    def held_axes(self, factor: str) -> tuple[int, ...]:
        """The device axes an operand dim of `factor` is split over: `factor_axes`, except for a
        ring strategy's streamed factor, held over its carrier's axes."""
        if self.ring and factor == self.rule.ring[0]:
            return self.factor_axes(self.rule.ring[1])
        return self.factor_axes(factor)

    def tensor_map(self, dims: Dims) -> TensorMap:
        return TensorMap(tuple(tuple(axis for f in dim for axis in self.held_axes(f)) or -1 for dim in dims))

    def ring_group(self, rank: int) -> tuple[int, ...]:
        """A ring strategy's ring through `rank`: the ranks differing from it only on the
        carrier's axes, in the order of the blocks of the carrier they hold.

        Example (ring attention, query rows over 4 of 8 devices):
            >>> from autostrat.rules import make_rule
            >>> rule = make_rule("FlashAttentionScore", [(2, 2, 8, 4)] * 3, head_num=2, sparse_mode=2)
            >>> ring = Strategy.from_tuples(rule, ((2, 1, 4, 1),) * 3, 8)
            >>> ring.ring, ring.ring_group(5), str(ring.input_layouts[1].tensor_map)
            (True, (4, 5, 6, 7), '(4, 3, 2, 1)')
        """
        carrier = self.factor_axes(self.rule.ring[1])
        [group] = [g for g in self.device_matrix.groups(carrier) if rank in g]
        index, dim = next((i, d) for i, dims in enumerate(self.rule.inputs) for d, factors in enumerate(dims)
                          if factors == (self.rule.ring[1],))
        layout = self.input_layouts[index]
        return tuple(sorted(group, key=lambda member: layout.shard_index(member)[dim]))

    @cached_property
    def repeat_axes(self) -> tuple[int, ...]:
        """The device axes of the repeated calculation (split by no factor)."""
        if self.placement is None:
            return (0,) if self.repeat > 1 else ()  # the repeated axis is the last (rightmost)
        used = {axis for axes in self.placement.axes for axis in axes}
        return tuple(axis for axis in range(len(self.placement.matrix)) if axis not in used)

    @cached_property
    def input_layouts(self) -> tuple[Layout, ...]:
        partial = self.repeat_axes if self.sums_partials else ()
        return tuple(
            Layout(self.device_matrix, self.tensor_map(dims), shape, partial)
            for dims, shape in zip(self.rule.inputs, self.rule.input_shapes)
        )

    @cached_property
    def output_layouts(self) -> tuple[Layout, ...]:
        partial = tuple(axis for f in self.rule.reduction if self.split(f) > 1 for axis in self.factor_axes(f))
        partial += self.repeat_axes if self.sums_partials else ()
        layouts = []
        for dims, shape in zip(self.rule.outputs, self.rule.output_shapes):
            tensor_map = self.tensor_map(dims)
            summed = tuple(axis for axis in partial if axis not in tensor_map.axes)  # a ring's dims take theirs
            layouts.append(Layout(self.device_matrix, tensor_map, shape, summed, self.rule.reduce_op if summed else "sum"))
        return tuple(layouts)

    def slice_context(self, rank: int) -> SliceContext:
        """Where `rank`'s slices of every input and output sit in the global tensors."""
        return SliceContext.of(rank, self.input_layouts, self.output_layouts)

    def operand_tuples(self, operands: tuple[Dims, ...]) -> tuple[tuple[int, ...], ...]:
        parts = dict(zip(self.rule.factors, self.splits))
        if self.ring:
            parts[self.rule.ring[0]] = parts[self.rule.ring[1]]
        return tuple(tuple(math.prod(parts[f] for f in dim) for dim in dims) for dims in operands)

    def to_tuples(self) -> tuple[tuple[int, ...], ...]:
        """The MindSpore `in_strategy`: per input, the number of parts of each dim."""
        return self.operand_tuples(self.rule.inputs)

    def out_tuples(self) -> tuple[tuple[int, ...], ...] | None:
        """The `out_strategy`, needed only when a factor that no input has is split."""
        input_factors = {f for dims in self.rule.inputs for dim in dims for f in dim}
        if all(self.split(f) == 1 for f in self.rule.factors if f not in input_factors):
            return None
        return self.operand_tuples(self.rule.outputs)

    def __str__(self) -> str:
        text = format_tuples(self.to_tuples())
        out = self.out_tuples()
        text = text if out is None else f"{text} out {format_tuples(out)}"
        if self.placement is not None:  # the device matrix and the inputs' tensor maps, as MindSpore's in_layout
            maps = ", ".join(str(layout.tensor_map) for layout in self.input_layouts)
            text = f"{text} on {list(self.placement.matrix)}: {maps}"
        text = f"{text} partial sums" if self.sums_partials else text
        return f"{text} at rest sharded: input {', '.join(map(str, self.at_rest))}" if self.at_rest else text


def _check_ring(rule, splits: tuple[int, ...]) -> None:
    """A ring strategy needs a ring pair whose carrier is split and whose streamed factor that
    split divides."""
    if not rule.ring:
        raise LayoutError(f"{rule.op_type}: only an op with a ring pair has ring strategies")
    streamed, carrier = (rule.factors.index(f) for f in rule.ring)
    if splits[carrier] < 2 or rule.factor_sizes[streamed] % splits[carrier]:
        raise LayoutError(f"{rule.op_type}: a ring over factor {rule.ring[1]!r} needs it split, into parts that also divide "
                          f"factor {rule.ring[0]!r} of size {rule.factor_sizes[streamed]}; got splits {splits}")


def ring_from_operands(rule, in_strategy, where: str):
    """(`in_strategy` with the streamed factor's dims whole, whether they were split): a rule
    with a ring pair reads a split of them as a ring strategy (module docstring); they must be
    split as the carrier, over the same device axes."""
    if not rule.ring or not isinstance(in_strategy, (tuple, list)) or len(in_strategy) != len(rule.inputs):
        return in_strategy, False
    streamed, carrier = rule.ring
    layouts = is_layout_strategy(in_strategy)
    cuts, carried = set(), set()
    for dims, entry in zip(rule.inputs, in_strategy):
        parts = entry.parts() if layouts else entry
        if not isinstance(parts, (tuple, list)) or len(parts) != len(dims):
            return in_strategy, False  # the form's checks say what is wrong
        axes = entry.dim_axes() if layouts else parts
        cuts |= {(parts[i], axes[i]) for i, factors in enumerate(dims) if streamed in factors}
        carried |= {(parts[i], axes[i]) for i, factors in enumerate(dims) if factors == (carrier,)}
    if all(part == 1 for part, _ in cuts):
        return in_strategy, False
    if len(cuts) != 1 or cuts != carried:
        raise LayoutError(f"{where}: a ring strategy splits every dim of factor {streamed!r} as factor {carrier!r} is split "
                          f"(over the same device axes), got {in_strategy!r}")
    return tuple(_whole(rule, dims, entry, streamed, layouts) for dims, entry in zip(rule.inputs, in_strategy)), True


def _whole(rule, dims: Dims, entry, factor: str, layouts: bool):
    """One operand's tuple or Layout with the dims of `factor` uncut."""
    if layouts:
        return replace(entry, names=tuple("None" if factor in factors else name for factors, name in zip(dims, entry.names)))
    return tuple(1 if factor in factors else part for factors, part in zip(dims, entry))


def format_tuples(tuples) -> str:
    """Strategy tuples as MindSpore writes them: ``((2, 1), (1, 4))``, ``((8,),)``."""
    return format_tuple(format_tuple(str(part) for part in operand) for operand in tuples)
