"""Lower plan steps to MindSpore-style primitive lists, for IR dumps and backend calls.

MindSpore's collectives work on dim 0: an AllGather on another dim is AllGather, then Split on
dim 0 into the group's chunks and Concat on the wanted dim; a ReduceScatter on another dim first
moves that dim's chunks to dim 0 (Split, Concat). A Slice is a StridedSlice whose begin on `dim`
is the rank's chunk times the new slice size. A Reshape is MindSpore's local ``Reshape`` to the
rank's new slice shape. A PartialCreate of a sum is MindSpore's ``ZerosLike`` on every member of
its groups but the first (members by rank); of a max or min it is no op at all. Groups list their
members in chunk order. A collective run as another algorithm than the ring (`cost.algorithms`)
says which in an ``algorithm`` attribute.
"""

from __future__ import annotations

from dataclasses import dataclass

from autostrat.errors import LayoutError


@dataclass(frozen=True)
class Primitive:
    """One primitive op: a MindSpore name and its attributes as sorted ``(name, value)`` pairs.

    Example:
        >>> str(Primitive.make("Concat", axis=1))
        'Concat(axis=1)'
    """

    name: str
    attrs: tuple[tuple[str, object], ...] = ()

    @classmethod
    def make(cls, name: str, **attrs) -> Primitive:
        return cls(name, tuple(sorted(attrs.items())))

    def __str__(self) -> str:
        return f"{self.name}(" + ", ".join(f"{key}={value}" for key, value in self.attrs) + ")"


def _groups(step) -> list[list[int]]:
    return [list(group) for group in step.groups]


def lower_step(step) -> tuple[Primitive, ...]:
    """The primitives of one `RedistributionStep`, in execution order.

    Example:
        >>> from autostrat.layout import DeviceMatrix, Layout, TensorMap
        >>> from autostrat.redistribution import plan_redistribution
        >>> src = Layout(DeviceMatrix((2,)), TensorMap((-1, 0)), (4, 4))
        >>> plan = plan_redistribution(src, Layout(DeviceMatrix((2,)), TensorMap((-1, -1)), (4, 4)))
        >>> [str(p) for p in lower_step(plan.steps[0])]
        ['AllGather(groups=[[0, 1]])', 'Split(axis=0, output_num=2)', 'Concat(axis=1)']
    """
    g, groups, dims = step.group_size, _groups(step), step.dims
    chosen = {} if step.algorithm == "ring" else {"algorithm": step.algorithm}  # a ring's primitive reads as before
    op = step.after.partial_op if step.kind == "PartialCreate" else step.before.partial_op
    if step.kind == "Slice":
        return (Primitive.make("StridedSlice", axis=dims[0], parts=g, slice_size=step.after.slice_shape[dims[0]]),)
    if step.kind == "AllGather":
        gather = Primitive.make("AllGather", groups=groups, **chosen)
        if dims[0] == 0:
            return (gather,)
        return gather, Primitive.make("Split", axis=0, output_num=g), Primitive.make("Concat", axis=dims[0])
    if step.kind == "AllToAll":
        return (Primitive.make("AllToAll", concat_dim=dims[0], groups=groups, split_count=g, split_dim=dims[1]),)
    if step.kind == "AllReduce":
        return (Primitive.make("AllReduce", groups=groups, op=op, **chosen),)
    if step.kind == "ReduceScatter":
        scatter = Primitive.make("ReduceScatter", groups=groups, op=op, **chosen)
        if dims[0] == 0:
            return (scatter,)
        return Primitive.make("Split", axis=dims[0], output_num=g), Primitive.make("Concat", axis=0), scatter
    if step.kind == "CollectivePermute":
        return (Primitive.make("CollectivePermute", pairs=[list(pair) for pair in step.groups]),)
    if step.kind == "Reshape":
        return (Primitive.make("Reshape", shape=list(step.after.slice_shape)),)
    if step.kind == "PartialCreate":
        zeroed = [group[1:] for group in groups]
        return (Primitive.make("ZerosLike", ranks=zeroed),) if op == "sum" else ()
    raise LayoutError(f"cannot lower step kind {step.kind!r}")


def lower_plan(plan) -> tuple[Primitive, ...]:
    """Every primitive of `plan`, in order."""
    return tuple(primitive for step in plan.steps for primitive in lower_step(step))


def plan_to_text(plan) -> str:
    """A stable text dump: the edge, then per step its summary and its primitives.

    Example:
        >>> from autostrat.layout import DeviceMatrix, Layout, TensorMap
        >>> from autostrat.redistribution import plan_redistribution
        >>> src = Layout(DeviceMatrix((2,)), TensorMap((0,)), (4,))
        >>> print(plan_to_text(plan_redistribution(src, src.with_partial(()))))
        redistribution [4] dm[2] tm(0,) -> [4] dm[2] tm(0,): 0B
    """
    lines = [f"redistribution {plan.src} -> {plan.dst}: {plan.cost}B{plan.tag}"]
    for index, step in enumerate(plan.steps, start=1):
        lines.append(f"  {index}. {step}  {step.before} -> {step.after}")
        lines.extend(f"     {primitive}" for primitive in lower_step(step))
    return "\n".join(lines)
