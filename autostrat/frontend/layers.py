"""Layers built from primitives, named and shaped as MindSpore's so that its strategies apply as
written and mean the same (``Dense.matmul`` with weight ``[out, in]``, ``Dense.bias_add``)."""

from __future__ import annotations

from autostrat import ops
from autostrat.errors import ConfigError
from autostrat.frontend.cell import Cell
from autostrat.frontend.tensor import Parameter, initializer


class Dense(Cell):
    """``y = x @ weight.T + bias`` with weight ``[out_channels, in_channels]``, as MindSpore's
    ``nn.Dense``: the MatMul transposes its second operand, so a strategy for ``matmul`` names the
    weight's dims in that order (Megatron's column split of 4 is ``((1, 1), (4, 1))``).

    Example:
        >>> dense = Dense(64, 32)
        >>> dense.weight.shape, dense.bias.shape, dense.matmul.attrs
        ((32, 64), (32,), {'transpose_b': True})
    """

    def __init__(self, in_channels: int, out_channels: int, has_bias: bool = True, activation=None):
        super().__init__()
        self.weight = Parameter(initializer("normal", (out_channels, in_channels)))
        self.matmul = ops.MatMul(transpose_b=True)
        self.has_bias = has_bias
        if has_bias:
            self.bias = Parameter(initializer("zeros", (out_channels,)))
            self.bias_add = ops.BiasAdd()
        self.activation = _activation(activation)

    def construct(self, x):
        x = self.matmul(x, self.weight)
        if self.has_bias:
            x = self.bias_add(x, self.bias)
        return self.activation(x) if self.activation is not None else x


class _Unary(Cell):
    """A cell around one unary primitive, held under MindSpore's attribute name."""

    attribute, op_type = "", ""

    def __init__(self):
        super().__init__()
        setattr(self, self.attribute, getattr(ops, self.op_type)())

    def construct(self, x):
        return getattr(self, self.attribute)(x)


class ReLU(_Unary):
    attribute, op_type = "relu", "ReLU"


class GELU(_Unary):
    attribute, op_type = "gelu", "GeLU"


class SiLU(_Unary):
    """MindSpore's ``nn.SiLU``: ``x * sigmoid(x)`` (SwiGLU's gate)."""

    attribute, op_type = "silu", "SiLU"


class Softmax(Cell):
    """MindSpore's ``nn.Softmax(axis=-1)``."""

    def __init__(self, axis: int = -1):
        super().__init__()
        self.softmax = ops.Softmax(axis)

    def construct(self, x):
        return self.softmax(x)


def _activation(activation):
    if activation is None or isinstance(activation, Cell):
        return activation
    table = {"relu": ReLU, "gelu": GELU, "silu": SiLU}
    if activation not in table:
        raise ConfigError(f"activation must be None, a Cell or one of {sorted(table)}, got {activation!r}")
    return table[activation]()


class LayerNorm(Cell):
    """Normalises the trailing `normalized_shape` dims, with gamma (ones) and beta (zeros)."""

    def __init__(self, normalized_shape, begin_norm_axis: int = -1, begin_params_axis: int = -1, epsilon: float = 1e-7):
        super().__init__()
        shape = tuple(normalized_shape)
        self.gamma = Parameter(initializer("ones", shape))
        self.beta = Parameter(initializer("zeros", shape))
        self.layer_norm = ops.LayerNorm(begin_norm_axis, begin_params_axis, epsilon)

    def construct(self, x):
        return self.layer_norm(x, self.gamma, self.beta)


class RMSNorm(Cell):
    """Root-mean-square normalisation of the trailing `normalized_shape` dims with gamma (ones):
    ``x * rsqrt(mean(x ** 2) + epsilon) * gamma`` (MindSpore's ``ops.RmsNorm``, LLaMA's norm).

    Example:
        >>> norm = RMSNorm((8,), epsilon=1e-5)
        >>> norm.gamma.shape, norm.rms_norm.attrs
        ((8,), {'epsilon': 1e-05})
    """

    def __init__(self, normalized_shape, epsilon: float = 1e-6):
        super().__init__()
        self.gamma = Parameter(initializer("ones", tuple(normalized_shape)))
        self.rms_norm = ops.RmsNorm(epsilon)

    def construct(self, x):
        return self.rms_norm(x, self.gamma)


class Embedding(Cell):
    """Looks up rows of ``embedding_table [vocab_size, embedding_size]`` (a Gather on axis 0)."""

    def __init__(self, vocab_size: int, embedding_size: int):
        super().__init__()
        self.embedding_table = Parameter(initializer("normal", (vocab_size, embedding_size)))
        self.gather = ops.Gather()

    def construct(self, ids):
        return self.gather(self.embedding_table, ids, 0)


class Dropout(Cell):
    """Drops with probability ``1 - keep_prob`` in training mode (the output of `ops.Dropout`,
    whose mask the backward reads); the identity otherwise."""

    def __init__(self, keep_prob: float = 0.5, seed: int = 0):
        super().__init__()
        self.dropout = ops.Dropout(keep_prob, seed)

    def construct(self, x):
        return self.dropout(x)[0] if self.training else x


class Conv2d(Cell):
    """NCHW convolution with weight ``[out_channels, in_channels, k, k]`` and optional bias."""

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, pad_mode="same", padding=0, dilation=1, has_bias=False):
        super().__init__()
        size = (kernel_size, kernel_size) if isinstance(kernel_size, int) else tuple(kernel_size)
        self.weight = Parameter(initializer("normal", (out_channels, in_channels) + size))
        self.conv2d = ops.Conv2D(out_channels, size, pad_mode, padding, stride, dilation)
        self.has_bias = has_bias
        if has_bias:
            self.bias = Parameter(initializer("zeros", (out_channels,)))
            self.bias_add = ops.BiasAdd()

    def construct(self, x):
        x = self.conv2d(x, self.weight)
        return self.bias_add(x, self.bias) if self.has_bias else x


