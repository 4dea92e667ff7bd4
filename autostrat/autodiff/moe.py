"""Bprops of the mixture-of-experts routing: the gradient reaches the router logits through the
combine weights alone, the dispatch mask being piecewise constant in them."""

from __future__ import annotations

from autostrat.autodiff.registry import register_bprop


@register_bprop("MoeDispatchMask")
def moe_dispatch_mask(b, op, dy):
    # Zero almost everywhere (a step function of the logits): no gradient flows.
    return (None,)


@register_bprop("MoeCombineWeights")
def moe_combine_weights(b, op, dy):
    (logits,) = op.inputs
    return (b.emit("MoeCombineWeightsGrad", logits, dy, **op.attr_dict),)
