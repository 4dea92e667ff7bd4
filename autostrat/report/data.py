"""What a plan's report shows, as plain data: the HTML page embeds it as JSON and draws the op
graph from it; `charts` draws the charts from the same data.

- `summary`: devices, the device matrices ops use, predicted step time, bytes and time per
  phase, peak memory per device against the budget, search time, the solver's status and gap;
- `groups` and `ops`: the op graph. Ops are grouped by layer (``blocks.3``, backward and update
  ops with the forward op they derive from) or, outside repeated layers, by their top cell
  (``embedding``); each op has a column (its depth among its group's ops) and a row, its
  strategy, layouts, origin and the bytes of every redistribution into it;
- `edges`: op-to-op data edges with the bytes their redistribution sends per device;
- `layer_bytes`: bytes per device per group and phase; `memory`: the bytes a device holds over
  one step; `device_traffic`: bytes per step between every pair of devices (drawn, not embedded);
- `measured`: after a run, the bytes each rank sent and its peak, next to the prediction.
"""

from __future__ import annotations

import re
from collections import Counter

import numpy as np

from autostrat.autodiff import op_phase
from autostrat.cost.lower_bound import MATMUL_OP_TYPES
from autostrat.autodiff import forward_name
from autostrat.plan_diff import layer_of, OTHER
from autostrat.report.alternatives import local_alternatives
from autostrat.search.buffers import memory_over_step
from autostrat.search.prediction import format_nanoseconds

# Strategies of the most ops get their own colour, the rest share grey (`PALETTE` order).
PALETTE = ("#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#ff9da7", "#9c755f",
           "#86bcb6", "#d37295", "#8cd17d")
OTHER_COLOUR = "#bab0ac"


def group_of(name: str) -> str:
    """The group an op is drawn in: its repeated layer, else its forward op's top cell.

    Example:
        >>> group_of("bprop/blocks.3.ffn1.matmul/mat_mul"), group_of("lm_head.matmul"), group_of("relu")
        ('blocks.3', 'lm_head', 'relu')
    """
    layer = layer_of(name)
    if layer != OTHER:
        return layer
    return re.split(r"[./]", forward_name(name), maxsplit=1)[0]


# The report ranks every op's alternatives up to this many ops, then matmul-family ops' only, and
# none past `ALTERNATIVES_DEVICES` devices: the ranking plans a redistribution per candidate and
# edge, and on a thousand devices one such plan can take a second. `autostrat explain` ranks any op's.
ALTERNATIVES_FOR_ALL = 4000
ALTERNATIVES_DEVICES = 64


def report_data(plan, search_seconds: float | None = None, budget: int | None = None, measured: dict | None = None,
                bounds=None) -> dict:
    """The report of `plan` as JSON-ready data (see the module docstring). `bounds`: the
    plan's `search.bounds.PlanBounds`, when known; `measured`: a run's figures
    (`runtime.report.RunCheck.measured`).

    Example:
        >>> from autostrat.models import tutorial_plan
        >>> data = report_data(tutorial_plan())
        >>> [group["name"] for group in data["groups"]], data["summary"]["bytes"]
        (['dense1', 'relu', 'dense2'], 6144)
    """
    ops, groups = _ops(plan, bounds)
    return {
        "summary": _summary(plan, search_seconds, budget, bounds),
        "groups": groups,
        "ops": ops,
        "edges": _edges(plan),
        "legend": _legend(ops),
        "layer_bytes": _layer_bytes(plan),
        "memory": _memory(plan, budget),
        "measured": measured,
    }


def _summary(plan, search_seconds, budget, bounds) -> dict:
    prediction = plan.prediction
    matrices = Counter(str(op.strategy.device_matrix) for op in plan.ops.values())
    refinement = plan.refinement
    return {
        "graph": plan.graph.name,
        "mode": plan.mode,
        "devices": plan.device_num,
        "device_matrices": [[matrix, count] for matrix, count in matrices.most_common(4)],
        "ops": len(plan.ops),
        "step_time": format_nanoseconds(prediction.step_time_ns),
        "compute": format_nanoseconds(prediction.compute_ns),
        "communication": format_nanoseconds(prediction.communication_ns),
        "phases": [[name, phase.bytes, format_nanoseconds(phase.communication_ns), format_nanoseconds(phase.compute_ns)]
                   for name, phase in prediction.phases.items()],
        "bytes": plan.total_bytes,
        "peak": prediction.peak_bytes,
        "budget": budget,
        "search_seconds": None if search_seconds is None else round(search_seconds, 2),
        "solver": None if refinement is None else {
            "status": refinement.result.status, "gap": refinement.result.gap, "before": refinement.before,
            "after": refinement.result.objective, "bound": refinement.result.bound, "unit": refinement.unit,
            "changed": len(refinement.changed), "seconds": round(refinement.result.seconds, 2)},
        "lower_bound": None if bounds is None else bounds.line,
        "warnings": list(plan.warnings),
        "cost_model": plan.cost_model,
        "precision": plan.precision,
    }


