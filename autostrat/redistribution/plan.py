"""Plans: the ordered steps of one redistribution, with their layouts, rank groups and bytes."""

from __future__ import annotations

import math
from dataclasses import dataclass

from autostrat.cost.algorithms import algorithm_nanoseconds
from autostrat.layout import Layout
from autostrat.layout.layout import format_tuple
from autostrat.redistribution.lower import plan_to_text

STEP_KINDS = ("AllGather", "AllReduce", "AllToAll", "CollectivePermute", "PartialCreate", "ReduceScatter", "Reshape", "Slice")


@dataclass(frozen=True)
class RedistributionStep:
    """One step: `before` and `after` are layouts over the step's device matrix.

    `axes` are device axes of ``before.device_matrix`` (counted from the right): the block that
    is sliced, gathered, moved, reduced or made partial (PartialCreate), or for a
    CollectivePermute the axes whose role moves.
    `dims` is ``(dim,)`` for Slice, AllGather and ReduceScatter, ``(from, to)`` for AllToAll and
    ``()`` otherwise. `groups` are the communication groups, members in the order their chunks
    take in the step's dim (by rank for a PartialCreate: the first keeps its piece); `sources` gives, for a CollectivePermute, the rank each rank
    receives from. `bytes` is what one device sends (the busiest member) running the step as
    `algorithm` (`cost.algorithms`: "ring", "doubling", "hierarchical:K"), chosen when the plan
    was made (`redistribution.algorithms.with_algorithms`); `itemsize` (bytes per element) is
    set with any algorithm but the ring, whose time and bytes depend on it.
    """

    kind: str
    axes: tuple[int, ...]
    dims: tuple[int, ...]
    before: Layout
    after: Layout
    groups: tuple[tuple[int, ...], ...]
    bytes: int
    sources: tuple[int, ...] = ()
    algorithm: str = "ring"
    itemsize: int = 0

    @property
    def group_size(self) -> int:
        return len(self.groups[0]) if self.groups else 1

    def __str__(self) -> str:
        if self.kind == "Reshape":
            return f"Reshape({list(self.before.shape)} -> {list(self.after.shape)}, {self.bytes}B)"
        axes = format_tuple(str(axis) for axis in self.axes)
        dims = " dim " + "->".join(str(dim) for dim in self.dims) if self.dims else ""
        algorithm = "" if self.algorithm == "ring" else f", {self.algorithm}"  # ring plans read as before
        return f"{self.kind}(axes {axes}{dims}, {self.bytes}B{algorithm})"


@dataclass(frozen=True)
class RedistributionPlan:
    """The steps turning `src` into `dst`, and their total bytes per device.

    `exhaustive` is False when the state space was too large for the shortest-path search and
    the plan comes from the constructive fallback (`constructive.constructive_path`: resolve, gather,
    permute, slice; tagged "(constructive)"): valid but not proven minimal. A timed plan whose
    search stopped at its budget (`planner._timed_plan`) sets `least`, nanoseconds no plan beats
    (ring prices), and is tagged "(fastest >= N ns)".

    Example:
        >>> from autostrat.layout import DeviceMatrix, TensorMap
        >>> from autostrat.redistribution import plan_redistribution
        >>> src = Layout(DeviceMatrix((8,)), TensorMap((0, -1)), (64, 64))
        >>> str(plan_redistribution(src, Layout(DeviceMatrix((8,)), TensorMap((-1, -1)), (64, 64))))
        'AllGather(axes (2, 1, 0) dim 0, 14336B); 14336B'
    """

    src: Layout
    dst: Layout
    steps: tuple[RedistributionStep, ...]
    cost: int
    exhaustive: bool = True
    least: int | None = None

    def nanoseconds(self, model) -> int:
        """Predicted time of the steps under an α–β `model` (`cost.AlphaBeta`), whole nanoseconds.

        Example (gathering 8 row blocks over one 8-device server: 7 messages of 2 µs, 14 336 bytes at 450 GB/s):
            >>> from autostrat.cost import Hardware
            >>> from autostrat.layout import DeviceMatrix, TensorMap
            >>> from autostrat.redistribution import plan_redistribution
            >>> src = Layout(DeviceMatrix((8,)), TensorMap((0, -1)), (64, 64))
            >>> plan_redistribution(src, Layout(DeviceMatrix((8,)), TensorMap((-1, -1)), (64, 64))).nanoseconds(Hardware().alpha_beta(8))
            14032
        """
        return sum(step_nanoseconds(model, step) for step in self.steps)

    def to_text(self) -> str:
        """The IR dump of the plan (see `lower.plan_to_text`)."""
        return plan_to_text(self)

    def __str__(self) -> str:
        body = " -> ".join(str(step) for step in self.steps) or "no steps"
        return f"{body}; {self.cost}B{self.tag}"

    @property
    def tag(self) -> str:
        """What a plan not proven minimal says of itself in its text: nothing when it is."""
        if self.exhaustive:
            return ""
        return " (constructive)" if self.least is None else f" (fastest >= {self.least} ns)"


def step_nanoseconds(model, step: RedistributionStep) -> int:
    """Predicted time of one step under an α–β `model`, run as its recorded algorithm."""
    if step.algorithm == "ring":
        return model.step_nanoseconds(step.kind, step.before.device_matrix, step.axes, step.bytes)
    local_bytes = math.prod(step.before.slice_shape) * step.itemsize
    return algorithm_nanoseconds(model, step.kind, step.algorithm, step.before.device_matrix, step.axes, local_bytes, step.itemsize)