class SoftmaxCrossEntropyWithLogits(Cell):
    """Cross entropy of logits ``[batch, classes]`` against labels: class indices when `sparse`
    (one-hot encoded first), else distributions; `reduction` 'none' or 'mean'."""

    def __init__(self, sparse: bool = False, reduction: str = "none"):
        super().__init__()
        if reduction not in ("none", "mean"):
            raise ConfigError(f"reduction must be 'none' or 'mean', got {reduction!r}")
        self.sparse, self.reduction = sparse, reduction
        self.one_hot = ops.OneHot()
        self.softmax_cross_entropy = ops.SoftmaxCrossEntropyWithLogits()
        self.reduce_mean = ops.ReduceMean()

    def construct(self, logits, labels):
        if self.sparse:
            labels = self.one_hot(labels, logits.shape[-1], 1.0, 0.0)
        loss = self.softmax_cross_entropy(logits, labels)
        return self.reduce_mean(loss, ()) if self.reduction == "mean" else loss


class MSELoss(Cell):
    """Mean squared error ``mean((logits - labels) ** 2)``; `reduction` 'mean', 'sum' or 'none'.

    Example:
        >>> MSELoss().reduction
        'mean'
    """

    def __init__(self, reduction: str = "mean"):
        super().__init__()
        if reduction not in ("none", "mean", "sum"):
            raise ConfigError(f"reduction must be 'none', 'mean' or 'sum', got {reduction!r}")
        self.reduction = reduction
        self.sub, self.square = ops.Sub(), ops.Mul()
        self.reduce_mean, self.reduce_sum = ops.ReduceMean(), ops.ReduceSum()

    def construct(self, logits, labels):
        difference = self.sub(logits, labels)
        loss = self.square(difference, difference)
        if self.reduction == "mean":
            return self.reduce_mean(loss, ())
        return self.reduce_sum(loss, ()) if self.reduction == "sum" else loss


class Flatten(Cell):
    """MindSpore's ``nn.Flatten(start_dim=1, end_dim=-1)``: dims `start_dim`..`end_dim` merged
    into one (a Reshape).

    Example:
        >>> import numpy as np
        >>> from autostrat.frontend.tensor import Tensor
        >>> Flatten()(Tensor(np.zeros((2, 1, 3, 4), np.float32))).shape, Flatten(0, 1)(Tensor(np.zeros((2, 3, 4)))).shape
        ((2, 12), (6, 4))
    """

    def __init__(self, start_dim: int = 1, end_dim: int = -1):
        super().__init__()
        self.start_dim, self.end_dim = start_dim, end_dim
        self.reshape = ops.Reshape()

    def construct(self, x):
        dims = list(x.shape)
        start, end = (axis + len(dims) if axis < 0 else axis for axis in (self.start_dim, self.end_dim))
        if not 0 <= start <= end < len(dims):
            raise ConfigError(f"Flatten: start_dim {self.start_dim} and end_dim {self.end_dim} do not name dims "
                              f"in order of an input of shape {dims}")
        merged = 1
        for size in dims[start:end + 1]:
            merged *= size
        return self.reshape(x, tuple(dims[:start] + [merged] + dims[end + 1:]))


class CrossEntropyLoss(Cell):
    """MindSpore's ``nn.CrossEntropyLoss``: the cross entropy of logits ``[batch, classes]``
    against class indices ``[batch]`` (integers in 0..classes-1) or class probabilities
    ``[batch, classes]``; with `label_smoothing` s the target is ``(1 - s) * one_hot + s /
    classes``; `reduction` 'mean' (over the batch), 'sum' or 'none'. `weight` and an
    `ignore_index` other than MindSpore's default -100 are refused.

    Example:
        >>> CrossEntropyLoss(label_smoothing=0.1).reduction
        'mean'
    """

    def __init__(self, weight=None, ignore_index: int = -100, reduction: str = "mean", label_smoothing: float = 0.0):
        super().__init__()
        if weight is not None:
            raise ConfigError("CrossEntropyLoss: weight is not supported (every class weighs 1), got a weight")
        if ignore_index != -100:
            raise ConfigError(f"CrossEntropyLoss: ignore_index is not supported (labels must be class indices), got {ignore_index!r}")
        if reduction not in ("none", "mean", "sum"):
            raise ConfigError(f"CrossEntropyLoss: reduction must be 'none', 'mean' or 'sum', got {reduction!r}")
        if not 0.0 <= label_smoothing <= 1.0:
            raise ConfigError(f"CrossEntropyLoss: label_smoothing must be in [0, 1], got {label_smoothing!r}")
        self.reduction, self.label_smoothing = reduction, float(label_smoothing)
        self.one_hot = ops.OneHot()
        self.softmax_cross_entropy = ops.SoftmaxCrossEntropyWithLogits()
        self.reduce_mean, self.reduce_sum = ops.ReduceMean(), ops.ReduceSum()

    def construct(self, logits, labels):
        classes = logits.shape[-1]
        smoothing = self.label_smoothing
        if len(labels.shape) == len(logits.shape) - 1:
            labels = self.one_hot(labels, classes, 1.0 - smoothing + smoothing / classes, smoothing / classes)
        elif smoothing:
            raise ConfigError("CrossEntropyLoss: label_smoothing applies to class indices, got class probabilities")
        loss = self.softmax_cross_entropy(logits, labels)
        if self.reduction == "mean":
            return self.reduce_mean(loss, ())
        return self.reduce_sum(loss, ()) if self.reduction == "sum" else loss
