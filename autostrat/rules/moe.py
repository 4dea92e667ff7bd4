"""Mixture-of-experts routing (GShard / Switch style, fixed capacity): from router logits
``[g, s, e]`` (g token groups of s tokens, e experts), the dispatch mask and the combine weights
``[g, s, e, c]``, c the capacity of each expert's buffer in each group.

A token goes to its `top_k` experts by gate value (``softmax`` over the experts, or
``sigmoid``); its weights are those gates, divided by their sum over the chosen experts when
`norm_topk_prob` (Mixtral). Positions in an expert's buffer follow GShard: every token's first
choice in token order, then every second choice after them, and so on; a choice whose position
reaches `capacity` is dropped (a weight of 0, as GShard drops it; `capacity` = s drops none,
Mixtral's dropless routing). The mask is 1 where a token sits in a buffer, the combine weights
are the mask times the token's weight there.

The dispatch ``einsum("gsec,gsh->egch")``, the experts ``egch,ehf->egcf`` and the combine
``einsum("gsec,egch->gsh")`` are ordinary `Einsum` ops: with g split before the dispatch and e
after it, the edge between them is the AllToAll of a token dispatch, priced by the planner.

The rule: g passes through; s, e and c stay whole (top-k needs every expert, the positions a
count over the group's tokens).
"""

from __future__ import annotations

from autostrat.errors import RuleError
from autostrat.rules.registry import Example, register
from autostrat.rules.rule import RuleSpec

GATES = ("sigmoid", "softmax")

_ROUTING = [Example(((3, 8, 4),), {"top_k": 2, "capacity": 3}),
            Example(((2, 6, 4),), {"top_k": 2, "capacity": 6, "norm_topk_prob": True}),
            Example(((2, 6, 5),), {"top_k": 1, "capacity": 2, "gate": "sigmoid"})]


def check_routing(shapes, op_type: str, top_k, capacity, gate, norm_topk_prob) -> None:
    """Check router logits ``[g, s, e]`` and the routing attributes.

    Example:
        >>> check_routing([(2, 6, 4)], "MoeDispatchMask", 2, 3, "softmax", False)
    """
    if len(shapes[0]) != 3:
        raise RuleError(f"{op_type}: needs router logits [groups, tokens, experts], got shape {list(shapes[0])}")
    experts = shapes[0][2]
    if isinstance(top_k, bool) or not isinstance(top_k, int) or not 1 <= top_k <= experts:
        raise RuleError(f"{op_type}: top_k must be an integer from 1 to the {experts} experts, got {top_k!r}")
    if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
        raise RuleError(f"{op_type}: capacity must be a positive integer (tokens per expert and group), got {capacity!r}")
    if gate not in GATES:
        raise RuleError(f"{op_type}: gate must be one of {', '.join(GATES)}, got {gate!r}")
    if not isinstance(norm_topk_prob, bool):
        raise RuleError(f"{op_type}: norm_topk_prob must be True or False, got {norm_topk_prob!r}")


@register("MoeDispatchMask", examples=_ROUTING)
def moe_dispatch_mask(shapes, top_k: int = 2, capacity: int = 1, gate: str = "softmax", norm_topk_prob: bool = False) -> RuleSpec:
    """1 where token s of group g sits at position c of expert e's buffer, else 0."""
    check_routing(shapes, "MoeDispatchMask", top_k, capacity, gate, norm_topk_prob)
    return RuleSpec("g s e -> g s e c", sizes={"c": capacity}, need_replication="s e c")


@register("MoeCombineWeights", examples=_ROUTING)
def moe_combine_weights(shapes, top_k: int = 2, capacity: int = 1, gate: str = "softmax",
                        norm_topk_prob: bool = False) -> RuleSpec:
    """The dispatch mask times the token's routing weight for that expert."""
    check_routing(shapes, "MoeCombineWeights", top_k, capacity, gate, norm_topk_prob)
    return RuleSpec("g s e -> g s e c", sizes={"c": capacity}, need_replication="s e c")


@register("MoeCombineWeightsGrad", examples=[Example(e.shapes + (e.shapes[0] + (e.attrs["capacity"],),), e.attrs) for e in _ROUTING])
def moe_combine_weights_grad(shapes, top_k: int = 2, capacity: int = 1, gate: str = "softmax",
                             norm_topk_prob: bool = False) -> RuleSpec:
    """Inputs logits and dcombine; output dlogits, through the weights of the kept choices
    alone (the mask is piecewise constant)."""
    check_routing(shapes, "MoeCombineWeightsGrad", top_k, capacity, gate, norm_topk_prob)
    if len(shapes) != 2 or tuple(shapes[1]) != tuple(shapes[0]) + (capacity,):
        raise RuleError(f"MoeCombineWeightsGrad: needs dcombine of shape {list(shapes[0]) + [capacity]}, "
                        f"got {[list(s) for s in shapes[1:]]}")
    return RuleSpec("g s e, g s e c -> g s e", need_replication="s e c")
