"""Backward ops: the gradients no forward op expresses (MindSpore's ``*Grad`` primitives).

Each takes forward tensors and an output gradient (``dy``) and has single-device semantics like
any op, so the search shards the backward graph as it shards the forward one. The bprops in
`autostrat.autodiff` say which op computes which gradient.
"""

from __future__ import annotations

from autostrat.errors import RuleError
from autostrat.rules.common import broadcast_equation, dim_names, normalize_axes
from autostrat.rules.nn import conv2d_geometry, layer_norm_dims, rms_norm_dims, rotary_equation
from autostrat.rules.registry import Example, register
from autostrat.rules.rule import RuleSpec

_PAIRS = [((24, 48), (24, 48)), ((12, 6, 8), (12, 6, 8))]


def _same_shape_equation(op_type: str, shapes) -> str:
    if len(set(shapes)) != 1:
        raise RuleError(f"{op_type}: every input needs the same shape, got {[list(s) for s in shapes]}")
    return broadcast_equation(shapes)


def _pointwise_grad(op_type: str, positive: bool = False) -> None:
    @register(op_type, examples=[Example(shapes, positive=positive) for shapes in _PAIRS])
    def rule(shapes) -> RuleSpec:
        return RuleSpec(_same_shape_equation(op_type, shapes))


# Input order as MindSpore's: ReluGrad(dy, y), GeLUGrad(dy, x), SiLUGrad(dy, x), the others (y, dy).
for _name in ("GeLUGrad", "ReluGrad", "SiLUGrad", "SigmoidGrad", "TanhGrad"):
    _pointwise_grad(_name)
_pointwise_grad("SqrtGrad", positive=True)


@register("DropoutGrad", examples=[Example(((24, 48), (24, 48)), {"keep_prob": 0.7}, integers={1: 2})])
def dropout_grad(shapes, keep_prob: float = 0.5) -> RuleSpec:
    """DropoutGrad(dy, mask): dy where the forward's kept mask holds, scaled by 1 / keep_prob."""
    if not 0 < keep_prob <= 1:
        raise RuleError(f"DropoutGrad: keep_prob must be in (0, 1], got {keep_prob}")
    return RuleSpec(_same_shape_equation("DropoutGrad", shapes))


def _select_grad(op_type: str) -> None:
    examples = [Example(((24, 48), (24, 48), (24, 48))), Example(((24, 1), (1, 48), (24, 48))), Example(((24, 48), (48,), (24, 48)))]

    @register(op_type, examples=examples)
    def rule(shapes) -> RuleSpec:
        """Inputs x, y, dy; outputs dy masked for x and for y, both in dy's (broadcast) shape:
        the bprop sums each back to its operand's shape."""
        equation = broadcast_equation(shapes[:3])
        return RuleSpec(f"{equation}, {equation.split(' -> ')[1]}")


_select_grad("MaximumGrad")
_select_grad("MinimumGrad")


def _softmax_grad(op_type: str) -> None:
    @register(op_type, examples=[Example(((24, 48), (24, 48))), Example(((12, 6, 8), (12, 6, 8)), {"axis": 1})])
    def rule(shapes, axis=-1) -> RuleSpec:
        """Inputs y (the forward output) and dy; the softmax axis stays whole, as forward."""
        names = dim_names(len(shapes[0]))
        need = " ".join(names[i] for i in normalize_axes(axis, len(names), op_type))
        return RuleSpec(_same_shape_equation(op_type, shapes[:2]), need_replication=need)


_softmax_grad("LogSoftmaxGrad")
_softmax_grad("SoftmaxGrad")


@register(
    "ReduceMaxGrad",
    examples=[
        Example(((24, 48), (24,), (24,)), {"axis": 1}),
        Example(((24, 48), (1, 48), (1, 48)), {"axis": 0, "keep_dims": True}),
        Example(((12, 6, 8), (6,), (6,)), {"axis": (0, 2)}),
        Example(((24, 48), (), ()), {"axis": ()}),
    ],
)
def reduce_max_grad(shapes, axis=(), keep_dims: bool = False) -> RuleSpec:
    """Inputs x, the maximum y and dy: dy flows to every element equal to the maximum. No tie
    count is divided by, so a split reduced dim needs no communication."""
    names = dim_names(len(shapes[0]))
    reduced = normalize_axes(axis, len(names), "ReduceMaxGrad")
    kept = " ".join(("1" if keep_dims else "") if i in reduced else name for i, name in enumerate(names)).split()
    x = " ".join(names)
    return RuleSpec(f"{x}, {' '.join(kept)}, {' '.join(kept)} -> {x}")


@register("LayerNormGrad", examples=[Example(((12, 6, 8), (12, 6, 8), (8,))), Example(((12, 6, 8), (12, 6, 8), (6, 8)), {"begin_norm_axis": 1, "begin_params_axis": 1})])
def layer_norm_grad(shapes, begin_norm_axis: int = -1, begin_params_axis: int = -1, epsilon: float = 1e-7) -> RuleSpec:
    """Inputs x, dy, gamma; outputs dx and dy * x_hat, whose sum over the leading dims is
    dgamma (a ReduceSum the search may split, leaving a partial sum to AllReduce)."""
    x, gamma, whole = layer_norm_dims(len(shapes[0]), begin_norm_axis, begin_params_axis, "LayerNormGrad")
    return RuleSpec(f"{x}, {x}, {gamma} -> {x}, {x}", need_replication=whole)


