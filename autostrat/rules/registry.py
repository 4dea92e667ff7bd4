"""The registry of op rules, keyed by MindSpore op type.

An op registers a builder ``(input_shapes, **attrs) -> RuleSpec`` and the examples the oracle
tests run it on; the moment an op is registered the oracle covers every candidate strategy of
every example.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Callable

from autostrat.errors import RuleError, UnknownOpError
from autostrat.rules.rule import Rule, RuleSpec


@dataclass(frozen=True)
class Example:
    """Inputs the oracle runs an op on: shapes, attributes, and the value domain.

    `integers` maps an input index to the exclusive upper bound of its random integer values
    (indices); `positive` asks for float inputs above zero (Log, Sqrt).
    """

    shapes: tuple[tuple[int, ...], ...]
    attrs: dict = field(default_factory=dict)
    integers: dict[int, int] = field(default_factory=dict)
    positive: bool = False


@dataclass(frozen=True)
class OpDef:
    op_type: str
    build: Callable[..., RuleSpec]
    examples: tuple[Example, ...]

    @property
    def attr_names(self) -> tuple[str, ...]:
        return tuple(list(inspect.signature(self.build).parameters)[1:])


_OPS: dict[str, OpDef] = {}


def register(op_type: str, examples: list[Example]):
    """Decorator registering a rule builder under `op_type`.

    Example:
        >>> from autostrat.rules.rule import RuleSpec
        >>> @register("DocExampleIdentity", examples=[Example(((4, 6),))])
        ... def identity(shapes):
        ...     return RuleSpec("a b -> a b")
        >>> str(make_rule("DocExampleIdentity", [(4, 6)]))
        'a b -> a b'
        >>> unregister("DocExampleIdentity")
    """

    def decorate(build: Callable[..., RuleSpec]) -> Callable[..., RuleSpec]:
        if op_type in _OPS:
            raise RuleError(f"op type {op_type!r} is already registered")
        if not examples:
            raise RuleError(f"op type {op_type!r} needs at least one example for the oracle tests")
        _OPS[op_type] = OpDef(op_type, build, tuple(examples))
        return build

    return decorate


def unregister(op_type: str) -> None:
    """Remove a registration (tests and doc examples register temporary ops)."""
    _OPS.pop(op_type)


def op_types() -> tuple[str, ...]:
    """Every registered op type, alphabetically."""
    return tuple(sorted(_OPS))


def get_op(op_type: str) -> OpDef:
    if op_type not in _OPS:
        raise UnknownOpError(f"unknown op type {op_type!r}; registered ops: {', '.join(op_types())}")
    return _OPS[op_type]


def make_rule(op_type: str, input_shapes, **attrs) -> Rule:
    """The rule of `op_type` applied to inputs of `input_shapes` with `attrs`.

    Example:
        >>> str(make_rule("MatMul", [(64, 32), (64, 16)], transpose_a=True))
        'k m, k n -> m n; reduction k'
    """
    op = get_op(op_type)
    unknown = sorted(set(attrs) - set(op.attr_names))
    if unknown:
        accepted = ", ".join(op.attr_names) or "no attributes"
        raise RuleError(f"{op_type} got unknown attribute {unknown[0]!r}; it accepts {accepted}")
    try:
        shapes = tuple(tuple(int(size) for size in shape) for shape in input_shapes)
    except (TypeError, ValueError):
        raise RuleError(f"{op_type}: input shapes must be sequences of integers, got {input_shapes!r}") from None
    try:
        spec = op.build(shapes, **attrs)
    except (IndexError, TypeError, ValueError) as error:
        if isinstance(error, RuleError):
            raise
        # A builder indexing a missing operand: report the call, not the builder's internals.
        raise RuleError(f"{op_type} cannot take input shapes {[list(s) for s in shapes]} with {attrs}: {error}") from None
    return Rule.build(op_type, spec, shapes)
