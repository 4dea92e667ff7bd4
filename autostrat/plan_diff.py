"""`autostrat diff A.json B.json`: how two plans of one model differ.

- the ops whose strategies differ (an op's strategy is its tuples and, when its factors sit on
  the device axes in another order than the tuples say, its input layouts; its out-strategy,
  partial sums and parameters at rest), and the ops only one plan has;
- per phase (forward, backward, sync, update), the predicted bytes per device, communication
  and compute time of each plan and the difference;
- per layer (``blocks.3``; ops of no repeated layer are "(other)"), the bytes per device of the
  redistributions into the layer's ops and of the writebacks of its parameters, in all phases.

Plans are read from their JSON (`Plan.save`, ``autostrat search --out``); a `Plan` or its
`to_dict()` works from Python. Stays off the search's import path (it reads plans, never makes
them).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from autostrat.autodiff import forward_name
from autostrat.errors import ConfigError
from autostrat.reading import read_json
from autostrat.layout.strategy import format_tuples
from autostrat.tables import format_table

# The prefixes a training graph puts before a forward op's name (backward, sums, recompute, updates).
_LAYER = re.compile(r"^(.+?\.\d+)\.")
OTHER = "(other)"


def layer_of(name: str) -> str:
    """The repeated layer an op or tensor belongs to, training prefixes aside.

    Example:
        >>> layer_of("bprop/blocks.3.ffn1.matmul/mat_mul"), layer_of("optimizer/blocks.0.ln1.gamma"), layer_of("lm_head.matmul")
        ('blocks.3', 'blocks.0', '(other)')
    """
    match = _LAYER.match(forward_name(name))
    return match.group(1) if match else OTHER


def _strategy_text(op: dict) -> str:
    """The op's strategy from its plan JSON entry: tuples, out-strategy, order, partial sums, at rest."""
    text = format_tuples(op["strategy"])
    if "out_strategy" in op:
        text += f" out {format_tuples(op['out_strategy'])}"
    if "in_layout" in op:
        text += " on " + str(op["in_layout"][0]["device_matrix"]) + ": " + ", ".join(
            str(layout["tensor_map"]) for layout in op["in_layout"])
    if op.get("partial_sums"):
        text += " partial sums"
    if op.get("at_rest"):
        text += f" at rest sharded: input {', '.join(map(str, op['at_rest']))}"
    return text


def _plan_dict(plan, which: str) -> dict:
    if isinstance(plan, (str, Path)):
        plan = read_json(Path(plan), "plan")
    elif hasattr(plan, "to_dict"):
        plan = plan.to_dict()
    if not isinstance(plan, dict) or not all(key in plan for key in ("graph", "device_num", "ops", "redistributions")):
        raise ConfigError(f"plan {which}: expected a plan's JSON (autostrat search --out), with graph, device_num, ops and "
                          f"redistributions")
    _check_parts(plan, which)
    return plan


def _is_tuples(value) -> bool:
    return isinstance(value, list) and all(isinstance(operand, list) and all(
        isinstance(part, (int, str)) and not isinstance(part, bool) for part in operand) for operand in value)


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_records(value, **kinds) -> bool:
    """A list of objects, each with the keys of `kinds` holding values that pass their test."""
    return isinstance(value, list) and all(isinstance(item, dict) and all(
        key in item and test(item[key]) for key, test in kinds.items()) for item in value)


def _check_parts(plan: dict, which: str) -> None:
    """The parts of a plan's JSON a diff reads, each of its type; a `ConfigError` names the first
    that is not (a plan edited by hand, or another file)."""
    op_parts = {"strategy": _is_tuples, "out_strategy": _is_tuples, "at_rest": lambda v: isinstance(v, list), "ring_bytes": _is_number,
                "in_layout": lambda v: bool(v) and _is_records(v, device_matrix=lambda _: True, tensor_map=lambda _: True)}
    phases = plan.get("predicted", {}).get("phases", {}) if isinstance(plan.get("predicted"), dict) else None
    checks = {
        "graph": (isinstance(plan["graph"], str), "text"),
        "device_num": (isinstance(plan["device_num"], int), "an integer"),
        "ops": (_is_records(plan["ops"], name=lambda v: isinstance(v, str), strategy=_is_tuples) and all(
            test(op[key]) for op in plan["ops"] for key, test in op_parts.items() if key in op), "a list of ops with a name "
            "and strategy tuples (and, if any, out_strategy tuples, an in_layout list, an at_rest list and ring bytes)"),
        "redistributions": (_is_records(plan["redistributions"], consumer=lambda v: isinstance(v, str), bytes=_is_number),
                            "a list of objects with a consumer and bytes"),
        "writebacks": (_is_records(plan.get("writebacks", []), parameter=lambda v: isinstance(v, str), bytes=_is_number),
                       "a list of objects with a parameter and bytes"),
        "predicted.phases": (isinstance(phases, dict) and all(isinstance(phase, dict) and all(
            _is_number(value) for value in phase.values()) for phase in phases.values()), "phases of numbers"),
    }
    for key, (passed, expected) in checks.items():
        if not passed:
            raise ConfigError(f"plan {which}: {key}: expected {expected}, as autostrat search --out writes it")


