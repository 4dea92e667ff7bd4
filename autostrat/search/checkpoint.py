"""The strategy checkpoint: a plan written so that MindSpore loads it
(``strategy_ckpt_config={"load_file": ...}``) and autostrat reads it back as seeds.

``.ckpt`` files are MindSpore's protobuf, ``.json`` files MindSpore's JSON (see
`search.mindspore_checkpoint`): ``parallel_strategy_item`` names each forward op reading a
parameter MindSpore's way (``MatMul_dense1.weight``) with its strategy and pipeline stage, and
``parallel_layout_item`` gives each parameter's (and optimiser state's) layout: ``dev_matrix``,
``tensor_map``, ``tensor_shape`` and the optimiser-shard group (a dim over several device axes
as MindSpore writes it, `search.mindspore_layouts`; an op sharded by Layouts keeps the tuples
they imply, where MindSpore writes an empty item it cannot load back). The JSON adds, under
``autostrat``, every op of the plan by its own name with its out-strategy and stage (backward
and update ops too: ``bprop/...``, ``optimizer/...``), which MindSpore ignores and autostrat reads
first, so a plan reloads exactly; `seeds_by_phase` sorts them so that the forward ones seed the
traced graph while the others are only checked by name against the training graph built from
it. Files written before this format (``parallel_strategy_item`` as that list) still load."""

from __future__ import annotations

import json
from pathlib import Path

from autostrat.autodiff import PHASES, op_phase
from autostrat.errors import AutostratError, ConfigError
from autostrat.reading import read_json
from autostrat.layout import DeviceMatrix, Layout, TensorMap
from autostrat.layout.named import as_named, layout_entry
from autostrat.search.mindspore_checkpoint import encode, mindspore_names
from autostrat.search.mindspore_layouts import expanded, protobuf_tensor_maps
from autostrat.search.optimizer_shard import update_layout


def _dims(values) -> list[dict]:
    return [{"dim": list(value)} for value in values]


def _mindspore_layout(layout) -> dict:
    """`layout`'s device matrix and tensor map as MindSpore writes them (`layout_entry`), with
    the axes of size 1 left out (MindSpore's ``[2, 4]`` where autostrat's MatMul has ``[2, 1, 4]``)."""
    shape = layout.device_matrix.shape
    kept = [axis for axis in range(len(shape)) if shape[len(shape) - 1 - axis] > 1]  # counted from the right
    renumber = {axis: index for index, axis in enumerate(kept)}
    entries = tuple(tuple(renumber[axis] for axis in entry if axis in renumber) or -1
                    for entry in layout.tensor_map.entries)
    matrix = DeviceMatrix(tuple(size for size in shape if size > 1) or (1,))
    return layout_entry(Layout(matrix, TensorMap(entries), layout.shape))


def strategy_items(plan) -> list[dict]:
    """Every op of `plan` by its own name: strategy, out-strategy when needed, pipeline stage."""
    items = []
    for name, op in plan.ops.items():
        body = {"stage": op_stage(plan, name), "parallel_strategy": _dims(op.strategy.to_tuples())}
        if op.strategy.out_tuples() is not None:
            body["out_strategy"] = _dims(op.strategy.out_tuples())
        if op.strategy.placement is not None:  # the axis order the tuples cannot say
            body["in_layout"] = [layout_entry(layout) for layout in op.strategy.input_layouts]
            if "out_strategy" in body:
                body["out_layout"] = [layout_entry(layout) for layout in op.strategy.output_layouts]
        items.append({"node_name": name, "parallel_strategys": body})
    return items


def _named(value, where: str):
    if not isinstance(value, list) or not all(isinstance(v, dict) and isinstance(v.get("device_matrix"), list)
                                              and isinstance(v.get("tensor_map"), list) for v in value):
        raise ConfigError(f"{where}: expected a list of {{\"device_matrix\": [...], \"tensor_map\": [...]}}, got {value!r}")
    try:
        return tuple(as_named(tuple(v["device_matrix"]), v["tensor_map"]) for v in value)
    except (AutostratError, TypeError, KeyError) as error:
        raise ConfigError(f"{where}: {error}") from None


