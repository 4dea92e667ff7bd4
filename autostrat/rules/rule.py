"""A rule: an op's factor equation bound to the shapes of its inputs.

Factor kinds:

- pass-through: the factor appears in an output; splitting it splits that output the same way;
- reduction: the factor appears in inputs but in no output (MatMul's ``k``); splitting it leaves
  every output partial over its device axis, to be combined by the rule's `reduce_op`;
- need-replication: the factor may not be split (Softmax's axis, LayerNorm's normalised dims).

A rule may also name a ring pair (`RuleSpec.ring`, e.g. ``"t s"``): need-replication factor t
may instead be held split over the devices that split s, the op passing its blocks around
them (ring attention: keys and values over the devices that split the query rows); a strategy
says whether it does (`layout.Strategy.ring`), and how it is priced is `cost.ring`'s. And a
causal pair (`RuleSpec.causal`, ``"s t"``): the op works only on the iterations whose t is at
most s (a causal mask, whose hidden blocks FlashAttention skips), which its price counts
(`cost.op_cost`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from autostrat.errors import RuleError
from autostrat.rules.notation import Operand, format_operands, parse_equation

REDUCE_OPS = ("max", "min", "sum")


@dataclass(frozen=True)
class RuleSpec:
    """What an op's rule builder returns: the equation and what the shapes cannot tell.

    `sizes` gives factors whose size no input dim determines (an output-only factor, or a
    factor hidden inside a compound dim); `need_replication` is a space-separated factor list.
    """

    equation: str
    sizes: dict[str, int] = field(default_factory=dict)
    need_replication: str = ""
    reduce_op: str = "sum"
    ring: str = ""  # "t s": factor t may ride the devices of s, passed around them (module docstring)
    causal: str = ""  # "s t": only the iterations with t <= s are worked on (module docstring)


@dataclass(frozen=True)
class Rule:
    """An op's factor equation with every factor sized (it satisfies `layout.FactorRule`).

    Example:
        >>> rule = Rule.build("MatMul", RuleSpec("m k, k n -> m n"), [(256, 784), (784, 64)])
        >>> rule.factors, rule.factor_sizes, sorted(rule.reduction), rule.output_shapes
        (('m', 'k', 'n'), (256, 784, 64), ['k'], ((256, 64),))
        >>> str(rule)
        'm k, k n -> m n; reduction k'
    """

    op_type: str
    inputs: tuple[Operand, ...]
    outputs: tuple[Operand, ...]
    factors: tuple[str, ...]
    factor_sizes: tuple[int, ...]
    input_shapes: tuple[tuple[int, ...], ...]
    output_shapes: tuple[tuple[int, ...], ...]
    reduction: frozenset[str]
    need_replication: frozenset[str]
    reduce_op: str = "sum"
    ring: tuple[str, ...] = ()  # (streamed factor, carrier factor), or none
    causal: tuple[str, ...] = ()  # (row factor, key factor), or none

    @classmethod
    def build(cls, op_type: str, spec: RuleSpec, input_shapes) -> Rule:
        inputs, outputs = parse_equation(spec.equation)
        shapes = tuple(tuple(int(size) for size in shape) for shape in input_shapes)
        if len(inputs) != len(shapes):
            raise RuleError(f"{op_type} takes {len(inputs)} inputs ({spec.equation}), got {len(shapes)}")
        factors = _factor_order(inputs + outputs)
        sizes = _infer_sizes(op_type, inputs, shapes, dict(spec.sizes), spec.equation)
        unsized = [f for f in factors if f not in sizes]
        if unsized:
            raise RuleError(f"{op_type}: the size of factor {unsized[0]!r} in {spec.equation!r} is unknown")
        need = frozenset(spec.need_replication.split())
        if need - set(factors):
            raise RuleError(f"{op_type}: need-replication factor {sorted(need - set(factors))[0]!r} is not in {spec.equation!r}")
        if spec.reduce_op not in REDUCE_OPS:
            raise RuleError(f"{op_type}: reduce_op must be one of {REDUCE_OPS}, got {spec.reduce_op!r}")
        ring = tuple(spec.ring.split())
        if ring and (len(ring) != 2 or ring[0] not in need or ring[1] not in factors or ring[1] in need):
            raise RuleError(f"{op_type}: a ring pair is a need-replication factor and a splittable one of {spec.equation!r}, "
                            f"got {spec.ring!r}")
        causal = tuple(spec.causal.split())
        if causal and (len(causal) != 2 or not set(causal) <= set(factors)):
            raise RuleError(f"{op_type}: a causal pair is two factors of {spec.equation!r}, got {spec.causal!r}")
        output_factors = {f for operand in outputs for dim in operand for f in dim}
        input_factors = {f for operand in inputs for dim in operand for f in dim}
        return cls(
            op_type=op_type,
            inputs=inputs,
            outputs=outputs,
            factors=factors,
            factor_sizes=tuple(sizes[f] for f in factors),
            input_shapes=shapes,
            output_shapes=tuple(_shape(operand, sizes) for operand in outputs),
            reduction=frozenset(input_factors - output_factors - need),
            need_replication=need,
            reduce_op=spec.reduce_op,
            ring=ring,
            causal=causal,
        )

    @property
    def sizes(self) -> dict[str, int]:
        return dict(zip(self.factors, self.factor_sizes))

    def __str__(self) -> str:
        text = f"{format_operands(self.inputs)} -> {format_operands(self.outputs)}"
        if self.reduction:
            op = "" if self.reduce_op == "sum" else f"({self.reduce_op}) "
            text += f"; reduction {op}{' '.join(f for f in self.factors if f in self.reduction)}"
        if self.need_replication:
            text += f"; need-replication {' '.join(f for f in self.factors if f in self.need_replication)}"
        if self.ring:
            text += f"; ring {self.ring[0]} over {self.ring[1]}"
        if self.causal:
            text += f"; causal {self.causal[1]} <= {self.causal[0]}"
        return text


def _factor_order(operands: tuple[Operand, ...]) -> tuple[str, ...]:
    seen: dict[str, None] = {}
    for operand in operands:
        for dim in operand:
            for factor in dim:
                seen.setdefault(factor)
    return tuple(seen)


def _shape(operand: Operand, sizes: dict[str, int]) -> tuple[int, ...]:
    shape = []
    for dim in operand:
        size = 1
        for factor in dim:
            size *= sizes[factor]
        shape.append(size)
    return tuple(shape)


def _infer_sizes(op_type, inputs, shapes, sizes: dict[str, int], equation: str) -> dict[str, int]:
    # Cases per input dim: "1" must have size 1; a single factor takes the dim's size; a compound
    # dim may leave one factor unsized, which takes the quotient. A second sighting must agree.
    where = {factor: "the rule's sizes" for factor in sizes}
    for index, (operand, shape) in enumerate(zip(inputs, shapes)):
        if len(operand) != len(shape):
            raise RuleError(
                f"{op_type}: input {index} has {len(shape)} dims (shape {list(shape)}) but "
                f"{equation!r} gives it {len(operand)}"
            )
        for dim, (factors, size) in enumerate(zip(operand, shape)):
            place = f"input {index} dim {dim}"
            unknown = [f for f in factors if f not in sizes]
            known = 1
            for factor in factors:
                known *= sizes.get(factor, 1)
            if len(unknown) == 1 and size % known == 0:
                sizes[unknown[0]], where[unknown[0]] = size // known, place
                known = size
            elif len(unknown) > 1:
                raise RuleError(f"{op_type}: compound dim {place} of {equation!r} needs the sizes of {unknown[1:]}")
            if known != size:
                detail = " x ".join(f"{f}={sizes[f]} ({where[f]})" for f in factors) or "1 (a broadcast dim)"
                raise RuleError(f"{op_type}: {place} has size {size} but its factors give {detail}")
    return sizes