# The bands of a group's drawing, top to bottom (`autodiff.op_phase`).
BANDS = ("forward", "backward", "update")


def _ops(plan, bounds) -> tuple[list[dict], list[dict]]:
    graph = plan.graph
    group = {name: group_of(name) for name in plan.ops}
    group_index = {name: number for number, name in enumerate(dict.fromkeys(group.values()))}
    edges = {(edge.consumer, edge.input_index): edge for edge in plan.redistributions}
    bytes_in = Counter()
    for (consumer, _), edge in edges.items():
        bytes_in[consumer] += edge.cost
    ratio = {} if bounds is None else {bound.op: bound for bound in bounds.ops}
    columns, rows = _grid(plan, group)
    alternatives = local_alternatives(plan, [name for name in plan.ops if _ranks_alternatives(plan, name)])
    ops = []
    for name, op in plan.ops.items():
        node = graph.ops[name]
        ops.append({
            "name": name, "type": op.op_type, "strategy": str(op.strategy), "origin": op.origin,
            "group": group_index[group[name]], "column": columns[name], "row": rows[name], "phase": op_phase(name),
            "inputs": [_input(plan, tensor, edges.get((name, i)), op.strategy.input_layouts[i])
                       for i, tensor in enumerate(node.inputs)],
            "outputs": [{"tensor": tensor, "layout": str(plan.layouts[tensor])} for tensor in node.outputs],
            "bytes_in": bytes_in[name],
        } | _bound(ratio.get(name)) | _alternatives(alternatives.get(name)))
    members: dict[int, list[int]] = {}
    for number, op in enumerate(ops):
        members.setdefault(op["group"], []).append(number)
    groups = [{"name": name, "ops": members[number], "bytes_in": sum(ops[i]["bytes_in"] for i in members[number])}
              for name, number in group_index.items()]
    return ops, groups


def _grid(plan, group: dict[str, str]) -> tuple[dict[str, int], dict[str, int]]:
    """Each op's column and row inside its group's drawing (`group`: op -> its group): one band
    per phase (`BANDS`), and in a band the column is the op's depth among the band's ops of its
    group, so data flows left to right; update ops, which read no update op, stand in one row."""
    graph = plan.graph
    phase = {name: op_phase(name) for name in plan.ops}
    depth: dict[str, int] = {}
    slot: Counter = Counter()  # (group, phase) -> ops placed so far, for the update row
    row_in_band: dict[str, int] = {}
    taken: Counter = Counter()  # (group, phase, column) -> rows used
    for name in plan.ops:
        band = (group[name], phase[name])
        if phase[name] == "update":
            depth[name] = slot[band]
            slot[band] += 1
        else:
            producers = (graph.tensors[t].producer for t in graph.ops[name].inputs)
            depth[name] = 1 + max((depth[p] for p in producers if p and (group[p], phase[p]) == band), default=-1)
        row_in_band[name] = taken[(*band, depth[name])]
        taken[(*band, depth[name])] += 1
    height: Counter = Counter()  # (group, phase) -> rows of its band
    for (name, band_phase, _), used in taken.items():
        height[(name, band_phase)] = max(height[(name, band_phase)], used)
    rows = {name: row_in_band[name] + sum(height[(group[name], above)] for above in BANDS[:BANDS.index(phase[name])])
            for name in plan.ops}
    return depth, rows


def _input(plan, tensor: str, edge, wanted) -> dict:
    info = plan.graph.tensors[tensor]
    entry = {"tensor": tensor, "shape": list(info.shape), "dtype": info.dtype, "kind": info.kind, "wanted": str(wanted)}
    if edge is None:
        return entry
    entry |= {"held": str(plan.layouts[tensor]), "bytes": edge.cost}
    if edge.shares:
        entry["shares"] = f"{edge.shares[0]}[{edge.shares[1]}]"
    else:
        entry["steps"] = [str(step) for step in edge.plan.steps]
    return entry


