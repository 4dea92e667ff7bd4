"""The plan report: one self-contained HTML file (no network needed to view it), and the same
charts as PNG files.

The page has the summary (rendered here), the op graph (drawn in the browser by ``page.js``
from the report data embedded as JSON, groups collapsed until opened), the charts as inline SVG
(`charts`), and the ops above 1.5x their communication lower bound.
"""

from __future__ import annotations

import html
import json
from importlib import resources
from pathlib import Path

import numpy as np

from autostrat.io import write_files_atomically
from autostrat.report import charts as drawing
from autostrat.report.data import device_traffic, report_data
from autostrat.search.bounds import plan_bounds
from autostrat.search.precision import PRECISION_MEMORY

CHART_TITLES = {
    "bytes_per_layer": "Bytes per layer: the redistributions into each layer's ops (by phase) and its writebacks.",
    "memory": "Memory over the step: bytes one device holds after each instruction; the dotted line is the peak.",
    "device_traffic": "Bytes between every pair of devices in one step: predicted by the plan, or after autostrat run "
                      "counted at each rank's send calls.",
    "measured": "After autostrat run: predicted next to measured, for the rank with the most.",
}


def write_report(plan, path, png_dir=None, search_seconds: float | None = None, budget: int | None = None,
                 measured: dict | None = None) -> list[Path]:
    """Write `plan`'s report to `path` (and, with `png_dir`, its charts as PNG files there), all
    or nothing; returns the paths written.

    Example:
        >>> import tempfile, pathlib
        >>> from autostrat.models import tutorial_plan
        >>> plan = tutorial_plan()
        >>> folder = pathlib.Path(tempfile.mkdtemp())
        >>> [p.name for p in write_report(plan, folder / "plan.html", png_dir=folder / "png")]
        ['plan.html', 'bytes_per_layer.png', 'memory.png', 'device_traffic.png']
    """
    return write_files_atomically(report_files(plan, path, png_dir, search_seconds, budget, measured))


def report_files(plan, path, png_dir=None, search_seconds: float | None = None, budget: int | None = None,
                 measured: dict | None = None) -> dict[Path, str | bytes]:
    """`write_report`'s files by path, not yet written (the CLI writes them with its other outputs)."""
    bounds = plan_bounds(plan)
    data = report_data(plan, search_seconds, budget, measured, bounds)
    figures = drawing.charts(data, measured_traffic(measured) if measured and "traffic" in measured else device_traffic(plan))
    try:
        files = {Path(path): page(data, {stem: drawing.svg_text(figure) for stem, figure in figures.items()}, bounds)}
        if png_dir is not None:
            files |= {Path(png_dir) / f"{stem}.png": drawing.png_bytes(figure) for stem, figure in figures.items()}
    finally:
        drawing.close(figures)
    return files


def measured_traffic(measured: dict):
    """The bytes per step each rank sent each rank in a run (`RunCheck.measured["traffic"]`),
    as a matrix like `data.device_traffic`.

    Example:
        >>> measured_traffic({"traffic": [[0, 8], [4, 0]]}).tolist()
        [[0.0, 8.0], [4.0, 0.0]]
    """
    return np.array(measured["traffic"], np.float64)


def page(data: dict, svgs: dict[str, str], bounds) -> str:
    """The HTML text of the report (`data` from `report_data`, charts as inline SVG by stem)."""
    summary = data["summary"]
    title = f"{summary['graph']} on {summary['devices']} devices"
    script = resources.files(__package__).joinpath("page.js").read_text()
    style = resources.files(__package__).joinpath("page.css").read_text()
    # "</" inside the JSON would end the script element early: escape every "<".
    embedded = json.dumps(data, separators=(",", ":")).replace("<", "\\u003c")
    figures = "".join(f'<figure id="chart-{stem}">{svg}<figcaption>{html.escape(CHART_TITLES[stem])}</figcaption></figure>'
                      for stem, svg in svgs.items())
    return (
        f'<!doctype html>\n<html lang="en"><head><meta charset="utf-8">'
        f'<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>autostrat plan: {html.escape(title)}</title><style>{style}</style></head><body>"
        f'<header><h1>autostrat plan: {html.escape(title)}</h1><p class="sub">{html.escape(summary["mode"])}, '
        f'{summary["ops"]:,} ops, cost model {html.escape(summary["cost_model"])}{_precision(summary)}</p></header>'
        f'<div id="errors" hidden></div><main>'
        f'<section id="summary"><div class="cards">{_cards(summary)}</div>{_bound_line(summary)}{_warnings(summary)}</section>'
        f'<section id="graph-section"><h2>Op graph</h2>'
        f'<div class="toolbar"><input id="find" placeholder="find an op by name" aria-label="find an op">'
        f'<button id="expand">open all layers</button><button id="collapse">close all</button>'
        f'<span class="muted">a layer opens on a click; an op shows its strategy on a click; red edges move bytes '
        f"(the wider, the more)</span></div>"
        f'<div class="legend" id="legend"></div>'
        f'<div class="graph-wrap"><div id="graph"></div><aside id="details">Click an op.</aside></div></section>'
        f'<section id="charts-section"><h2>Charts</h2><div class="charts">{figures}</div></section>'
        f"{_flagged(bounds)}</main>"
        f'<script type="application/json" id="plan-data">{embedded}</script><script>{script}</script></body></html>\n'
    )