def op_stage(plan, name: str) -> int:
    return plan.pipeline.op_stages.get(name, 0) if plan.pipeline else 0  # an op every stage runs: 0


def _parameter_layouts(plan):
    """Per parameter and optimiser state, by name: its layout as MindSpore writes it
    (`_mindspore_layout`), its `Layout`, and its optimiser-shard ``(step, size)``."""
    for tensor in sorted(plan.graph.parameters(), key=lambda t: t.name):
        layout = plan.layouts[tensor.name]
        group = optimizer_shard_group(layout, update_layout(plan.optimizer_shard, layout, tensor.dtype))
        yield tensor.name, _mindspore_layout(layout), layout, group


def layout_items(plan) -> dict[str, dict]:
    """MindSpore's ``parallel_layout_item`` of every parameter and optimiser state, by name
    (plus ``slice_shape``, one device's piece, for re-slicing tools); a dim over several axes
    is cut into sub-dims, as MindSpore writes it (`mindspore_layouts.expanded`)."""
    layouts = {}
    for name, mindspore, layout, (step, size) in _parameter_layouts(plan):
        tensor_map, tensor_shape = expanded(mindspore["device_matrix"], mindspore["tensor_map"], layout.shape)
        layouts[name] = {"dev_matrix": mindspore["device_matrix"], "field": 0, "opt_weight_shard_size": size,
                         "opt_weight_shard_step": step, "tensor_map": tensor_map,
                         "tensor_shape": tensor_shape, "slice_shape": list(layout.slice_shape)}
    return layouts


def mindspore_items(plan) -> dict[str, dict]:
    """MindSpore's ``parallel_strategy_item``: each forward op reading a parameter, by
    MindSpore's name, with its strategy and stage."""
    return {ms_name: {"parallel_strategy": [list(part) for part in plan.ops[name].strategy.to_tuples()],
                      "stage": op_stage(plan, name)}
            for name, ms_name in mindspore_names(plan.graph).items()}


def protobuf_fields(plan) -> dict:
    """The ``ParallelStrategyMap`` message of `plan` as `mindspore_checkpoint.encode` takes it."""
    strategies = [{"node_name": name, "parallel_strategys": [{"stage": item["stage"], "parallel_strategy": [
        {"dim": part} for part in item["parallel_strategy"]]}]} for name, item in sorted(mindspore_items(plan).items())]
    layouts = [{"param_name": name, "parallel_layouts": [{
        "dev_matrix": [{"dim": mindspore["device_matrix"]}], "tensor_map": protobuf_tensor_maps(mindspore["tensor_map"]),
        "param_split_shape": [{}], "indices_offset": [{}], "field": 0,
        "opt_weight_shard_step": step, "opt_weight_shard_size": size}]}
        for name, mindspore, _, (step, size) in _parameter_layouts(plan)]
    return {"current_stage": 1, "parallel_strategy_item": strategies, "parallel_layout_item": layouts}


def checkpoint_dict(plan) -> dict:
    """The JSON strategy checkpoint of `plan` as plain data: MindSpore's, plus ``autostrat``.

    Example (MindSpore's tutorial FFN, seeded as the tutorial does):
        >>> from autostrat.models import tutorial_plan
        >>> data = checkpoint_dict(tutorial_plan())
        >>> data["parallel_strategy_item"]["MatMul_dense1.weight"]
        {'parallel_strategy': [[2, 1], [1, 4]], 'stage': 0}
        >>> data["parallel_layout_item"]["dense1.weight"]["tensor_map"], len(data["autostrat"]["parallel_strategy_item"])
        ([-1, 0], 5)
    """
    return {"current_stage": 1, "parallel_layout_item": layout_items(plan),
            "parallel_strategy_item": mindspore_items(plan),
            "autostrat": {"device_num": plan.device_num, "parallel_strategy_item": strategy_items(plan)}}


def checkpoint_bytes(plan, path) -> bytes:
    """The strategy checkpoint file of `plan` for `path`: protobuf for ``.ckpt``, else JSON."""
    if Path(path).suffix == ".ckpt":
        return encode(protobuf_fields(plan))
    return (json.dumps(checkpoint_dict(plan), indent=1, sort_keys=True) + "\n").encode()