def _ranks_alternatives(plan, op: str) -> bool:
    if plan.pipeline is not None or plan.device_num > ALTERNATIVES_DEVICES:
        return False
    return len(plan.ops) <= ALTERNATIVES_FOR_ALL or plan.ops[op].op_type in MATMUL_OP_TYPES


def _alternatives(ranked) -> dict:
    if ranked is None:
        return {}
    return {"alternatives": [{"strategy": strategy, "delta_bytes": change} for strategy, change in ranked]}


def _bound(bound) -> dict:
    if bound is None:
        return {}
    return {"bound_bytes": bound.bound.bytes, "bound_ratio": bound.ratio, "charged": bound.charged}


def _edges(plan) -> list[list]:
    """``[producer, consumer, bytes, tensor]`` per op-to-op data edge, ops by their index."""
    index = {name: number for number, name in enumerate(plan.ops)}
    costs = {(edge.consumer, edge.input_index): edge.cost for edge in plan.redistributions}
    found = []
    for name, node in plan.graph.ops.items():
        for number, tensor in enumerate(node.inputs):
            producer = plan.graph.tensors[tensor].producer
            if producer is not None:
                found.append([index[producer], index[name], costs.get((name, number), 0), tensor])
    return found


def _legend(ops: list[dict]) -> list[list]:
    """``[strategy, colour, ops using it]``, the most used first; strategies past the palette share grey."""
    counts = Counter(op["strategy"] for op in ops)
    ordered = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
    return [[strategy, PALETTE[n] if n < len(PALETTE) else OTHER_COLOUR, count]
            for n, (strategy, count) in enumerate(ordered)]


def _layer_bytes(plan) -> list[list]:
    """``[group, {phase: bytes}]`` in graph order: redistributions by their consumer's group,
    writebacks by their parameter's."""
    found: dict[str, Counter] = {group_of(name): Counter() for name in plan.ops}
    for edge in plan.redistributions:
        if edge.cost:
            found[group_of(edge.consumer)][plan.edge_phase(edge)] += edge.cost
    for writeback in plan.writebacks:
        found.setdefault(group_of(writeback.parameter), Counter())["update"] += writeback.plan.cost
    return [[group, dict(phases)] for group, phases in found.items()]


def _memory(plan, budget) -> dict:
    steps = memory_over_step(plan)
    return {"bytes": [high for _, high in steps], "phases": [op_phase(op) if op else "" for op, _ in steps],
            "peak": plan.prediction.peak_bytes, "budget": budget}


def device_traffic(plan) -> np.ndarray:
    """Bytes per step device `i` is predicted to send device `j` (row `i`, column `j`), over every
    redistribution and writeback of `plan`, as the runtime moves them (`runtime.wire`): in a ring
    collective (AllGather, ReduceScatter, AllReduce) every member sends its bytes to the next
    member of its group; in an AllToAll it sends them in equal parts to the g - 1 others; a
    CollectivePermute sends to the rank that takes its piece. (An AllReduce whose group size
    does not divide the piece is drawn at its busiest member's bytes.) After a run, the report
    draws the bytes counted at the send calls instead (`RunCheck.measured["traffic"]`).

    Example (the tutorial FFN: one ring ReduceScatter over the 4 devices of each model-parallel group):
        >>> from autostrat.models import tutorial_plan
        >>> traffic = device_traffic(tutorial_plan())
        >>> traffic.sum(axis=1).tolist()[:2], traffic[0].tolist()
        ([6144.0, 6144.0], [0.0, 6144.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0])
    """
    traffic = np.zeros((plan.device_num, plan.device_num))
    for plan_steps in [edge.plan.steps for edge in plan.redistributions if not edge.shares] + [
            writeback.plan.steps for writeback in plan.writebacks]:
        for step in plan_steps:
            if not step.bytes:
                continue
            if step.sources:
                senders = np.array(step.sources)
                moved = senders != np.arange(len(senders))
                np.add.at(traffic, (senders[moved], np.flatnonzero(moved)), step.bytes)
                continue
            members = np.array(step.groups)
            g = members.shape[1]
            if step.kind == "AllToAll":
                for shift in range(1, g):
                    np.add.at(traffic, (members, np.roll(members, -shift, axis=1)), step.bytes / (g - 1))
            elif g > 1:
                np.add.at(traffic, (members, np.roll(members, -1, axis=1)), step.bytes)
    return traffic
