"""The strategy checkpoint: a plan's strategies and parameter layouts as JSON with MindSpore's
keys (``parallel_strategy_item``, ``parallel_layout_item``, ``dev_matrix``, ``tensor_map``,
``shape``, ``slice_shape``...), and reading one back as seeds (`strategy_ckpt_load_file`).

A training plan's checkpoint also names its backward and update ops (``bprop/...``,
``optimizer/...``); `seeds_by_phase` sorts them so that the forward ones seed the traced graph
while the others are only checked by name against the training graph built from it."""

from __future__ import annotations

import json
from pathlib import Path

from autostrat.autodiff import PHASES, op_phase
from autostrat.errors import ConfigError
from autostrat.io import read_json
from autostrat.search.optimizer_shard import update_layout


def _dims(values) -> list[dict]:
    return [{"dim": list(value)} for value in values]


def _tensor_map(layout) -> list:
    # MindSpore writes one axis per dim (-1 = not split); a dim over several axes is a list.
    return [-1 if not entry else entry[0] if len(entry) == 1 else list(entry) for entry in layout.tensor_map.entries]


def checkpoint_dict(plan) -> dict:
    """The checkpoint of `plan` as plain data."""
    strategies = []
    for name, op in plan.ops.items():
        stage = plan.pipeline.op_stages.get(name, 0) if plan.pipeline else 0  # an op every stage runs: 0
        item = {"node_name": name, "parallel_strategys": {"stage": stage, "parallel_strategy": _dims(op.strategy.to_tuples())}}
        if op.strategy.out_tuples() is not None:
            item["parallel_strategys"]["out_strategy"] = _dims(op.strategy.out_tuples())
        strategies.append(item)
    layouts = []
    for tensor in plan.graph.parameters():
        layout = plan.layouts[tensor.name]
        step, size = optimizer_shard_group(layout, update_layout(plan.optimizer_shard, layout, tensor.dtype))
        layouts.append({
            "param_name": tensor.name,
            "parallel_layouts": {
                "dev_matrix": [{"dim": list(layout.device_matrix.shape)}],
                "tensor_map": [{"dim": _tensor_map(layout)}],
                "shape": [{"dim": list(layout.shape)}],  # the whole parameter, which a re-slicing tool needs
                "slice_shape": [{"dim": list(layout.slice_shape)}],
                "field": 0,
                "opt_weight_shard_step": step,
                "opt_weight_shard_size": size,
            },
        })
    return {"device_num": plan.device_num, "parallel_strategy_item": strategies, "parallel_layout_item": layouts}


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


def checkpoint_json(plan) -> str:
    return json.dumps(checkpoint_dict(plan), indent=1) + "\n"


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
