"""Human-facing text: aligned tables of strategies and layouts."""

from __future__ import annotations

from autostrat.layout import Strategy
from autostrat.tables import format_table
from autostrat.rules import Rule


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
