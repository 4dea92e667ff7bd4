"""Tracing `construct` on shape-only tensors into an `ir.Graph`.

Names: ops take the attribute path of their primitive (``dense1.matmul``); a primitive called
again gets ``_1``, ``_2``... in call order; a primitive that is no attribute of the model is
named by its op type in snake case. Seeds (`.shard`) are validated here against the op's
shapes, so a bad strategy is reported with the op's name before any search.
"""

from __future__ import annotations

import collections
import inspect
import re
import sys
from pathlib import Path

import numpy as np

from autostrat.errors import AutostratError, ConfigError
from autostrat.frontend.tensor import Parameter, Tensor
from autostrat.ir import Graph, OpNode, TensorInfo, output_dtypes
from autostrat.layout import Strategy, nd_tp
from autostrat.rules import make_rule

_active: _Tracer | None = None


def is_tracing() -> bool:
    return _active is not None


def _snake(op_type: str) -> str:
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", op_type).lower()


class _Tracer:
    def __init__(self, net, device_num: int):
        self.device_num = device_num
        self.tensors: dict[str, TensorInfo] = {}
        self.ops: dict[str, OpNode] = {}
        self.values: dict = {}
        self.paths = {id(p): path for path, p in net.primitives_and_names()}
        self.parameter_paths = {id(p): path for path, p in net.parameters_and_names()}
        self.names: dict[int, str] = {}  # id(tensor object) -> graph tensor name
        self.alive: list[Tensor] = []  # keeps traced tensors alive so their ids stay unique
        self.constants = 0  # constants named so far: the next is constant_<this>

    def add_tensor(self, info: TensorInfo, tensor: Tensor | None = None) -> Tensor:
        self.tensors[info.name] = info
        symbolic = tensor if tensor is not None else Tensor(shape=info.shape, dtype=info.dtype)
        self.names[id(symbolic)] = info.name
        self.alive.append(symbolic)
        return symbolic

    def tensor_name(self, tensor: Tensor, op_name: str) -> str:
        if id(tensor) in self.names:
            return self.names[id(tensor)]
        if isinstance(tensor, Parameter):
            name = self.parameter_paths.get(id(tensor)) or tensor.name or f"parameter_{len(self.parameter_paths)}"
            kind = "parameter"
        elif tensor.has_data:
            name, kind = f"constant_{self.constants}", "constant"
            self.constants += 1
        else:
            raise ConfigError(f"{op_name}: a shape-only tensor that is no input of construct was passed to it")
        self.add_tensor(TensorInfo(name, tensor.shape, tensor.dtype, kind), tensor)
        self.values[name] = tensor  # data made only if the graph is run (tensor.asnumpy())
        return name

    def op_name(self, primitive) -> str:
        base = self.paths.get(id(primitive)) or _snake(primitive.op_type)
        name, count = base, 0
        while name in self.ops:
            count += 1
            name = f"{base}_{count}"
        return name


def record(primitive, tensors: list[Tensor], attrs: dict):
    """Add one op application to the active trace; returns its symbolic output(s)."""
    tracer = _active
    name = tracer.op_name(primitive)
    seeds = (primitive.in_strategy, primitive.out_strategy)
    if getattr(primitive, "prim_attrs", {}).get("enable_nd_tp") and primitive.in_strategy is not None:
        if primitive.out_strategy is not None:
            raise ConfigError(f"{name}: with enable_nd_tp the output's layout follows from the inputs' "
                              f"(`layout.nd_tp`); shard it without out_strategy")
        return _record_nd_tp(tracer, name, primitive.op_type, tensors, attrs, primitive.in_strategy)
    return _add_op(tracer, name, primitive.op_type, tensors, attrs, seeds)


def _add_op(tracer: _Tracer, name: str, op_type: str, tensors: list[Tensor], attrs: dict, seeds: tuple):
    """Add op `name` applying `op_type` to `tensors`, seeded with ``(in_strategy, out_strategy)``."""
    inputs = tuple(tracer.tensor_name(t, name) for t in tensors)
    infos = [tracer.tensors[n] for n in inputs]
    check_dtypes(op_type, infos, name)
    rule = _checked_rule(tracer, name, op_type, infos, attrs, seeds)
    dtypes = output_dtypes(op_type, [info.dtype for info in infos], attrs, len(rule.output_shapes))
    outputs = [TensorInfo(f"{name}:{i}", shape, dtype, "output", name)
               for i, (shape, dtype) in enumerate(zip(rule.output_shapes, dtypes))]
    tracer.ops[name] = OpNode(
        name, op_type, tuple(sorted(attrs.items())), inputs, tuple(o.name for o in outputs),
        rule, seeds[0], seeds[1], _source(),
    )
    symbolic = tuple(tracer.add_tensor(info) for info in outputs)
    return symbolic[0] if len(symbolic) == 1 else symbolic


def _checked_rule(tracer: _Tracer, name: str, op_type: str, infos: list[TensorInfo], attrs: dict, seeds: tuple):
    """The op's rule, its seed checked against it; errors name the op."""
    try:
        rule = make_rule(op_type, [info.shape for info in infos], **attrs)
        if seeds[0] is not None:
            Strategy.from_tuples(rule, seeds[0], tracer.device_num, seeds[1], where=name)
    except AutostratError as error:
        message = str(error) if str(error).startswith(name) else f"{name}: {error}"
        raise type(error)(message) from None
    return rule


