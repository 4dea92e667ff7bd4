"""Neural-network ops: LayerNorm, RmsNorm, RotaryPositionEmbedding, Gather, OneHot,
SoftmaxCrossEntropyWithLogits, Conv2D."""

from __future__ import annotations

from dataclasses import dataclass

from autostrat.errors import RuleError
from autostrat.rules.common import broadcast_equation, dim_names, normalize_axes
from autostrat.rules.registry import Example, register
from autostrat.rules.rule import RuleSpec


@register("LayerNorm", examples=[Example(((12, 6, 8), (8,), (8,))), Example(((12, 6, 8), (6, 8), (6, 8)), {"begin_norm_axis": 1, "begin_params_axis": 1})])
def layer_norm(shapes, begin_norm_axis: int = -1, begin_params_axis: int = -1, epsilon: float = 1e-7) -> RuleSpec:
    """Normalised dims (from `begin_norm_axis` on) must stay whole; gamma and beta cover the
    dims from `begin_params_axis` on and are split with them."""
    x, gamma, whole = layer_norm_dims(len(shapes[0]), begin_norm_axis, begin_params_axis, "LayerNorm")
    return RuleSpec(f"{x}, {gamma}, {gamma} -> {x}", need_replication=whole)


def layer_norm_dims(rank: int, begin_norm_axis: int, begin_params_axis: int, op_type: str) -> tuple[str, str, str]:
    """The dim names of x, of gamma (and beta), and of the normalised dims that stay whole.

    Example:
        >>> layer_norm_dims(3, -1, 1, "LayerNorm")
        ('a b c', 'b c', 'c')
    """
    norm = normalize_axes(begin_norm_axis, rank, op_type)[0]
    params = normalize_axes(begin_params_axis, rank, op_type)[0]
    names = dim_names(rank)
    return " ".join(names), " ".join(names[params:]), " ".join(names[norm:])


@register("RmsNorm", examples=[Example(((12, 6, 8), (8,))), Example(((4, 6, 8), (6, 8)), {"epsilon": 1e-3})])
def rms_norm(shapes, epsilon: float = 1e-6) -> RuleSpec:
    """MindSpore's RmsNorm, ``x * rsqrt(mean(x ** 2) + epsilon) * gamma`` with the mean over
    gamma's (trailing) dims, which stay whole. MindSpore's op also returns rstd; this one
    returns y alone (its grad recomputes rstd, as LayerNormGrad recomputes the variance)."""
    x, gamma = rms_norm_dims(shapes, "RmsNorm")
    return RuleSpec(f"{x}, {gamma} -> {x}", need_replication=gamma)


def rms_norm_dims(shapes, op_type: str) -> tuple[str, str]:
    """The dim names of x and of gamma, gamma's shape being x's trailing dims.

    Example:
        >>> rms_norm_dims([(4, 6, 8), (6, 8)], "RmsNorm")
        ('a b c', 'b c')
    """
    x, gamma = shapes[0], shapes[-1]
    if not gamma or tuple(x[len(x) - len(gamma):]) != tuple(gamma):
        raise RuleError(f"{op_type}: gamma's shape must be x's trailing dims, got x {list(x)} and gamma {list(gamma)}")
    names = dim_names(len(x))
    return " ".join(names), " ".join(names[len(x) - len(gamma):])


_ROTARY = [Example(((2, 4, 6, 8), (6, 8), (6, 8))), Example(((2, 3, 4, 6), (1, 1, 4, 6), (1, 1, 4, 6))), Example(((2, 4, 6, 8), (2, 1, 6, 8), (2, 1, 6, 8)))]


@register("RotaryPositionEmbedding", examples=_ROTARY)
def rotary_position_embedding(shapes, mode: int = 0) -> RuleSpec:
    """MindSpore's ``ops.rotary_position_embedding`` in mode 0 (rotate_half, GPT-NeoX and
    HuggingFace LLaMA): ``x * cos + cat(-x2, x1) * sin`` with x1, x2 the halves of the last
    dim; cos and sin broadcast to x ([seq, head_dim] or MindSpore's [1, 1, seq, head_dim]
    against x [batch, heads, seq, head_dim]). Element i of the last dim pairs with i + D/2,
    which a contiguous split puts on another rank: that dim stays whole, the others pass
    through (cos and sin split with x along the dims they share)."""
    return RuleSpec(rotary_equation(shapes, mode, "RotaryPositionEmbedding"), need_replication=dim_names(len(shapes[0]))[-1])


def rotary_equation(shapes, mode: int, op_type: str) -> str:
    """The broadcast equation of x, cos and sin, once they are checked.

    Example:
        >>> rotary_equation([(2, 4, 6, 8), (6, 8), (6, 8)], 0, "RotaryPositionEmbedding")
        'a b c d, c d, c d -> a b c d'
    """
    x, cos, sin = shapes[:3]
    if mode != 0:
        raise RuleError(f"{op_type}: only mode 0 (rotate_half) is supported, got mode {mode!r}")
    if not x or x[-1] % 2 or cos[-1:] != x[-1:] or sin != cos:
        raise RuleError(f"{op_type}: needs x with an even last dim and cos, sin of one shape ending in it, got {[list(s) for s in shapes]}")
    if len(cos) > len(x) or any(c not in (1, n) for c, n in zip(reversed(cos), reversed(x))):
        raise RuleError(f"{op_type}: cos and sin {list(cos)} must broadcast to x {list(x)}")
    return broadcast_equation(shapes[:3])