def _layer_bytes(plan: dict) -> dict[str, int]:
    found: dict[str, int] = {}
    for edge in plan["redistributions"]:
        found[layer_of(edge["consumer"])] = found.get(layer_of(edge["consumer"]), 0) + int(edge["bytes"])
    for writeback in plan.get("writebacks", []):
        found[layer_of(writeback["parameter"])] = found.get(layer_of(writeback["parameter"]), 0) + int(writeback["bytes"])
    for op in plan["ops"]:  # a ring strategy's op sends around its ring itself
        if "ring_bytes" in op:
            found[layer_of(op["name"])] = found.get(layer_of(op["name"]), 0) + int(op["ring_bytes"])
    return found


@dataclass(frozen=True)
class PlanDiff:
    """Two plans side by side (see the module docstring); `text` is what ``autostrat diff`` prints."""

    graph: str
    devices: tuple[int, int]
    changed: tuple[tuple[str, str, str], ...]  # (op, A's strategy, B's strategy)
    only: tuple[tuple[str, ...], tuple[str, ...]]  # ops only A has, only B has
    phases: dict[str, tuple[dict, dict]]  # phase -> (A's, B's) {"bytes", "communication_ns", "compute_ns"}
    layers: dict[str, tuple[int, int]]  # layer -> (A's bytes, B's bytes)
    totals: tuple[int, int]

    @property
    def text(self) -> str:
        lines = [f"{self.graph}: A on {self.devices[0]} devices, B on {self.devices[1]}; "
                 f"{len(self.changed)} op(s) with another strategy"]
        if self.changed:
            lines.append(format_table(["op", "A", "B"], [list(row) for row in self.changed]))
        for label, names in zip(("only in A", "only in B"), self.only):
            if names:
                lines.append(f"{label}: {', '.join(names)}")
        rows = []
        for phase, (a, b) in self.phases.items():
            rows.append([phase, *(f"{side.get(key, 0):,}" for key in ("bytes", "communication_ns", "compute_ns") for side in (a, b)),
                         f"{b.get('bytes', 0) - a.get('bytes', 0):+,}"])
        lines.append(format_table(["phase", "A bytes", "B bytes", "A comm ns", "B comm ns", "A compute ns", "B compute ns",
                                   "B - A bytes"], rows))
        rows = [[layer, f"{a:,}", f"{b:,}", f"{b - a:+,}"] for layer, (a, b) in self.layers.items()]
        rows.append(["total", f"{self.totals[0]:,}", f"{self.totals[1]:,}", f"{self.totals[1] - self.totals[0]:+,}"])
        lines.append(format_table(["layer", "A bytes", "B bytes", "B - A"], rows))
        return "\n".join(lines)


def diff_plans(a, b) -> PlanDiff:
    """How plan `b` differs from plan `a` (each a JSON path, a `Plan`, or its `to_dict()`).

    Example (the tutorial FFN seeded two ways):
        >>> from autostrat.frontend import trace
        >>> from autostrat.models import FFN
        >>> from autostrat.nn import Tensor
        >>> from autostrat.search import search
        >>> def plan(seed):
        ...     net = FFN()
        ...     _ = net.dense1.matmul.shard(seed)
        ...     return search(trace(net, Tensor(shape=(64, 64)), device_num=8), 8)
        >>> diff = diff_plans(plan(((2, 1), (1, 4))), plan(((8, 1), (1, 1))))
        >>> diff.changed[0], diff.totals
        (('dense1.matmul', '((2, 1), (1, 4))', '((8, 1), (1, 1))'), (6144, 0))
    """
    a, b = _plan_dict(a, "A"), _plan_dict(b, "B")
    if a["graph"] != b["graph"]:
        raise ConfigError(f"diff: plan A is of graph {a['graph']!r}, plan B of {b['graph']!r}; a diff compares two plans "
                          f"of one model")
    ops_a, ops_b = ({op["name"]: op for op in plan["ops"]} for plan in (a, b))
    changed = tuple((name, _strategy_text(op), _strategy_text(ops_b[name])) for name, op in ops_a.items()
                    if name in ops_b and _strategy_text(op) != _strategy_text(ops_b[name]))
    only = (tuple(n for n in ops_a if n not in ops_b), tuple(n for n in ops_b if n not in ops_a))
    phases_a, phases_b = (plan.get("predicted", {}).get("phases", {}) for plan in (a, b))
    phases = {phase: (phases_a.get(phase, {}), phases_b.get(phase, {})) for phase in dict.fromkeys([*phases_a, *phases_b])}
    layer_a, layer_b = _layer_bytes(a), _layer_bytes(b)
    order = sorted(set(layer_a) | set(layer_b), key=lambda name: (name == OTHER, _natural(name)))
    layers = {layer: (layer_a.get(layer, 0), layer_b.get(layer, 0)) for layer in order}
    totals = (sum(layer_a.values()), sum(layer_b.values()))
    return PlanDiff(a["graph"], (a["device_num"], b["device_num"]), changed, only, phases, layers, totals)


def _natural(name: str) -> tuple:
    """``blocks.10`` after ``blocks.9``."""
    return tuple(int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name))