def _record_nd_tp(tracer: _Tracer, name: str, op_type: str, tensors: list[Tensor], attrs: dict, in_strategy):
    """A MatMul with ``enable_nd_tp`` as three seeded ops (`layout.nd_tp`): ``<name>.nd_tp_input``
    (an Identity holding the activation in the layout it arrives in), the product in its own
    layouts, and ``<name>.nd_tp_output`` (an Identity holding the output in the layout it leaves
    in); the gathers and the scatter between them are redistributions."""
    infos = [tracer.tensors[tracer.tensor_name(t, name)] for t in tensors]
    if len(infos) != 2:
        raise ConfigError(f"{name}: {op_type} takes two tensors, got {len(infos)}")
    rule = _checked_rule(tracer, name, op_type, infos, attrs, (None, None))
    try:
        given, product, leaving = nd_tp.nd_tp_layouts(rule, in_strategy, name)
    except AutostratError as error:
        raise type(error)(str(error) if str(error).startswith(name) else f"{name}: {error}") from None
    activation = _add_op(tracer, name + nd_tp.INPUT, "Identity", tensors[:1], {}, ((given,), None))
    output = _add_op(tracer, name, op_type, [activation, tensors[1]], attrs, (product, None))
    return _add_op(tracer, name + nd_tp.OUTPUT, "Identity", [output], {}, ((leaving,), None))


# Inputs read as indices (a table's rows, a class): integers, of any width.
INDEX_INPUTS = {"Gather": 1, "GatherGrad": 1, "OneHot": 0}


def check_dtypes(op_type: str, infos: list[TensorInfo], name: str) -> None:
    """MindSpore's compile-time dtype check of one op: indices are integers, and the other
    inputs share one dtype (no silent promotion of int32 or float16 data to float32 weights);
    only Cast changes a dtype.

    Example:
        >>> x, w = TensorInfo("x", (2, 3), "int32", "input"), TensorInfo("w", (3, 4), "float32", "parameter")
        >>> check_dtypes("MatMul", [x, w], "dense.matmul")
        Traceback (most recent call last):
        ...
        autostrat.errors.ConfigError: dense.matmul: MatMul takes inputs of one dtype, got x int32 and w float32; cast one with ops.Cast
    """
    if op_type == "Cast":
        return
    index = INDEX_INPUTS.get(op_type)
    if index is not None and index < len(infos) and np.dtype(infos[index].dtype).kind not in "iu":
        raise ConfigError(f"{name}: {op_type} reads input {index} ({infos[index].name}) as indices, which must be "
                          f"integers, got {infos[index].dtype}")
    others = [info for position, info in enumerate(infos) if position != index]
    mismatched = [info for info in others if info.dtype != others[0].dtype]
    if mismatched:
        raise ConfigError(f"{name}: {op_type} takes inputs of one dtype, got {others[0].name} {others[0].dtype} and "
                          f"{mismatched[0].name} {mismatched[0].dtype}; cast one with ops.Cast")


_MACHINERY = tuple(str(Path(__file__).resolve().parent / name) for name in ("tracing.py", "primitive.py", "cell.py"))


def _source() -> str:
    """``file:line`` of the code applying the op being recorded: the first caller outside the
    tracing machinery (a layer's or a model's `construct`), its path relative to the working
    directory when inside it, so that dumps are the same from any checkout."""
    frame = sys._getframe(2)
    while frame is not None and frame.f_code.co_filename in _MACHINERY:
        frame = frame.f_back
    if frame is None:
        return ""
    path = Path(frame.f_code.co_filename)
    try:
        shown = path.resolve().relative_to(Path.cwd())
    except ValueError:
        shown = path.name
    return f"{shown}:{frame.f_lineno}"


def _input_names(net, count: int) -> list[str]:
    parameters = list(inspect.signature(net.construct).parameters.values())
    named = [p.name for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return [named[i] if i < len(named) else f"input_{i}" for i in range(count)]


def _recursing(error: RecursionError) -> str:
    """The function (``Loop.construct``) outside the tracing machinery that appears most often
    in `error`'s traceback: the one that recursed."""
    counts = collections.Counter()
    frames = error.__traceback__
    while frames is not None:
        code = frames.tb_frame.f_code
        if code.co_filename not in _MACHINERY:
            counts[code.co_qualname] += 1
        frames = frames.tb_next
    return counts.most_common(1)[0][0] if counts else "construct"


def trace(net, *inputs: Tensor, device_num: int = 1) -> Graph:
    """Run `net.construct` on shape-only stand-ins of `inputs` and return the graph it builds.

    Example:
        >>> from autostrat.models import FFN
        >>> graph = trace(FFN(), Tensor(shape=(64, 64)), device_num=8)
        >>> list(graph.ops)
        ['dense1.matmul', 'dense1.bias_add', 'relu', 'dense2.matmul', 'dense2.bias_add']
    """
    global _active
    if _active is not None:
        raise ConfigError("trace() cannot be nested: a trace is already running")
    if not all(isinstance(t, Tensor) for t in inputs):
        raise ConfigError(f"trace() takes Tensor inputs, got {[type(t).__name__ for t in inputs]}")
    tracer = _Tracer(net, device_num)
    _active = tracer
    try:
        symbolic = [
            tracer.add_tensor(TensorInfo(name, t.shape, t.dtype, "input"))
            for name, t in zip(_input_names(net, len(inputs)), inputs)
        ]
        result = net(*symbolic)
    except RecursionError as error:
        raise ConfigError(f"{_recursing(error)} calls itself without end while {type(net).__name__} is traced "
                          f"(recursion deeper than Python allows); a construct must end") from None
    finally:
        _active = None
    results = result if isinstance(result, (tuple, list)) else (result,)
    if not results or not all(isinstance(r, Tensor) and id(r) in tracer.names for r in results):
        raise ConfigError(f"{type(net).__name__}.construct must return the tensors it computed, got {result!r}")
    outputs = tuple(tracer.names[id(r)] for r in results)
    return Graph(tracer.tensors, tracer.ops, outputs, type(net).__name__, tracer.values)
