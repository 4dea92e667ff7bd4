"""Parameter layouts in MindSpore 2.10's strategy checkpoints when a dim is split over several
device axes (a ``Layout`` such as ``layout(("sp", "dp"), "None")``), both ways.

MindSpore writes such a dim in two ways (tests/fixtures/mindspore/README.md, "2-D tensor parallel"):

- JSON: the dim cut into one sub-dim per axis, and one axis per sub-dim: ``fc1_weight`` [784, 512]
  with tensor map ``((1, 2), -1)`` on [2, 2, 2] is ``"tensor_shape": [2, 392, 512]``,
  ``"tensor_map": [1, 2, -1]`` (every sub-dim but the last is its axis's size, the last the rest);
- protobuf: one ``TensorMap`` message per dim (``dim: [1, 2]``, ``dim: [-1]``) rather than one for
  the whole tensor.

Its strategy item of an op sharded by Layouts is empty (``"parallel_strategy": []``), which
MindSpore itself cannot load back; `seed_from_parameter` seeds such an op from the layout of the
parameter it reads, and autostrat writes the tuples its layouts imply, which MindSpore loads.
"""

from __future__ import annotations

import math

from autostrat.errors import AutostratError, ConfigError
from autostrat.layout import DeviceMatrix, Layout, Strategy, TensorMap
from autostrat.layout.named import named_layouts
from autostrat.layout.placement import aligned


def _axis_size(matrix, axis: int) -> int:
    return matrix[len(matrix) - 1 - axis]


def expanded(matrix, entries, shape) -> tuple[list[int], list[int]]:
    """MindSpore's JSON ``(tensor_map, tensor_shape)`` of a tensor of `shape` whose dims lie on
    `entries` (per dim: -1, an axis, or a list of axes, major first) of device `matrix`.

    Example (advanced_distributed_operator_parallel.py's fc1_weight):
        >>> expanded([2, 2, 2], [[1, 2], -1], (784, 512))
        ([1, 2, -1], [2, 392, 512])
    """
    tensor_map, tensor_shape = [], []
    for entry, size in zip(entries, shape):
        axes = entry if isinstance(entry, list) else [entry]
        leading = [_axis_size(matrix, axis) for axis in axes[:-1]]
        tensor_map += axes
        tensor_shape += leading + [size // math.prod(leading)]
    return tensor_map, tensor_shape


def merged(tensor_map, tensor_shape, shape, where: str) -> list:
    """The inverse of `expanded`: per dim of `shape`, -1, an axis or a list of axes.

    Example:
        >>> merged([1, 2, -1], [2, 392, 512], (784, 512), "ckpt")
        [[1, 2], -1]
    """
    if len(tensor_map) != len(tensor_shape):
        raise ConfigError(f"{where}: tensor_map {tensor_map} and tensor_shape {tensor_shape} differ in length")
    entries, position = [], 0
    for size in shape:
        axes, product = [], 1
        while position < len(tensor_shape) and (product < size or not axes):
            product *= tensor_shape[position]
            axes.append(tensor_map[position])
            position += 1
        if product != size:
            raise ConfigError(f"{where}: tensor_shape {tensor_shape} does not cut the parameter's shape {list(shape)} "
                              f"into sub-dims")
        axes = [axis for axis in axes if axis != -1]
        entries.append(-1 if not axes else axes[0] if len(axes) == 1 else axes)
    if position != len(tensor_shape):
        raise ConfigError(f"{where}: tensor_shape {tensor_shape} has more sub-dims than the parameter's shape {list(shape)}")
    return entries


def protobuf_tensor_maps(entries) -> list[dict]:
    """The ``tensor_map`` messages of a ``ParallelLayouts``: one for the whole tensor, or, when a
    dim lies on several axes, one per dim (as MindSpore writes them).

    Example:
        >>> protobuf_tensor_maps([[1, 2], -1]), protobuf_tensor_maps([1, -1])
        ([{'dim': [1, 2]}, {'dim': [-1]}], [{'dim': [1, -1]}])
    """
    if any(isinstance(entry, list) for entry in entries):
        return [{"dim": entry if isinstance(entry, list) else [entry]} for entry in entries]
    return [{"dim": list(entries)}]


def protobuf_entries(messages: list[dict]) -> list:
    """Per dim, -1, an axis or a list of axes, from a ``ParallelLayouts``' tensor map messages
    (MindSpore's reader skips empty ones).

    Example:
        >>> protobuf_entries([{"dim": [1, 2]}, {"dim": [-1]}]), protobuf_entries([{"dim": [1, -1]}])
        ([[1, 2], -1], [1, -1])
    """
    if len(messages) <= 1:
        return list(messages[0].get("dim", [])) if messages else []
    dims = [message["dim"] for message in messages if message.get("dim")]
    return [dim[0] if len(dim) == 1 else list(dim) for dim in dims]


def stored_layout(stored, shape, where: str) -> Layout:
    """A parameter's layout item ``(dev_matrix, tensor_map, tensor_shape or None)`` as a `Layout`
    of `shape` (the parameter's shape in the traced graph)."""
    matrix, tensor_map, tensor_shape = stored
    entries = tensor_map
    if tensor_shape is not None and list(tensor_shape) != list(shape):
        entries = merged(list(tensor_map), list(tensor_shape), shape, where)
    try:
        return Layout(DeviceMatrix(tuple(matrix)), TensorMap(tuple(tuple(e) if isinstance(e, list) else e for e in entries)),
                      tuple(shape))
    except AutostratError as error:
        raise ConfigError(f"{where}: {error}") from None


def seed_from_parameter(op, index: int, layout: Layout):
    """A seed (Layouts) for `op`, whose input `index` is a parameter MindSpore stored in `layout`
    with an empty strategy item (it was sharded by Layouts): the parameter's factors on its axes;
    the axes it leaves free split the op's first other factor that may be split evenly (a
    MatMul's rows: data parallel, as the samples shard them), the rest repeat. None when the
    layout does not fit the op.

    Example (the advanced sample's fc1_weight on (dp, sp, mp): rows over mp):
        >>> from autostrat.ir import OpNode
        >>> from autostrat.rules import make_rule
        >>> op = OpNode("matmul1", "MatMul", (), ("x", "w"), ("y",), make_rule("MatMul", [(32, 784), (784, 512)]))
        >>> w = Layout(DeviceMatrix((2, 2, 2)), TensorMap(((1, 2), -1)), (784, 512))
        >>> [str(named) for named in seed_from_parameter(op, 1, w)]
        ["layout((2, 2, 2), ('axis2', 'axis1', 'axis0'))('axis0', ('axis1', 'axis2'))", \
"layout((2, 2, 2), ('axis2', 'axis1', 'axis0'))(('axis1', 'axis2'), 'None')"]
    """
    rule, dims = op.rule, op.rule.inputs[index]
    if any(len(factors) != 1 for factors in dims if factors):
        return None
    split = dict.fromkeys(rule.factors, 1)
    for factors, parts in zip(dims, layout.parts):
        if factors:
            split[factors[0]] = parts
    free = layout.device_num // math.prod(layout.parts)
    own = {factors[0] for factors in dims if factors}
    sizes = dict(zip(rule.factors, rule.factor_sizes))
    for factor in rule.factors:
        if factor not in own and factor not in rule.reduction | rule.need_replication and sizes[factor] % free == 0:
            split[factor] = free
            break
    splits = tuple(split[factor] for factor in rule.factors)
    placement = aligned(rule.factors, splits, dims, layout)
    if placement is None:
        return None
    try:
        return named_layouts(Strategy(rule, splits, layout.device_num, placement=placement))
    except AutostratError:
        return None
