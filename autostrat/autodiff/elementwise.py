"""Bprops of the elementwise ops. Broadcasting binary ops sum each operand's gradient back to
its shape (`GradBuilder.sum_to`). Dropout's backward reads the 1-byte mask its forward kept (one
rule, PyTorch's and so Megatron-LM's, whose activation memory counts the mask); a recomputed
Dropout writes its mask again, alike (`autodiff.recompute`), so recompute needs no other form."""

from __future__ import annotations

from autostrat.autodiff.registry import register_bprop


@register_bprop("Add")
def add(b, op, dy):
    x, y = op.inputs
    return b.sum_to(dy, b.shape(x)), b.sum_to(dy, b.shape(y))


@register_bprop("Sub")
def sub(b, op, dy):
    x, y = op.inputs
    return b.sum_to(dy, b.shape(x)), b.sum_to(b.emit("Neg", dy), b.shape(y))


@register_bprop("Mul")
def mul(b, op, dy):
    x, y = op.inputs
    return b.sum_to(b.emit("Mul", dy, y), b.shape(x)), b.sum_to(b.emit("Mul", dy, x), b.shape(y))


@register_bprop("RealDiv")
def real_div(b, op, dy):
    # d(x / y)/dy = -x / y**2 = -(dy / y) * out.
    x, y = op.inputs
    dx = b.emit("RealDiv", dy, y)
    return b.sum_to(dx, b.shape(x)), b.sum_to(b.emit("Neg", b.emit("Mul", dx, op.outputs[0])), b.shape(y))


def _select(op_type: str) -> None:
    @register_bprop(op_type)
    def bprop(b, op, dy):
        x, y = op.inputs
        # The grad op masks dy at the broadcast shape; each operand then sums its part back.
        for_x, for_y = b.emit_many(f"{op_type}Grad", x, y, dy)
        return b.sum_to(for_x, b.shape(x)), b.sum_to(for_y, b.shape(y))


_select("Maximum")
_select("Minimum")


@register_bprop("Exp")
def exp(b, op, dy):
    return (b.emit("Mul", dy, op.outputs[0]),)


@register_bprop("Log")
def log(b, op, dy):
    return (b.emit("RealDiv", dy, op.inputs[0]),)


@register_bprop("Neg")
def neg(b, op, dy):
    return (b.emit("Neg", dy),)


@register_bprop("Identity")
def identity(b, op, dy):
    return (dy,)


@register_bprop("ReLU")
def relu(b, op, dy):
    return (b.emit("ReluGrad", dy, op.outputs[0]),)


@register_bprop("GeLU")
def gelu(b, op, dy):
    return (b.emit("GeLUGrad", dy, op.inputs[0]),)


@register_bprop("SiLU")
def silu(b, op, dy):
    return (b.emit("SiLUGrad", dy, op.inputs[0]),)


def _from_output(op_type: str) -> None:
    # These grads read the forward output y (cheaper than recomputing from x): Grad(y, dy).
    @register_bprop(op_type)
    def bprop(b, op, dy):
        return (b.emit(f"{op_type}Grad", op.outputs[0], dy),)


for _name in ("Sigmoid", "Sqrt", "Tanh"):
    _from_output(_name)


@register_bprop("BiasAdd")
def bias_add(b, op, dy):
    rank = len(b.shape(dy))
    return dy, b.emit("ReduceSum", dy, axis=tuple(i for i in range(rank) if i != 1))


@register_bprop("Cast")
def cast(b, op, dy):
    x = op.inputs[0]
    return (b.emit("Cast", dy, dtype=b.dtype(x)) if b.is_float(x) else None,)


@register_bprop("Dropout")
def dropout(b, op, dy):
    # The backward reads the mask the forward kept (PyTorch's and so Megatron-LM's rule: one byte
    # an element until the backward); under recompute the recomputed forward writes it again,
    # alike, as the mask is a function of the seed and the element's index.
    return (b.emit("DropoutGrad", dy, op.outputs[1], keep_prob=op.attr_dict["keep_prob"]),)