def optimizer_shard_group(stored, updated) -> tuple[int, int]:
    """MindSpore's ``(opt_weight_shard_step, opt_weight_shard_size)`` of a parameter stored in
    `stored` and updated in `updated`: how many of its replicas split its optimiser work, and
    the rank distance between neighbours of such a group; ``(0, 0)`` when not split.

    Example (a weight replicated on 8 devices, its update split over the 4 inner ones):
        >>> from autostrat.layout import DeviceMatrix, Layout, TensorMap
        >>> whole = Layout(DeviceMatrix((2, 4)), TensorMap((-1, -1)), (64, 8))
        >>> optimizer_shard_group(whole, Layout(DeviceMatrix((2, 4)), TensorMap((0, -1)), (64, 8)))
        (1, 4)
    """
    if updated.slice_shape == stored.slice_shape:
        return 0, 0
    size = stored.slice_shape[0] // updated.slice_shape[0]
    home, part = stored.shard_index(0), updated.shard_index(0)
    step = next(rank for rank in range(1, stored.device_num)
                if stored.shard_index(rank) == home and updated.shard_index(rank) != part)
    return step, size


def _strategy(value, where: str):
    if not isinstance(value, list) or not all(isinstance(v, dict) and isinstance(v.get("dim"), list) for v in value):
        raise ConfigError(f"{where}: expected a list of {{\"dim\": [...]}}, got {value!r}")
    return tuple(tuple(v["dim"]) for v in value)


def load_checkpoint_seeds(path) -> dict[str, tuple]:
    """Seeds ``{op name: (in_strategy, out_strategy)}`` from a strategy checkpoint file. Only
    ``parallel_strategy_item`` is read, so files with or without layout ``shape`` load alike.

    Example:
        >>> import tempfile, pathlib
        >>> path = pathlib.Path(tempfile.mkdtemp()) / "ckpt.json"
        >>> _ = path.write_text('{"parallel_strategy_item": [{"node_name": "relu", '
        ...     '"parallel_strategys": {"stage": 0, "parallel_strategy": [{"dim": [8, 1]}]}}]}')
        >>> load_checkpoint_seeds(path)
        {'relu': (((8, 1),), None)}
    """
    path = Path(path)
    data = read_json(path, "strategy checkpoint")
    items = data.get("parallel_strategy_item") if isinstance(data, dict) else None
    if isinstance(data, dict) and isinstance(data.get("autostrat"), dict):
        items = data["autostrat"].get("parallel_strategy_item")
    if not isinstance(items, list):
        raise ConfigError(f"{path}: expected a JSON object with a 'parallel_strategy_item' list")
    seeds = {}
    for index, item in enumerate(items):
        where = f"{path}: parallel_strategy_item[{index}]"
        if not isinstance(item, dict) or not isinstance(item.get("node_name"), str) or not isinstance(item.get("parallel_strategys"), dict):
            raise ConfigError(f"{where}: expected {{\"node_name\": ..., \"parallel_strategys\": {{...}}}}")
        body = item["parallel_strategys"]
        out = body.get("out_strategy")
        seeds[item["node_name"]] = (
            _strategy(body.get("parallel_strategy"), f"{where}.parallel_strategys.parallel_strategy"),
            None if out is None else _strategy(out, f"{where}.parallel_strategys.out_strategy"),
        )
        if "in_layout" in body:
            out = body.get("out_layout")
            seeds[item["node_name"]] = (_named(body["in_layout"], f"{where}.parallel_strategys.in_layout"),
                                        None if out is None else _named(out, f"{where}.parallel_strategys.out_layout"))
    return seeds


def seeds_by_phase(seeds: dict) -> dict[str, dict]:
    """`seeds` grouped by the part of a training step their op belongs to (`op_phase`).

    Example:
        >>> seeds_by_phase({"relu": 1, "bprop/relu/relu_grad": 2, "optimizer/w": 3})
        {'forward': {'relu': 1}, 'backward': {'bprop/relu/relu_grad': 2}, 'update': {'optimizer/w': 3}}
    """
    grouped: dict[str, dict] = {phase: {} for phase in PHASES}
    for name, seed in seeds.items():
        grouped[op_phase(name)][name] = seed
    return grouped
