"""Which part of a backward is W, the weight gradient, and which is B: the rule the runtime's
stage programs (`runtime.stage_program.weight_part`), the split's time model
(`search.stages.weight_ops`) and its exact memory model (`search.stage_buffers.weight_part`)
share, so that they cannot drift apart.

Walking back from the backward's last step, a step is B when it is a recomputed forward op (one
only W reads, a SwiGLU's product, would otherwise hold its inputs from B to W, twice its output),
writes an activation gradient (`activation_gradient`), or writes what a B step reads; every
other step is W.
"""

from __future__ import annotations

from autostrat.autodiff.recompute import RECOMPUTE_PREFIX


def activation_gradient(graph, key: str) -> bool:
    """Whether `key` (a tensor, or a store key ``tensor>layout``) is the gradient of a tensor
    other than a parameter.

    Example:
        >>> from types import SimpleNamespace
        >>> graph = SimpleNamespace(tensors={"h": SimpleNamespace(kind="output"), "w": SimpleNamespace(kind="parameter")})
        >>> activation_gradient(graph, "grad/h"), activation_gradient(graph, "grad/w>optimizer/w[1]"), activation_gradient(graph, "h")
        (True, False, False)
    """
    tensor = key.split(">")[0]
    info = graph.tensors.get(tensor.removeprefix("grad/")) if tensor.startswith("grad/") else None
    return info is not None and info.kind != "parameter"


def input_gradient_part(graph, steps, op_of, writes_of, reads_of) -> list[bool]:
    """Per step of a backward, in order, whether it is B (the module docstring); `op_of(step)`
    names its op ("" for a step of none), `writes_of` and `reads_of` give the keys it writes
    and reads.

    Example (a bias gradient, an input gradient, a weight gradient):
        >>> from types import SimpleNamespace
        >>> graph = SimpleNamespace(tensors={"h": SimpleNamespace(kind="output"), "x": SimpleNamespace(kind="output")})
        >>> steps = [("db", ("grad/h",), ("grad/b",)), ("dx", ("grad/h", "w"), ("grad/x",)), ("dw", ("x", "grad/h"), ("grad/w",))]
        >>> input_gradient_part(graph, steps, lambda s: s[0], lambda s: s[2], lambda s: s[1])
        [False, True, False]
    """
    needed: set[str] = set()
    part = [False] * len(steps)
    for index in range(len(steps) - 1, -1, -1):
        step = steps[index]
        if op_of(step).startswith(RECOMPUTE_PREFIX) or any(key in needed or activation_gradient(graph, key) for key in writes_of(step)):
            part[index] = True
            needed.update(reads_of(step))
    return part
