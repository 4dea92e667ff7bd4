"""The bprop registry, keyed by forward op type, and the ops that have none.

A bprop is ``fn(builder, op, dy) -> gradients``: `op` is the forward `OpNode` (its inputs,
output and attributes), `dy` the name of its output's gradient; it emits ops through the
`GradBuilder` and returns one tensor name per op input, None where no gradient flows (integer
indices). It may emit gradients nobody needs: `build_backward` drops unused ops afterwards.
"""

from __future__ import annotations

from typing import Callable

from autostrat.errors import RuleError, UnknownOpError
from autostrat.rules import op_types

Bprop = Callable[..., tuple]

_BPROPS: dict[str, Bprop] = {}

_BACKWARD_OP = "a backward op: second derivatives are not needed for training (issue #7)"
_UPDATE_OP = "an optimiser update: it runs after the gradients, nothing differentiates through it"

# Every registered op without a bprop, with the reason; a test keeps this exact.
WITHOUT_BPROP: dict[str, str] = {
    "ApplyAdam": _UPDATE_OP,
    "ApplyGradientDescent": _UPDATE_OP,
    "ApplyMomentum": _UPDATE_OP,
    "Conv2DBackpropFilter": _BACKWARD_OP,
    "Conv2DBackpropInput": _BACKWARD_OP,
    "DropoutGrad": _BACKWARD_OP,
    "FlashAttentionScoreKeyValueGrad": _BACKWARD_OP,
    "FlashAttentionScoreQueryGrad": _BACKWARD_OP,
    "GatherGrad": _BACKWARD_OP,
    "GeLUGrad": _BACKWARD_OP,
    "LayerNormGrad": _BACKWARD_OP,
    "LogSoftmaxGrad": _BACKWARD_OP,
    "MaximumGrad": _BACKWARD_OP,
    "MinimumGrad": _BACKWARD_OP,
    "MoeCombineWeightsGrad": _BACKWARD_OP,
    "OneHot": "its only input is integer class indices, so no gradient flows through it",
    "ReduceMaxGrad": _BACKWARD_OP,
    "ReluGrad": _BACKWARD_OP,
    "RmsNormGrad": _BACKWARD_OP,
    "RotaryPositionEmbeddingGrad": _BACKWARD_OP,
    "SiLUGrad": _BACKWARD_OP,
    "SigmoidGrad": _BACKWARD_OP,
    "Slice": "only bprops use it (Concat's); its own gradient would need a Pad op",
    "SoftmaxCrossEntropyWithLogitsGrad": _BACKWARD_OP,
    "SoftmaxGrad": _BACKWARD_OP,
    "SqrtGrad": _BACKWARD_OP,
    "TanhGrad": _BACKWARD_OP,
}


def register_bprop(op_type: str):
    """Decorator registering the bprop of the forward op `op_type`.

    Example:
        >>> @register_bprop("DocExampleOp")
        ... def identity(builder, op, dy):
        ...     return (dy,)
        >>> get_bprop("DocExampleOp") is identity
        True
        >>> unregister_bprop("DocExampleOp")
    """

    def decorate(fn: Bprop) -> Bprop:
        if op_type in _BPROPS:
            raise RuleError(f"a bprop for {op_type!r} is already registered")
        _BPROPS[op_type] = fn
        return fn

    return decorate


def unregister_bprop(op_type: str) -> None:
    """Remove a registration (doc examples and tests register temporary bprops)."""
    _BPROPS.pop(op_type)


def bprop_op_types() -> tuple[str, ...]:
    """Every op type with a bprop, alphabetically."""
    return tuple(sorted(_BPROPS))


def get_bprop(op_type: str, where: str = "") -> Bprop:
    """The bprop of `op_type`; `where` names the op needing it in the error."""
    if op_type not in _BPROPS:
        reason = WITHOUT_BPROP.get(op_type, "none is registered" if op_type in op_types() else "the op type is unknown")
        place = f"{where}: " if where else ""
        raise UnknownOpError(f"{place}a gradient must flow through {op_type}, which has no bprop ({reason})")
    return _BPROPS[op_type]