@register("RmsNormGrad", examples=[Example(((12, 6, 8), (12, 6, 8), (8,))), Example(((4, 6, 8), (4, 6, 8), (6, 8)), {"epsilon": 1e-3})])
def rms_norm_grad(shapes, epsilon: float = 1e-6) -> RuleSpec:
    """Inputs dy, x, gamma (MindSpore's RmsNormGrad also takes rstd, recomputed here); outputs
    dx and dy * x * rstd, whose sum over the leading dims is dgamma (a ReduceSum)."""
    if shapes[0] != shapes[1]:
        raise RuleError(f"RmsNormGrad: dy and x need one shape, got {list(shapes[0])} and {list(shapes[1])}")
    x, gamma = rms_norm_dims(shapes[1:], "RmsNormGrad")
    return RuleSpec(f"{x}, {x}, {gamma} -> {x}, {x}", need_replication=gamma)


@register("RotaryPositionEmbeddingGrad", examples=[Example(((2, 4, 6, 8), (6, 8), (6, 8))), Example(((2, 3, 4, 6), (1, 1, 4, 6), (1, 1, 4, 6)))])
def rotary_position_embedding_grad(shapes, mode: int = 0) -> RuleSpec:
    """Inputs dy, cos, sin; output dx = dy * cos - rotate_half(dy * sin) (the transpose of
    the forward's rotation). The last dim stays whole, as forward."""
    equation = rotary_equation(shapes, mode, "RotaryPositionEmbeddingGrad")
    return RuleSpec(equation, need_replication=dim_names(len(shapes[0]))[-1])


@register("SoftmaxCrossEntropyWithLogitsGrad", examples=[Example(((24, 12), (24, 12), (24,)))])
def softmax_cross_entropy_grad(shapes) -> RuleSpec:
    """Inputs logits, labels, dloss; output dlogits = dloss * (softmax(logits) * sum(labels) - labels)."""
    return RuleSpec("b c, b c, b -> b c", need_replication="c")


@register(
    "GatherGrad",
    examples=[Example(((6, 8, 24), (6, 8)), {"axis": 0, "size": 48}, integers={1: 48}), Example(((12, 8, 6), (8,)), {"axis": 1, "size": 24}, integers={1: 24})],
)
def gather_grad(shapes, axis: int = 0, size: int = 1) -> RuleSpec:
    """Inputs dy and the indices; adds each dy row into row `indices[i]` of a zero tensor of the
    params' shape, whose gathered dim has `size` rows (MindSpore's UnsortedSegmentSum). Index
    dims are reductions (each rank scatters its indices: partial sums); the row dim is
    output-only (a rank holding rows [lo, hi) keeps the indices that fall there)."""
    rank = len(shapes[0]) - len(shapes[1]) + 1
    position = normalize_axes(axis, max(rank, 1), "GatherGrad")[0]
    if size < 1:
        raise RuleError(f"GatherGrad: size must be positive, got {size}")
    params, indices = dim_names(rank), dim_names(len(shapes[1]), prefix="i")
    dy = params[:position] + indices + params[position + 1:]
    return RuleSpec(f"{' '.join(dy)}, {' '.join(indices)} -> {' '.join(params)}", sizes={params[position]: size})


def _check_conv_grad(op_type: str, x_shape, w_shape, dy_shape, geometry_attrs: dict) -> None:
    if len(x_shape) != 4 or len(w_shape) != 4 or x_shape[1] != w_shape[1]:
        raise RuleError(f"{op_type}: needs an NCHW input and an OIHW weight with equal channels, got {list(x_shape)} and {list(w_shape)}")
    expected = (x_shape[0], w_shape[0]) + conv2d_geometry(x_shape, w_shape, **geometry_attrs).out_hw
    if tuple(dy_shape) != expected:
        raise RuleError(f"{op_type}: dy of shape {list(dy_shape)} does not match a Conv2D of input {list(x_shape)} and weight {list(w_shape)} (expected dy {list(expected)})")


_CONV = {"pad_mode": "same", "stride": 2}


@register("Conv2DBackpropInput", examples=[Example(((4, 12, 6, 6), (12, 6, 3, 3)), {"input_shape": (4, 6, 8, 8)}), Example(((4, 12, 4, 4), (12, 6, 3, 3)), {"input_shape": (4, 6, 7, 7), **_CONV})])
def conv2d_backprop_input(shapes, input_shape=(), pad_mode="valid", pad=0, stride=1, dilation=1) -> RuleSpec:
    """Inputs dy and the weight; dx of `input_shape`. Output channels are the reduction."""
    _check_conv_grad("Conv2DBackpropInput", tuple(input_shape), shapes[1], shapes[0], dict(pad_mode=pad_mode, pad=pad, stride=stride, dilation=dilation))
    sizes = {"h": input_shape[2], "w": input_shape[3]}
    return RuleSpec("n co oh ow, co ci kh kw -> n ci h w", sizes=sizes, need_replication="h w kh kw oh ow")


@register("Conv2DBackpropFilter", examples=[Example(((4, 12, 6, 6), (4, 6, 8, 8)), {"filter_shape": (12, 6, 3, 3)}), Example(((4, 12, 4, 4), (4, 6, 7, 7)), {"filter_shape": (12, 6, 3, 3), **_CONV})])
def conv2d_backprop_filter(shapes, filter_shape=(), pad_mode="valid", pad=0, stride=1, dilation=1) -> RuleSpec:
    """Inputs dy and x; dw of `filter_shape`. The batch is the reduction (data parallelism's
    partial weight gradients)."""
    _check_conv_grad("Conv2DBackpropFilter", shapes[1], tuple(filter_shape), shapes[0], dict(pad_mode=pad_mode, pad=pad, stride=stride, dilation=dilation))
    sizes = {"kh": filter_shape[2], "kw": filter_shape[3]}
    return RuleSpec("n co oh ow, n ci h w -> co ci kh kw", sizes=sizes, need_replication="h w kh kw oh ow")
