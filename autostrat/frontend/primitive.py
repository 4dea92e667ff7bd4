"""Primitives: one class per registered op, called like MindSpore's `ops.MatMul()(x, w)`.

Outside a trace a primitive runs its numpy kernel on tensors with data (eager mode, the
single-device reference). Inside a trace it records an op node instead.
"""

from __future__ import annotations

import inspect
import warnings

import numpy as np

from autostrat.errors import ConfigError
from autostrat.frontend import tracing
from autostrat.frontend.tensor import Tensor
from autostrat.frontend.world import get_rank
from autostrat.ir import dtype_name
from autostrat.layout.named import is_layout_strategy
from autostrat.rules import get_op, op_types
from autostrat.runtime.kernels import run_kernel


def freeze(value):
    """Attribute values as hashable, printable data: lists become tuples, dtypes names."""
    if isinstance(value, (list, tuple)):
        return tuple(freeze(v) for v in value)
    if isinstance(value, (type, np.dtype)):
        return dtype_name(value)
    if isinstance(value, np.generic):
        return value.item()
    return value


def _check_strategy_form(strategy, what: str):
    if strategy is None:
        return None
    if is_layout_strategy(strategy):
        return tuple(strategy)  # MindSpore Layouts, one per tensor: checked against the op when traced
    if not isinstance(strategy, (tuple, list)) or not all(
        isinstance(s, (tuple, list)) and all(isinstance(p, int) and not isinstance(p, bool) for p in s) for s in strategy
    ):
        raise ConfigError(f"{what} must be a tuple of tuples of integers such as ((2, 1), (1, 4)), or of Layouts such as "
                          f"(layout('dp', 'None'),), got {strategy!r}")
    return tuple(tuple(s) for s in strategy)


class Primitive:
    """Base of the generated op classes. `init_attrs` are constructor arguments, `call_attrs`
    the trailing non-tensor call arguments (``ReduceSum(keep_dims)(x, axis)``)."""

    op_type = ""
    init_attrs: tuple[str, ...] = ()
    call_attrs: tuple[str, ...] = ()

    def __init__(self, *args, **kwargs):
        if len(args) > len(self.init_attrs):
            raise ConfigError(f"{self.op_type}() takes at most {len(self.init_attrs)} arguments ({', '.join(self.init_attrs)}), got {len(args)}")
        unknown = sorted(set(kwargs) - set(self.init_attrs))
        if unknown:
            raise ConfigError(f"{self.op_type}() got unknown argument {unknown[0]!r}; it accepts {', '.join(self.init_attrs) or 'none'}")
        self.attrs = {name: freeze(value) for name, value in zip(self.init_attrs, args)} | {k: freeze(v) for k, v in kwargs.items()}
        self.in_strategy = None
        self.out_strategy = None
        self.prim_attrs: dict = {}
        self.recomputed = False

    def add_prim_attr(self, name: str, value) -> Primitive:
        """MindSpore's ``add_prim_attr``: of its attributes, autostrat acts on ``enable_nd_tp``
        (a MatMul's or BatchMatMul's high-dimension tensor parallel, `layout.nd_tp`); any other
        is refused rather than ignored. Returns the primitive, as MindSpore does.

        Example:
            >>> from autostrat import ops
            >>> ops.MatMul().add_prim_attr("enable_nd_tp", True).prim_attrs
            {'enable_nd_tp': True}
        """
        if name != "enable_nd_tp" or self.op_type not in ("BatchMatMul", "MatMul"):
            raise ConfigError(f"{self.op_type}.add_prim_attr: autostrat acts on 'enable_nd_tp' of a MatMul or BatchMatMul "
                              f"only, got {name!r} on {self.op_type}")
        if not isinstance(value, bool):
            raise ConfigError(f"{self.op_type}.add_prim_attr: enable_nd_tp is True or False, got {value!r}")
        self.prim_attrs[name] = value
        return self

    def shard(self, in_strategy, out_strategy=None) -> Primitive:
        """Configure this op's strategy (a seed); returns the primitive, as MindSpore does.

        Example:
            >>> from autostrat import ops
            >>> ops.MatMul().shard(((2, 1), (1, 4))).in_strategy
            ((2, 1), (1, 4))
        """
        self.in_strategy = _check_strategy_form(in_strategy, f"{self.op_type}.shard in_strategy")
        self.out_strategy = _check_strategy_form(out_strategy, f"{self.op_type}.shard out_strategy")
        return self

    def recompute(self, mode: bool = True) -> Primitive:
        """MindSpore's ``Primitive.recompute``: the op's output is not kept for the backward but
        computed again there from its inputs (as `Cell.recompute` does for a cell).

        Example:
            >>> from autostrat import ops
            >>> ops.ReLU().recompute().recomputed
            True
        """
        self.recomputed = bool(mode)
        return self

    def _split_arguments(self, args) -> tuple[list[Tensor], dict]:
        if self.op_type in ("Concat", "Einsum") and len(args) == 1 and isinstance(args[0], (tuple, list)):
            args = tuple(args[0])
        count = 0
        while count < len(args) and isinstance(args[count], Tensor):
            count += 1
        extra = args[count:]
        if len(extra) > len(self.call_attrs) or any(isinstance(a, Tensor) for a in extra):
            raise ConfigError(
                f"{self.op_type} takes tensors followed by {', '.join(self.call_attrs) or 'nothing'}; got {len(args)} arguments"
            )
        return list(args[:count]), {name: freeze(v) for name, v in zip(self.call_attrs, extra)}

    def __call__(self, *args):
        tensors, call = self._split_arguments(args)
        attrs = self.attrs | call
        if tracing.is_tracing():
            return tracing.record(self, tensors, attrs)
        outputs = run_kernel(self.op_type, [t.asnumpy() for t in tensors], attrs)
        wrapped = tuple(Tensor(out) for out in outputs)
        return wrapped[0] if len(wrapped) == 1 else wrapped

    def __repr__(self) -> str:
        return f"{self.op_type}({', '.join(f'{k}={v!r}' for k, v in self.attrs.items())})"


