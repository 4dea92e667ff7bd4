"""Bprops of the neural-network ops."""

from __future__ import annotations

from autostrat.autodiff.registry import register_bprop
from autostrat.rules.common import normalize_axes


@register_bprop("LayerNorm")
def layer_norm(b, op, dy):
    # dgamma and dbeta are sums over the leading dims: ReduceSum ops the search may split.
    x, gamma, beta = op.inputs
    dx, dy_x_hat = b.emit_many("LayerNormGrad", x, dy, gamma, **op.attr_dict)
    return dx, b.sum_to(dy_x_hat, b.shape(gamma)), b.sum_to(dy, b.shape(beta))


@register_bprop("RmsNorm")
def rms_norm(b, op, dy):
    x, gamma = op.inputs
    dx, dy_x_hat = b.emit_many("RmsNormGrad", dy, x, gamma, **op.attr_dict)
    return dx, b.sum_to(dy_x_hat, b.shape(gamma))


@register_bprop("RotaryPositionEmbedding")
def rotary_position_embedding(b, op, dy):
    # y = x * cos + rotate_half(x) * sin: dcos and dsin are dy times x and times rotate_half(x)
    # summed to their shapes (emitted only if needed: cos and sin are constants in the models),
    # rotate_half(x) being the op itself with cos 0 and sin 1.
    x, cos, sin = op.inputs
    dx = b.emit("RotaryPositionEmbeddingGrad", dy, cos, sin, **op.attr_dict)
    zeros = b.constant(f"bprop/{b.scope}/zeros", b.shape(cos), b.dtype(cos), 0.0)
    ones = b.constant(f"bprop/{b.scope}/ones", b.shape(sin), b.dtype(sin), 1.0)
    rotated = b.emit("RotaryPositionEmbedding", x, zeros, ones, **op.attr_dict)
    return dx, b.sum_to(b.emit("Mul", dy, x), b.shape(cos)), b.sum_to(b.emit("Mul", dy, rotated), b.shape(sin))


@register_bprop("Gather")
def gather(b, op, dy):
    params, indices = op.inputs
    axis = normalize_axes(op.attr_dict.get("axis", 0), len(b.shape(params)), "Gather")[0]
    return b.emit("GatherGrad", dy, indices, axis=axis, size=b.shape(params)[axis]), None


@register_bprop("SoftmaxCrossEntropyWithLogits")
def softmax_cross_entropy(b, op, dy):
    logits, labels = op.inputs
    dlogits = b.emit("SoftmaxCrossEntropyWithLogitsGrad", logits, labels, dy)
    if not b.is_float(labels):
        return dlogits, None
    # dloss/dlabels = -log_softmax(logits), scaled per sample by dy.
    log_probabilities = b.emit("Neg", b.emit("LogSoftmax", logits))
    return dlogits, b.emit("Mul", log_probabilities, b.emit("ExpandDims", dy, axis=-1))


_GEOMETRY = ("pad_mode", "pad", "stride", "dilation")


@register_bprop("Conv2D")
def conv2d(b, op, dy):
    x, w = op.inputs
    geometry = {key: value for key, value in op.attr_dict.items() if key in _GEOMETRY}
    dx = b.emit("Conv2DBackpropInput", dy, w, input_shape=b.shape(x), **geometry)
    dw = b.emit("Conv2DBackpropFilter", dy, x, filter_shape=b.shape(w), **geometry)
    return dx, dw


@register_bprop("FlashAttentionScore")
def flash_attention_score(b, op, dy):
    # Two grad ops: dquery keeps a split query sequence, dkey and dvalue sum over it (partial).
    query, key, value = op.inputs
    dquery = b.emit("FlashAttentionScoreQueryGrad", query, key, value, dy, **op.attr_dict)
    dkey, dvalue = b.emit_many("FlashAttentionScoreKeyValueGrad", query, key, value, dy, **op.attr_dict)
    return dquery, dkey, dvalue
