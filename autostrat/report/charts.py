"""The report's charts, drawn with matplotlib: inline SVG for the HTML page, PNG files for
terminals and papers (``autostrat report --png DIR``). One drawing serves both, so the page and
the files never disagree.

matplotlib is imported here only, and this module only by the report: `autostrat search`
never loads it.
"""

from __future__ import annotations

import io

import matplotlib

matplotlib.use("Agg")  # no display: files and strings only

import matplotlib.pyplot as plt  # noqa: E402  (after choosing the backend)
from matplotlib.ticker import FuncFormatter, MaxNLocator, MultipleLocator  # noqa: E402

PHASE_COLOURS = {"forward": "#4e79a7", "backward": "#f28e2b", "sync": "#59a14f", "update": "#b07aa1", "gather": "#e15759"}
STYLE = {"svg.hashsalt": "autostrat", "svg.fonttype": "none", "font.size": 9, "axes.spines.top": False,
         "axes.spines.right": False, "axes.titlesize": 10, "axes.titleweight": "bold"}


def format_bytes(value: float, _position=None) -> str:
    """Bytes in the largest binary unit that keeps them at least 1.

    Example:
        >>> format_bytes(512), format_bytes(6144), format_bytes(3 * 2**30)
        ('512 B', '6 KiB', '3 GiB')
    """
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(value) >= size:
            return f"{value / size:.3g} {unit}"
    return f"{value:.0f} B"


def byte_ticks(axis, largest: float) -> None:
    """Ticks at whole binary units (0, 4 KiB, 8 KiB...), at most 8 of them, labelled by `format_bytes`.

    Example:
        >>> figure, axes = plt.subplots()
        >>> byte_ticks(axes.yaxis, 18_000); axes.set_ylim(0, 18_000)
        (0.0, 18000.0)
        >>> [format_bytes(t) for t in axes.get_yticks() if 0 <= t <= 18_000]
        ['0 B', '4 KiB', '8 KiB', '12 KiB', '16 KiB']
        >>> plt.close(figure)
    """
    step = 1
    while largest / step > 8:
        step *= 2
    axis.set_major_locator(MultipleLocator(step))
    axis.set_major_formatter(FuncFormatter(format_bytes))


def charts(data: dict, traffic) -> dict:
    """The report's figures by file stem: bytes per layer, memory over the step, bytes between
    devices (`traffic`, from `data.device_traffic`), and predicted against measured after a run."""
    with plt.rc_context(STYLE):
        figures = {"bytes_per_layer": _layer_bytes(data["layer_bytes"]), "memory": _memory(data["memory"]),
                   "device_traffic": _traffic(traffic)}
        if data.get("measured"):
            figures["measured"] = _measured(data["measured"])
    return figures


def svg_text(figure) -> str:
    """The figure as an inline ``<svg>`` element (no XML prolog, no date: the same figure gives the same text)."""
    with plt.rc_context(STYLE):
        buffer = io.StringIO()
        figure.savefig(buffer, format="svg", metadata={"Date": None}, bbox_inches="tight")
    text = buffer.getvalue()
    return text[text.index("<svg"):]


def png_bytes(figure) -> bytes:
    with plt.rc_context(STYLE):
        buffer = io.BytesIO()
        figure.savefig(buffer, format="png", dpi=144, bbox_inches="tight", metadata={"Software": None})
    return buffer.getvalue()


def close(figures: dict) -> None:
    for figure in figures.values():
        plt.close(figure)


def _axes(title: str, width: float = 7.0, height: float = 3.0):
    figure, axes = plt.subplots(figsize=(width, height))
    axes.set_title(title, loc="left")
    return figure, axes