@register("Gather", examples=[Example(((48, 24), (6, 8)), {"axis": 0}, integers={1: 48}), Example(((12, 24, 6), (8,)), {"axis": 1}, integers={1: 24})])
def gather(shapes, axis: int = 0) -> RuleSpec:
    """Rows of `params` along `axis` picked by `indices`. A split of the gathered dim is a
    reduction: each rank looks up the rows it holds and writes zeros for the others, so the
    output is a partial sum (MindSpore's row-split embedding)."""
    params_rank = len(shapes[0])
    position = normalize_axes(axis, params_rank, "Gather")[0]
    params = dim_names(params_rank)
    indices = dim_names(len(shapes[1]), prefix="i")
    out = params[:position] + indices + params[position + 1:]
    return RuleSpec(f"{' '.join(params)}, {' '.join(indices)} -> {' '.join(out)}")


@register("OneHot", examples=[Example(((24,),), {"depth": 48}, integers={0: 48}), Example(((6, 4),), {"depth": 12, "on_value": 2.0, "off_value": -1.0}, integers={0: 12})])
def one_hot(shapes, depth: int = 2, on_value: float = 1.0, off_value: float = 0.0, axis: int = -1) -> RuleSpec:
    """The depth dim is output-only: a rank holding depth columns [lo, hi) compares the
    indices with those columns, so it may be split (through `out_strategy`)."""
    names = dim_names(len(shapes[0]))
    position = normalize_axes(axis, len(names) + 1, "OneHot")[0]
    out = names[:position] + ["depth"] + names[position:]
    if depth < 1:
        raise RuleError(f"OneHot: depth must be positive, got {depth}")
    return RuleSpec(f"{' '.join(names)} -> {' '.join(out)}", sizes={"depth": depth})


@register("SoftmaxCrossEntropyWithLogits", examples=[Example(((24, 12), (24, 12)))])
def softmax_cross_entropy(shapes) -> RuleSpec:
    """Per-sample loss of logits [batch, classes] against label distributions; the class dim
    must stay whole."""
    return RuleSpec("b c, b c -> b", need_replication="c")


@dataclass(frozen=True)
class ConvGeometry:
    """Paddings (top, bottom, left, right), strides, dilations and output size of a Conv2D."""

    pads: tuple[int, int, int, int]
    stride: tuple[int, int]
    dilation: tuple[int, int]
    out_hw: tuple[int, int]


def _pair(value, name: str) -> tuple[int, int]:
    items = (value, value) if isinstance(value, int) else tuple(value)[-2:]
    if len(items) != 2 or any(not isinstance(v, int) or v < 1 for v in items):
        raise RuleError(f"Conv2D: {name} must be a positive int or pair, got {value!r}")
    return items


def conv2d_geometry(x_shape, w_shape, pad_mode="valid", pad=0, stride=1, dilation=1) -> ConvGeometry:
    stride, dilation = _pair(stride, "stride"), _pair(dilation, "dilation")
    spans = [d * (k - 1) + 1 for d, k in zip(dilation, w_shape[2:])]
    if pad_mode == "valid":
        pads = (0, 0, 0, 0)
    elif pad_mode == "pad":
        pads = (pad,) * 4 if isinstance(pad, int) else tuple(pad)
    elif pad_mode == "same":
        totals = [max((-(-size // s) - 1) * s + span - size, 0) for size, s, span in zip(x_shape[2:], stride, spans)]
        pads = (totals[0] // 2, totals[0] - totals[0] // 2, totals[1] // 2, totals[1] - totals[1] // 2)
    else:
        raise RuleError(f"Conv2D: pad_mode must be 'valid', 'same' or 'pad', got {pad_mode!r}")
    if len(pads) != 4 or any(not isinstance(p, int) or p < 0 for p in pads):
        raise RuleError(f"Conv2D: pad must be a non-negative int or 4-tuple, got {pad!r}")
    padded = (x_shape[2] + pads[0] + pads[1], x_shape[3] + pads[2] + pads[3])
    out_hw = tuple((size - span) // s + 1 for size, span, s in zip(padded, spans, stride))
    if min(out_hw) < 1:
        raise RuleError(f"Conv2D: kernel {list(w_shape[2:])} does not fit input {list(x_shape[2:])}")
    return ConvGeometry(pads, stride, dilation, out_hw)


@register(
    "Conv2D",
    examples=[
        Example(((4, 6, 8, 8), (12, 6, 3, 3)), {"out_channel": 12, "kernel_size": 3}),
        Example(((4, 6, 7, 7), (12, 6, 3, 3)), {"out_channel": 12, "kernel_size": 3, "pad_mode": "same", "stride": 2}),
    ],
)
def conv2d(shapes, out_channel=None, kernel_size=None, pad_mode="valid", pad=0, stride=1, dilation=1, group=1, data_format="NCHW") -> RuleSpec:
    """NCHW convolution. Batch and output channels are pass-through, the input channel is a
    reduction; spatial dims stay whole (a spatial split would need halo exchanges)."""
    x, w = shapes[0], shapes[1]
    if len(x) != 4 or len(w) != 4 or data_format != "NCHW" or group != 1:
        raise RuleError(f"Conv2D: needs NCHW input and OIHW weight of rank 4 with group 1, got {list(x)}, {list(w)}, group {group}")
    if out_channel not in (None, w[0]) or kernel_size not in (None, w[2], tuple(w[2:]), list(w[2:])):
        raise RuleError(f"Conv2D: out_channel {out_channel} / kernel_size {kernel_size} disagree with weight shape {list(w)}")
    oh, ow = conv2d_geometry(x, w, pad_mode, pad, stride, dilation).out_hw
    return RuleSpec(
        "n ci h w, co ci kh kw -> n co oh ow",
        sizes={"oh": oh, "ow": ow},
        need_replication="h w kh kw oh ow",
    )