# MindSpore passes these as call arguments rather than constructor arguments.
CALL_ATTRS = {
    "Cast": ("dtype",),
    "ExpandDims": ("axis",),
    "Gather": ("axis",),
    "OneHot": ("depth", "on_value", "off_value"),
    "ReduceMax": ("axis",),
    "ReduceMean": ("axis",),
    "ReduceSum": ("axis",),
    "Reshape": ("shape",),
    "Slice": ("begin", "size"),
    "Transpose": ("perm",),
}


def primitive_classes() -> dict[str, type[Primitive]]:
    """One Primitive subclass per registered op type, alphabetically."""
    classes = {}
    for op_type in op_types():
        call = CALL_ATTRS.get(op_type, ())
        init = tuple(name for name in inspect.signature(get_op(op_type).build).parameters if name not in call)[1:]
        classes[op_type] = type(op_type, (Primitive,), {"op_type": op_type, "init_attrs": init, "call_attrs": call})
    return classes


# MindSpore 2.x's functional names that are not the primitive's name in snake case.
_FUNCTIONAL_NAMES = {"BatchMatMul": ("bmm", "batch_matmul"), "Conv2D": ("conv2d",), "GeLU": ("gelu",), "MatMul": ("matmul",),
                     "RealDiv": ("div", "real_div"), "ReduceMax": ("amax", "reduce_max"), "ReduceMean": ("mean", "reduce_mean"),
                     "ReduceSum": ("sum", "reduce_sum"), "ReLU": ("relu",), "SiLU": ("silu",)}
_INTERNAL = ("Grad", "Apply", "Backprop")  # backward and update ops: no functional form


def _snake(op_type: str) -> str:
    return "".join(("_" if index and char.isupper() and not op_type[index - 1].isupper() else "") + char.lower()
                   for index, char in enumerate(op_type))