def _card(label: str, value: str, extra: str = "") -> str:
    return f'<div class="card"><div class="label">{html.escape(label)}</div><div class="value">{value}</div>{extra}</div>'


def _cards(summary: dict) -> str:
    matrices = ", ".join(f"{matrix} ({count} ops)" for matrix, count in summary["device_matrices"])
    # A forward plan has no backward, sync or update phase to show (as `Prediction.lines`).
    phases = "".join(f"<tr><td>{html.escape(name)}</td><td>{size:,} B</td><td>{html.escape(comm)}</td></tr>"
                     for name, size, comm, compute in summary["phases"] if (size, comm, compute) != (0, "0 ns", "0 ns"))
    cards = [
        _card("devices", f"{summary['devices']:,}", f'<div class="muted">device matrices: {html.escape(matrices)}</div>'),
        _card("predicted step time", html.escape(summary["step_time"]),
              f'<div class="muted">compute {html.escape(summary["compute"])} + communication '
              f'{html.escape(summary["communication"])}</div>'),
        _card("bytes per device per step", f"{summary['bytes']:,}",
              f'<table><tr><th>phase</th><th>bytes</th><th>time</th></tr>{phases}</table>'),
        _card("peak memory per device", drawing.format_bytes(summary["peak"]), _budget(summary)),
    ]
    searched = "not recorded" if summary["search_seconds"] is None else f"{summary['search_seconds']:.2f} s"
    solver = summary["solver"]
    if solver is None:
        cards.append(_card("search", searched, '<div class="muted">propagation only: no solver</div>'))
    else:
        cards.append(_card("search", searched,
                           f'<div class="muted">CP-SAT {html.escape(solver["status"])}, gap {solver["gap"]:.2%}, '
                           f'{solver["before"]:,} → {solver["after"]:,} {html.escape(solver["unit"])}, bound '
                           f'{solver["bound"]:,}, {solver["changed"]} op(s) changed, {solver["seconds"]:.2f} s</div>'))
    return "".join(cards)


def _budget(summary: dict) -> str:
    if not summary["budget"]:
        return '<div class="muted">no max_device_memory set</div>'
    share = summary["peak"] / summary["budget"]
    over = " over" if share > 1 else ""
    return (f'<div class="muted">{share:.0%} of the budget {drawing.format_bytes(summary["budget"])}</div>'
            f'<div class="meter"><i class="{over.strip()}" style="width:{min(share, 1):.1%}"></i></div>')


def _precision(summary: dict) -> str:
    """The header's note of a 16-bit precision (fp32, the default, goes unsaid)."""
    precision = summary["precision"]
    return "" if precision == "fp32" else f", precision {html.escape(precision)} (memory: {html.escape(PRECISION_MEMORY)})"


def _bound_line(summary: dict) -> str:
    return f'<p class="bound" id="lower-bound">{html.escape(summary["lower_bound"])}</p>' if summary["lower_bound"] else ""


def _warnings(summary: dict) -> str:
    if not summary["warnings"]:
        return ""
    items = "".join(f"<li>{html.escape(warning)}</li>" for warning in summary["warnings"])
    return f'<details class="warnings"><summary>{len(summary["warnings"])} warning(s)</summary><ul>{items}</ul></details>'


def _flagged(bounds) -> str:
    flagged = bounds.flagged
    if not flagged:
        return ('<section id="flagged-section"><h2>Lower bound</h2><p>No matmul-family op sends more than 1.5× its '
                "lower bound.</p></section>")
    rows = "".join(f'<tr><td><a href="#" data-find="{html.escape(b.op)}">{html.escape(b.op)}</a></td>'
                   f'<td class="n">{b.charged:,}</td><td class="n">{b.bound.bytes:,.0f}</td><td class="n">{b.ratio:.2f}×</td></tr>'
                   for b in flagged)
    return (f'<section id="flagged-section"><h2>Ops above 1.5× their lower bound ({len(flagged)})</h2>'
            f'<table class="plain"><tr><th>op</th><th>bytes charged</th><th>lower bound</th><th>ratio</th></tr>{rows}'
            f"</table></section>")
