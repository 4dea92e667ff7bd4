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

A MindSpore ``Layout`` seed (`layout.named`) may put the factors on the device axes in any order
and a factor on several axes; the strategy then carries a `Placement` saying so. A placement that
gives every rank the same slices as the default one is dropped, so equal strategies compare equal.

This module sits below `autostrat.rules`, so it reads a rule through the attributes listed in
`FactorRule` rather than importing it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cache, cached_property
from typing import Any, Protocol

from autostrat.errors import LayoutError
from autostrat.layout.device_matrix import DeviceMatrix
from autostrat.layout.layout import Layout, TensorMap, format_tuple
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

    @classmethod
    def from_tuples(cls, rule: FactorRule, in_strategy, device_num: int, out_strategy=None, where: str = "") -> Strategy:
        """Validate MindSpore strategy tuples (or MindSpore ``Layout`` s, see `layout.named`)
        against `rule` and convert them to factor splits (and a placement).

        `out_strategy` is only needed to split factors that no input has (OneHot's depth).
        Every problem raises `LayoutError` naming `where` (default: the op type).
        """
        where = where or rule.op_type
        if is_layout_strategy(in_strategy):
            splits, placement = placement_from_layouts(rule, in_strategy, out_strategy, device_num, where)
            return cls(rule, splits, device_num, placement=placement)
        splits = splits_from_tuples(rule, in_strategy, out_strategy, device_num, where)
        return cls(rule, splits, device_num)

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

    def tensor_map(self, dims: Dims) -> TensorMap:
        return TensorMap(tuple(tuple(axis for f in dim for axis in self.factor_axes(f)) or -1 for dim in dims))

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
        op = self.rule.reduce_op if partial else "sum"
        return tuple(
            Layout(self.device_matrix, self.tensor_map(dims), shape, partial, op)
            for dims, shape in zip(self.rule.outputs, self.rule.output_shapes)
        )

    def slice_context(self, rank: int) -> SliceContext:
        """Where `rank`'s slices of every input and output sit in the global tensors."""
        return SliceContext.of(rank, self.input_layouts, self.output_layouts)

    def operand_tuples(self, operands: tuple[Dims, ...]) -> tuple[tuple[int, ...], ...]:
        return tuple(tuple(math.prod(self.split(f) for f in dim) for dim in dims) for dims in operands)

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


def format_tuples(tuples) -> str:
    """Strategy tuples as MindSpore writes them: ``((2, 1), (1, 4))``, ``((8,),)``."""
    return format_tuple(format_tuple(str(part) for part in operand) for operand in tuples)