def _functional(cls: type[Primitive]):
    if cls.op_type == "Einsum":  # MindSpore's ``ops.einsum(equation, *operands)``: the equation first
        return lambda equation, *operands: cls(equation)(tuple(operands))

    def call(*args, **kwargs):
        # Tensors first; then the call arguments (an axis, a shape), then constructor arguments
        # (MindSpore's `ops.mean(x, axis, keep_dims)`, `ops.softmax(x, axis)`).
        count = next((i for i, a in enumerate(args) if not isinstance(a, Tensor)), len(args))
        names = cls.call_attrs + cls.init_attrs
        extra = dict(zip(names, args[count:])) | kwargs
        if len(args) - count > len(names) or set(extra) - set(names):
            raise ConfigError(f"{call.__name__} takes tensors, then {', '.join(names) or 'nothing'}; got {args[count:]!r} {kwargs!r}")
        if cls.op_type in ("ReduceMean", "ReduceSum", "ReduceMax") and extra.get("axis", ()) is None:
            extra["axis"] = ()  # None: every axis, as MindSpore means it
        init = {name: extra[name] for name in cls.init_attrs if name in extra}
        return cls(**init)(*args[:count], *(extra[name] for name in cls.call_attrs if name in extra))
    return call


def functional_ops() -> dict:
    """MindSpore 2.x's functional ops (``ops.matmul(x, w)``, ``ops.relu(x)``, ``ops.mean(x, axis)``):
    one function per forward primitive, named in snake case, plus MindSpore's own names.

    Example:
        >>> ops = functional_ops()
        >>> ops["matmul"](Tensor(np.ones((2, 3), np.float32)), Tensor(np.ones((3, 1), np.float32))).asnumpy().tolist()
        [[3.0], [3.0]]
        >>> float(ops["mean"](Tensor(np.arange(4.0)), None).asnumpy()), sorted(ops)[:4]
        (1.5, ['add', 'amax', 'batch_matmul', 'bias_add'])
    """
    found = {}
    for op_type, cls in primitive_classes().items():
        if any(part in op_type for part in _INTERNAL):
            continue
        for name in _FUNCTIONAL_NAMES.get(op_type, (_snake(op_type),)):
            function = _functional(cls)
            function.__name__ = name
            function.__doc__ = f"MindSpore's functional ``ops.{name}``: ``ops.{op_type}`` applied once."
            found[name] = function
    return dict(sorted(found.items()))


class Flatten(Primitive):
    """MindSpore's ``ops.Flatten()``: ``[b, d1, d2 ...] -> [b, d1 * d2 * ...]``, a Reshape that
    keeps dim 0 (its rule, kernel, backward and strategies are Reshape's).

    Example:
        >>> Flatten()(Tensor(np.zeros((2, 1, 3, 4), np.float32))).shape
        (2, 12)
    """

    op_type = "Reshape"
    call_attrs = ("shape",)

    def __call__(self, x):
        if not isinstance(x, Tensor) or len(x.shape) < 1:
            raise ConfigError(f"Flatten: expected a tensor of at least one dim, got {getattr(x, 'shape', type(x).__name__)}")
        return super().__call__(x, (x.shape[0], int(np.prod(x.shape[1:], dtype=np.int64))))


class Print:
    """MindSpore's ``ops.Print()``: prints its arguments (tensors as their values) on rank 0 when
    run eagerly. Traced into a plan it has no values to print and no op: it returns None and
    warns once that nothing is printed per step.

    Example:
        >>> Print()("x is:", Tensor(np.ones(2, np.float32)))
        x is: [1. 1.]
    """

    def __call__(self, *args):
        if tracing.is_tracing():
            if get_rank() == 0:
                warnings.warn("ops.Print in a cell run under a parallel plan prints nothing (autostrat plans have no "
                              "print op; print the values a step returns instead)", stacklevel=2)
            return None
        if get_rank() == 0:
            print(*(arg.asnumpy() if isinstance(arg, Tensor) else arg for arg in args), flush=True)
        return None
