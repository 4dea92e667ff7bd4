"""Optimiser update ops: one per parameter, elementwise over the parameter, its gradient and
its state (MindSpore's ``ApplyGradientDescent``, ``ApplyMomentum``, ``ApplyAdam``).

Hyper-parameters that stay fixed over a run are attributes (``gradients_mean=False`` too: the
kernel then scales the synchronised gradient by the parameter's replica count, see the context's
`gradients_mean`; the sharding is the same either way); a value that changes every step
(Adam's bias-corrected learning rate) is a scalar input, computed in the graph from scalar
state. Every tensor operand has the parameter's shape, so any split of the parameter splits
the update the same way: each rank updates its slice, and the state is sharded like it.
"""

from __future__ import annotations

from autostrat.errors import RuleError
from autostrat.rules.common import dim_names
from autostrat.rules.registry import Example, register
from autostrat.rules.rule import RuleSpec

_SHAPES = ((24, 48), (12, 6, 8), (48,))


def _update_equation(op_type: str, shapes, tensors: int, scalars: tuple[int, ...], outputs: int) -> str:
    """``x, x, ..., <scalar>, ... -> x, ...``: `tensors` operands of the parameter's shape, the
    input positions in `scalars` scalars, `outputs` results of the parameter's shape."""
    if len(shapes) != tensors + len(scalars):
        raise RuleError(f"{op_type} takes {tensors + len(scalars)} inputs, got {len(shapes)}")
    x = " ".join(dim_names(len(shapes[0])))
    operands = []
    for index, shape in enumerate(shapes):
        if index in scalars:
            if shape != ():
                raise RuleError(f"{op_type}: input {index} must be a scalar, got shape {list(shape)}")
            operands.append("")
        elif shape != shapes[0]:
            raise RuleError(f"{op_type}: input {index} must have the parameter's shape {list(shapes[0])}, got {list(shape)}")
        else:
            operands.append(x)
    return f"{', '.join(operands)} -> {', '.join([x] * outputs)}"


@register("ApplyGradientDescent", examples=[Example((s, s), {"learning_rate": 0.1}) for s in _SHAPES])
def apply_gradient_descent(shapes, learning_rate: float = 0.01, gradients_mean: bool = True) -> RuleSpec:
    """Inputs parameter, gradient; output ``parameter - learning_rate * gradient``."""
    return RuleSpec(_update_equation("ApplyGradientDescent", shapes, 2, (), 1))


@register("ApplyMomentum", examples=[Example((s, s, s), {"learning_rate": 0.1, "momentum": 0.9}) for s in _SHAPES]
          + [Example(((24, 48),) * 3, {"use_nesterov": True})])
def apply_momentum(shapes, learning_rate: float = 0.01, momentum: float = 0.9, use_nesterov: bool = False,
                   gradients_mean: bool = True) -> RuleSpec:
    """Inputs parameter, accumulation, gradient; outputs the new parameter and accumulation."""
    return RuleSpec(_update_equation("ApplyMomentum", shapes, 3, (), 2))


@register("ApplyAdam", examples=[Example((s, s, s, (), s), {"beta1": 0.9, "beta2": 0.999}, positive=True) for s in _SHAPES])
def apply_adam(shapes, beta1: float = 0.9, beta2: float = 0.999, epsilon: float = 1e-8, gradients_mean: bool = True) -> RuleSpec:
    """Inputs parameter, m, v, the step's learning rate (scalar, bias correction included) and
    the gradient; outputs the new parameter, m and v."""
    equation = _update_equation("ApplyAdam", shapes, 4, (3,), 3)
    return RuleSpec(equation)
