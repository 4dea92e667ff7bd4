"""Human-facing text: aligned tables of strategies and layouts."""

from __future__ import annotations

from autostrat.layout import Strategy
from autostrat.tables import format_table
from autostrat.rules import Rule, make_rule
from autostrat.strategies import generate_strategies, mesh_axes, split_values


def _shapes(shapes) -> str:
    return " ".join("[" + ", ".join(str(s) for s in shape) + "]" for shape in shapes)


def format_candidates(name: str, rule: Rule, strategies: tuple[Strategy, ...]) -> str:
    """One op's candidate strategies with their device matrix, tensor maps and slice shapes."""
    rows = []
    for strategy in strategies:
        outputs = strategy.output_layouts
        out_maps = " ".join(
            str(layout.tensor_map) + (f" partial{list(layout.partial)}" if layout.partial else "") for layout in outputs
        )
        rows.append([
            str(strategy),
            str(strategy.device_matrix),
            " ".join(str(layout.tensor_map) for layout in strategy.input_layouts),
            out_maps,
            _shapes(layout.slice_shape for layout in strategy.input_layouts)
            + " -> "
            + _shapes(layout.slice_shape for layout in outputs),
        ])
    title = f"{name}  {rule.op_type}  {rule}  ({len(strategies)} candidates)"
    headers = ["strategy", "device matrix", "input tensor maps", "output tensor map", "slice shapes per rank"]
    return title + "\n" + format_table(headers, rows, indent="  ")


# MindSpore's sharding-propagation tutorial FFN, x[64, 64] -> Dense(64, 64) -> ReLU -> Dense(64, 64),
# as the ops it traces to (the tutorial's own Dense: a MatMul with weight [in, out], and a BiasAdd).
TUTORIAL_FFN = (
    ("dense1.matmul", "MatMul", [(64, 64), (64, 64)]),
    ("dense1.bias_add", "BiasAdd", [(64, 64), (64,)]),
    ("relu", "ReLU", [(64, 64)]),
    ("dense2.matmul", "MatMul", [(64, 64), (64, 64)]),
    ("dense2.bias_add", "BiasAdd", [(64, 64), (64,)]),
)


def candidates_text(device_num: int, allow_repeated: bool = False) -> str:
    """Every op of the tutorial FFN with the candidate strategies a search on `device_num`
    devices weighs (on the "auto" logical mesh beyond 16 devices)."""
    axes = mesh_axes(device_num)
    on = "every divisor a split" if axes is None else f"mesh {' x '.join(map(str, axes))}"
    sections = [
        f"Candidate strategies of the MindSpore tutorial FFN on {device_num} devices, {on} "
        "(x[64, 64] -> Dense(64, 64) -> ReLU -> Dense(64, 64))"
    ]
    for name, op_type, shapes in TUTORIAL_FFN:
        rule = make_rule(op_type, shapes)
        options = generate_strategies(rule, device_num, allow_repeated, split_values(axes), axes)
        sections.append(format_candidates(name, rule, options))
    return "\n\n".join(sections)
