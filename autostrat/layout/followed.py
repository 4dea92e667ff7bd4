"""A strategy that follows a tensor's layout instead of being searched.

An optimiser update is elementwise over a parameter, its gradient and its state; it runs
wherever the parameter lives, so that the new value is already in the parameter's layout for
the next step (no writeback). The parameter's layout comes from its first reader's strategy,
and may put its replicas on any device axis, which no enumerated strategy of the update's own
rule reproduces; so the update gets this strategy instead: every operand of the parameter's
shape in that layout, scalar operands whole on every rank.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

from autostrat.errors import LayoutError
from autostrat.layout.layout import Layout, TensorMap, format_tuple
from autostrat.layout.slicing import SliceContext


@dataclass(frozen=True)
class FollowedStrategy:
    """The strategy of an op whose operands all take `layout` (scalars are replicated).

    Example:
        >>> from autostrat.layout import DeviceMatrix
        >>> from autostrat.rules import make_rule
        >>> stored = Layout(DeviceMatrix((2, 4)), TensorMap((0, -1)), (64, 32))
        >>> strategy = FollowedStrategy(make_rule("ApplyGradientDescent", [(64, 32), (64, 32)]), stored)
        >>> str(strategy), strategy.output_layouts[0] == stored, strategy.repeat, strategy.splits
        ('((4, 1), (4, 1))', True, 2, (4, 1))
    """

    rule: Any
    layout: Layout
    at_rest = ()  # an update op reads parameters in the layout they rest in (`Strategy.at_rest`)
    placement = None  # the followed layout says where everything sits (`Strategy.placement`)
    ring = False  # an update passes nothing around (`Strategy.ring`)
    sums_partials = False

    def __post_init__(self) -> None:
        if self.layout.partial:
            raise LayoutError(f"{self.rule.op_type}: a followed layout cannot be partial, got {self.layout}")
        shapes = set(self.rule.input_shapes) | set(self.rule.output_shapes)
        if shapes - {self.layout.shape, ()}:
            raise LayoutError(f"{self.rule.op_type}: operands of shapes {sorted(shapes)} cannot all follow {self.layout}")

    @property
    def device_num(self) -> int:
        return self.layout.device_num

    @property
    def device_matrix(self):
        return self.layout.device_matrix

    @property
    def repeat(self) -> int:
        return self.device_num // len(set(self.layout.shard_index(rank) for rank in range(self.device_num)))

    @cached_property
    def splits(self) -> tuple[int, ...]:
        """Parts per factor of the rule, read off the layout: each factor names one dim of the
        followed shape, as in the optimiser rules (`op_cost` prices the update with them)."""
        dims = next((dims for dims, shape in zip(self.rule.inputs, self.rule.input_shapes) if shape == self.layout.shape), ())
        parts = {factors[0]: part for factors, part in zip(dims, self.layout.parts) if len(factors) == 1}
        return tuple(parts.get(factor, 1) for factor in self.rule.factors)

    def _layout(self, shape: tuple[int, ...]) -> Layout:
        return self.layout if shape == self.layout.shape else Layout(self.layout.device_matrix, TensorMap(()), ())

    @cached_property
    def input_layouts(self) -> tuple[Layout, ...]:
        return tuple(self._layout(shape) for shape in self.rule.input_shapes)

    @cached_property
    def output_layouts(self) -> tuple[Layout, ...]:
        return tuple(self._layout(shape) for shape in self.rule.output_shapes)

    def slice_context(self, rank: int) -> SliceContext:
        return SliceContext.of(rank, self.input_layouts, self.output_layouts)

    def to_tuples(self) -> tuple[tuple[int, ...], ...]:
        return tuple(layout.parts for layout in self.input_layouts)

    def out_tuples(self) -> None:
        return None

    def __str__(self) -> str:
        return format_tuple(format_tuple(str(part) for part in parts) for parts in self.to_tuples())