def _layer_bytes(layers: list) -> object:
    figure, axes = _axes("Bytes each device sends per step, by layer")
    names = [name for name, _ in layers]
    bottom = [0.0] * len(layers)
    phases = [phase for phase in PHASE_COLOURS if any(phase in by_phase for _, by_phase in layers)]
    for phase in phases:
        heights = [by_phase.get(phase, 0) for _, by_phase in layers]
        axes.bar(range(len(layers)), heights, bottom=bottom, color=PHASE_COLOURS[phase], label=phase, width=0.8)
        bottom = [b + h for b, h in zip(bottom, heights)]
    step = max(1, len(names) // 24)  # at most ~24 labels: a 96-block stack stays readable
    axes.set_xticks(range(0, len(names), step), names[::step], rotation=60, ha="right")
    byte_ticks(axes.yaxis, max(bottom, default=0))
    if phases:
        axes.legend(frameon=False, ncols=len(phases), loc="upper right")
    else:
        axes.text(0.5, 0.5, "no redistribution: every layer sends 0 bytes", transform=axes.transAxes, ha="center")
    axes.set_xlim(-0.6, len(names) - 0.4)
    return figure


def _memory(memory: dict) -> object:
    figure, axes = _axes("Memory one device holds over the step (every device holds equal slices)")
    values = memory["bytes"]
    axes.plot(range(len(values)), values, color="#4e79a7", linewidth=1.2, label="held")
    start = 0
    for index in range(1, len(values) + 1):  # shade each phase's stretch of the step
        if index == len(values) or memory["phases"][index] != memory["phases"][start]:
            phase = memory["phases"][start]
            if phase:
                axes.axvspan(start, index - 1, color=PHASE_COLOURS.get(phase, "#dddddd"), alpha=0.08, linewidth=0)
            start = index
    peak = max(values, default=0)
    axes.axhline(peak, color="#4e79a7", linestyle=":", linewidth=0.8)
    axes.annotate(f"peak {format_bytes(peak)}", (values.index(peak) if values else 0, peak), xytext=(4, 4),
                  textcoords="offset points")
    if memory.get("budget"):
        axes.axhline(memory["budget"], color="#e15759", linestyle="--", linewidth=1, label="budget")
        axes.legend(frameon=False, loc="lower right")
    axes.set_xlabel("instruction of the step (loads, then per op its redistributions and kernel)")
    byte_ticks(axes.yaxis, max(peak, memory.get("budget") or 0))
    axes.set_ylim(bottom=0)
    return figure


def _traffic(traffic) -> object:
    figure, axes = _axes("Bytes per step between devices (row sends to column)", 5.2, 4.4)
    image = axes.imshow(traffic, cmap="viridis", interpolation="nearest")
    axes.set_xlabel("receiving device")
    axes.set_ylabel("sending device")
    for axis in (axes.xaxis, axes.yaxis):  # device numbers at round binary steps (0, 256, 512...)
        axis.set_major_locator(MaxNLocator(integer=True, nbins=8, steps=[1, 2, 4, 8, 10]))
    bar = figure.colorbar(image, ax=axes, shrink=0.85)
    byte_ticks(bar.ax.yaxis, float(traffic.max(initial=0)))
    return figure


def _measured(measured: dict) -> object:
    figure, axes = _axes("Predicted and measured, per rank (after autostrat run)")
    labels = [*measured["phases"], "peak memory"]
    predicted = [max(measured["phases"][phase]["predicted"]) for phase in measured["phases"]]
    predicted.append(max(measured["peak"]["predicted"]))
    sent = [max(measured["phases"][phase]["measured"]) for phase in measured["phases"]]
    sent.append(max(measured["peak"]["measured"]))
    positions = range(len(labels))
    axes.bar([p - 0.2 for p in positions], predicted, width=0.4, color="#bab0ac", label="predicted (largest rank)")
    axes.bar([p + 0.2 for p in positions], sent, width=0.4, color="#4e79a7", label="measured (largest rank)")
    axes.set_xticks(list(positions), labels)
    byte_ticks(axes.yaxis, max(predicted + sent))
    axes.legend(frameon=False)
    return figure
