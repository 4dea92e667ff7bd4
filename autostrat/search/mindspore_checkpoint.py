"""Strategy checkpoints saved by MindSpore, read as seeds (issue #18: plans travel both ways).

MindSpore (``strategy_ckpt_config={"save_file": ...}``) writes one of two files:

- ``.ckpt``: a protobuf ``ParallelStrategyMap`` (``node_strategy.proto``, proto2):
  ``current_stage = 1`` (uint32); ``parallel_strategy_item = 2`` (``node_name = 1`` string,
  ``parallel_strategys = 2``: ``stage = 1`` uint32, ``parallel_strategy = 2``: ``dim = 1``
  repeated uint32); ``parallel_layout_item = 3`` (``param_name = 1``, ``parallel_layouts = 2``:
  ``dev_matrix = 1``, ``tensor_map = 2`` (int32, -1 = not split), ``param_split_shape = 3``,
  ``indices_offset = 4``, ``field = 5``, ``opt_weight_shard_step = 6``,
  ``opt_weight_shard_size = 7``);
- ``.json``: the same as objects keyed by name: ``{"current_stage": 2, "parallel_strategy_item":
  {"MatMul_dense1.weight": {"parallel_strategy": [[2, 1], [1, 4]], "stage": 0}}, ...}``.

A dim split over several device axes (a ``Layout``), and the empty strategy item MindSpore writes
for an op sharded by Layouts, are read as `search.mindspore_layouts` describes.

Both name an op by its type and the parameter it reads (``MatMul_dense1.weight``), and a
parameter by its path in the Cell tree (``dense1.weight``), as autostrat names parameters; so a
MindSpore op name resolves to the op of that type reading that parameter in the traced graph
(`resolve_names`). The wire format is decoded here (varints and length-delimited fields, packed
or not) and encoded back (`encode`, byte for byte as MindSpore writes them), without the
protobuf package: the search's import path stays lean.
"""

from __future__ import annotations

from pathlib import Path

from autostrat.autodiff import op_phase
from autostrat.errors import AutostratError, ConfigError
from autostrat.protobuf import field, number_field
from autostrat.reading import parse_json, read_bytes
from autostrat.layout import Strategy
from autostrat.layout.named import named_layouts
from autostrat.layout.placement import aligned
from autostrat.search.mindspore_layouts import protobuf_entries, seed_from_parameter, stored_layout

# Message -> field number -> (name, kind, message of a nested field); kinds: "uint", "int", "string", "message".
_SCHEMA = {
    "ParallelStrategyMap": {1: ("current_stage", "uint", None), 2: ("parallel_strategy_item", "message", "Item"),
                            3: ("parallel_layout_item", "message", "LayoutItem")},
    "Item": {1: ("node_name", "string", None), 2: ("parallel_strategys", "message", "Strategys")},
    "Strategys": {1: ("stage", "uint", None), 2: ("parallel_strategy", "message", "Dims")},
    "Dims": {1: ("dim", "int", None)},
    "LayoutItem": {1: ("param_name", "string", None), 2: ("parallel_layouts", "message", "Layouts")},
    "Layouts": {1: ("dev_matrix", "message", "Dims"), 2: ("tensor_map", "message", "Dims"), 3: ("param_split_shape", "message", "Dims"),
                4: ("indices_offset", "message", "Dims"), 5: ("field", "int", None), 6: ("opt_weight_shard_step", "int", None),
                7: ("opt_weight_shard_size", "int", None)},
}
# MindSpore's op type in a node name -> the autostrat op types that compute it.
_SAME_OP = {"Add": ("Add", "BiasAdd"), "BiasAdd": ("BiasAdd", "Add")}


def _varint(data: bytes, position: int, where: str) -> tuple[int, int]:
    value = shift = 0
    while True:
        if position >= len(data) or shift > 63:
            raise ConfigError(f"{where}: not a MindSpore strategy checkpoint (a truncated or malformed protobuf varint)")
        byte = data[position]
        value |= (byte & 0x7F) << shift
        position, shift = position + 1, shift + 7
        if not byte & 0x80:
            return value, position


def _signed(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value  # int32/int64 negatives are 10-byte varints


def decode(data: bytes, message: str = "ParallelStrategyMap", where: str = "strategy checkpoint") -> dict:
    """The fields of one protobuf message as a dict (repeated fields as lists).

    Example (MindSpore's encoding of ``dim: [2, 1]``, unpacked as proto2 writes it):
        >>> decode(bytes([0x08, 0x02, 0x08, 0x01]), "Dims")
        {'dim': [2, 1]}
    """
    fields: dict = {}
    position = 0
    while position < len(data):
        key, position = _varint(data, position, where)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, position = _varint(data, position, where)
            values = [value]
        elif wire == 2:
            length, position = _varint(data, position, where)
            if position + length > len(data):
                raise ConfigError(f"{where}: not a MindSpore strategy checkpoint (a field runs past the end of the file)")
            payload, position = data[position:position + length], position + length
            values = [payload]
        else:
            raise ConfigError(f"{where}: not a MindSpore strategy checkpoint (protobuf wire type {wire} in {message})")
        name, kind, nested = _SCHEMA[message].get(number, (None, None, None))
        if name is None:
            continue  # a field this reader does not know: skipped, as protobuf does
        _check_wire(message, name, kind, wire, where)
        for value in values:
            if kind == "message":
                fields.setdefault(name, []).append(decode(value, nested, where))
            elif kind == "string":
                fields[name] = value.decode("utf-8", errors="replace")
            elif isinstance(value, bytes):  # a packed repeated number
                packed, offset = [], 0
                while offset < len(value):
                    number_value, offset = _varint(value, offset, where)
                    packed.append(_signed(number_value))
                fields.setdefault(name, []).extend(packed)
            elif name == "dim":
                fields.setdefault(name, []).append(_signed(value))
            else:
                fields[name] = _signed(value)
    return fields


def _check_wire(message: str, name: str, kind: str, wire: int, where: str) -> None:
    """A field must come in the wire type of its kind: a message or a string length-delimited
    (2), a number as a varint (0), or packed (2) when repeated (``dim``)."""
    expected = (2,) if kind in ("message", "string") else (0, 2) if name == "dim" else (0,)
    if wire not in expected:
        raise ConfigError(f"{where}: not a MindSpore strategy checkpoint ({message}.{name} is a {kind} field, "
                          f"but comes in protobuf wire type {wire})")


def encode(fields: dict, message: str = "ParallelStrategyMap") -> bytes:
    """The protobuf bytes of one message given as `decode` returns it: fields in number order,
    repeated numbers unpacked (proto2, as MindSpore writes them).

    Example:
        >>> encode({"dim": [2, 1]}, "Dims").hex()
        '08020801'
    """
    out = bytearray()
    for number, (name, kind, nested) in sorted(_SCHEMA[message].items()):
        if name not in fields:
            continue
        values = fields[name] if isinstance(fields[name], list) else [fields[name]]
        for value in values:
            if kind == "message":
                out += field(number, encode(value, nested))
            elif kind == "string":
                out += field(number, value.encode("utf-8"))
            else:
                out += number_field(number, value)
    return bytes(out)


def read_mindspore_checkpoint(path) -> dict | None:
    """MindSpore's strategy checkpoint at `path` as ``{node name: (in_strategy, None)}``, or
    None when the file is a JSON one autostrat wrote (its ``autostrat`` part names every op)."""
    found = read_mindspore_plan(path)
    return None if found is None else found[0]


def read_mindspore_plan(path) -> tuple[dict, dict] | None:
    """The file at `path`, read once: MindSpore's seeds (as `read_mindspore_checkpoint` gives
    them) and its parameters' ``{name: (dev_matrix, tensor_map, tensor_shape)}`` (``parallel_layout_item``:
    the axis order of a Layout-sharded op, which its strategy tuples do not keep); None for a
    JSON one autostrat wrote."""
    path = Path(path)
    data = read_bytes(path, "strategy checkpoint")
    if not _looks_like_json(data):
        fields = decode(data, where=str(path))
        return _from_protobuf(fields, path), _protobuf_layouts(fields, path)
    document = parse_json(data, path, "strategy checkpoint")
    items = document.get("parallel_strategy_item") if isinstance(document, dict) else None
    if isinstance(items, list) or isinstance(document, dict) and "autostrat" in document:
        return None  # autostrat's own checkpoint: `checkpoint.load_checkpoint_seeds` reads every op of it
    if not isinstance(items, dict):
        raise ConfigError(f"{path}: expected a strategy checkpoint (a 'parallel_strategy_item' object or list)")
    seeds = {}
    for name, item in items.items():
        strategy = item.get("parallel_strategy") if isinstance(item, dict) else None
        if not isinstance(strategy, list) or not all(isinstance(s, list) and all(isinstance(d, int) for d in s) for s in strategy):
            raise ConfigError(f"{path}: parallel_strategy_item.{name}: expected {{\"parallel_strategy\": [[...], ...]}}, got {item!r}")
        seeds[name] = (tuple(tuple(s) for s in strategy), None)
    return seeds, _json_layouts(document.get("parallel_layout_item"), path)


def _looks_like_json(data: bytes) -> bool:
    """Whether `data` opens as JSON does (an object or a list, after a byte-order mark and
    spaces). Protobuf cannot: ``{`` and ``[`` would be fields 15 and 11 of wire type 3 (a
    group), which no strategy checkpoint has; so a JSON file's syntax error is reported as one."""
    return data.removeprefix(b"\xef\xbb\xbf").lstrip(b" \t\r\n")[:1] in (b"{", b"[")


def _protobuf_layouts(fields: dict, path: Path) -> dict:
    found = {}
    for item in fields.get("parallel_layout_item", []):
        if not (item.get("param_name") and item.get("parallel_layouts")):
            continue
        layout = item["parallel_layouts"][0]
        matrix = layout["dev_matrix"][0].get("dim", []) if layout.get("dev_matrix") else None
        tensor_map = protobuf_entries(layout["tensor_map"]) if layout.get("tensor_map") else None
        found[item["param_name"]] = _layout_item(matrix, tensor_map, None, path, item["param_name"], layout)
    return found


def _json_layouts(items, path: Path) -> dict:
    if not isinstance(items, dict):
        return {}
    return {name: _layout_item(item["dev_matrix"], item["tensor_map"], item.get("tensor_shape"), path, name, item)
            for name, item in items.items() if isinstance(item, dict) and "dev_matrix" in item and "tensor_map" in item}


def _integers(values, nested: bool = False) -> bool:
    return isinstance(values, list) and all(
        isinstance(v, int) or nested and isinstance(v, list) and _integers(v) for v in values)


def _layout_item(matrix, tensor_map, tensor_shape, path: Path, name: str, item) -> tuple:
    """A parameter's layout item as ``(dev_matrix, tensor_map, tensor_shape)`` (tensor map
    entries -1, an axis or a list of axes; `tensor_shape` MindSpore's JSON one, cut into
    sub-dims, or None), or a `ConfigError` naming it."""
    if not (_integers(matrix) and _integers(tensor_map, nested=True) and (tensor_shape is None or _integers(tensor_shape))):
        raise ConfigError(f"{path}: parallel_layout_item.{name}: expected dev_matrix and tensor_map lists of integers, "
                          f"got {item!r}")
    return tuple(matrix), tuple(tensor_map), None if tensor_shape is None else tuple(tensor_shape)


def _from_protobuf(fields: dict, path: Path) -> dict:
    seeds = {}
    for index, item in enumerate(fields.get("parallel_strategy_item", [])):
        if "node_name" not in item or "parallel_strategys" not in item:
            raise ConfigError(f"{path}: parallel_strategy_item[{index}] lacks node_name or parallel_strategys")
        strategys = item["parallel_strategys"][0]
        seeds[item["node_name"]] = (tuple(tuple(s.get("dim", [])) for s in strategys.get("parallel_strategy", [])), None)
    if not seeds:
        raise ConfigError(f"{path}: a MindSpore strategy checkpoint with no parallel_strategy_item")
    return seeds


def resolve_names(graph, seeds: dict, where: str, layouts: dict | None = None) -> dict:
    """MindSpore node names (``MatMul_dense1.weight``) -> the graph's op names; a name already an
    op of the graph stays. A name no op answers is a `ConfigError` naming it. With `layouts`
    (``{parameter: (dev_matrix, tensor_map, tensor_shape)}``), an op whose parameter lies in another axis order than its
    tuples imply (MindSpore sharded it with a Layout) is seeded with that order (`_placed`);
    `read_mindspore_plan` reads both (``{parameter: (dev_matrix, tensor_map, tensor_shape)}``).

    Example:
        >>> from autostrat.frontend import trace
        >>> from autostrat.models import FFN
        >>> from autostrat.nn import Tensor
        >>> graph = trace(FFN(), Tensor(shape=(64, 64)))
        >>> resolve_names(graph, {"MatMul_dense1.weight": 1, "Add_dense2.bias": 2}, "ckpt")
        {'dense1.matmul': 1, 'dense2.bias_add': 2}
    """
    resolved = {}
    for name, seed in seeds.items():
        if name in graph.ops:
            resolved[name] = seed
            continue
        op_type, _, parameter = name.partition("_")
        kinds = _SAME_OP.get(op_type, (op_type,))
        found = [op for op, _ in graph.consumers(parameter) if graph.ops[op].op_type in kinds] if parameter in graph.tensors else []
        if not found:
            raise ConfigError(f"{where}: MindSpore op {name!r} ({op_type} reading parameter {parameter!r}) matches no op of "
                              f"{graph.name}; the Cell tree must name its parameters as the one that saved the checkpoint")
        resolved[found[0]] = _placed(graph.ops[found[0]], seed, parameter, (layouts or {}).get(parameter), where)
    return resolved


def _placed(op, seed: tuple, parameter: str, stored, where: str) -> tuple:
    """`seed` as Layouts when `parameter`, which `op` reads, is `stored` ``(dev_matrix,
    tensor_map, tensor_shape)`` in another axis order than the seed's tuples put it, or when
    the seed is MindSpore's empty strategy of an op it sharded by Layouts
    (`mindspore_layouts.seed_from_parameter`); else `seed`."""
    empty = seed == ((), None)
    if stored is None and empty:
        raise ConfigError(f"{where}: {op.op_type}_{parameter} has an empty strategy (MindSpore writes one for an op "
                          f"sharded by Layouts) and the file holds no layout of {parameter} to seed it from")
    if stored is None or seed[1] is not None:
        return seed
    index = op.inputs.index(parameter)
    wanted = stored_layout(stored, op.rule.input_shapes[index], f"{where}: parallel_layout_item.{parameter}")
    if empty:
        found = seed_from_parameter(op, index, wanted)
        if found is None:
            raise ConfigError(f"{where}: {op.op_type}_{parameter} has an empty strategy and {parameter}'s layout "
                              f"{wanted} does not fit {op.name}")
        return found, None
    try:
        strategy = Strategy.from_tuples(op.rule, seed[0], wanted.device_num)
    except AutostratError:
        return seed  # the strategy check reports what is wrong with the tuples
    if strategy.input_layouts[index].with_partial().equivalent(wanted):
        return seed
    placement = aligned(op.rule.factors, strategy.splits, op.rule.inputs[index], wanted)
    if placement is None:
        return seed
    return named_layouts(Strategy(op.rule, strategy.splits, wanted.device_num, placement=placement)), None


def mindspore_names(graph) -> dict[str, str]:
    """The forward ops of `graph` that MindSpore's strategy checkpoint names, with those names:
    each op reading a parameter, as ``<op type>_<first parameter it reads>`` (the inverse of
    `resolve_names`); a second op of that type reading that parameter first is left out, as
    one name can hold one strategy.

    Example:
        >>> from autostrat.frontend import trace
        >>> from autostrat.models import FFN
        >>> from autostrat.nn import Tensor
        >>> mindspore_names(trace(FFN(), Tensor(shape=(64, 64))))["dense2.matmul"]
        'MatMul_dense2.weight'
    """
    parameters = {tensor.name for tensor in graph.parameters()}
    names: dict[str, str] = {}
    taken: set[str] = set()
    for op in graph.ops.values():
        read = [name for name in op.inputs if name in parameters]
        if read and op_phase(op.name) == "forward":
            name = f"{op.op_type}_{read[0]}"
            if name not in taken:
                names[op.name] = name
                taken.add(name)
    return names
