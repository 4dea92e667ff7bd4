"""Aligned plain-text tables for plans, candidates and benchmarks."""

from __future__ import annotations


def format_table(headers: list[str], rows: list[list[str]], indent: str = "") -> str:
    """Left-aligned columns separated by two spaces, one header line.

    Example:
        >>> print(format_table(["op", "bytes"], [["relu", "0"], ["dense2.matmul", "6144"]]))
        op             bytes
        relu           0
        dense2.matmul  6144
    """
    widths = [max(len(str(cell)) for cell in column) for column in zip(headers, *rows)]
    lines = [headers] + rows
    return "\n".join(indent + "  ".join(str(c).ljust(w) for c, w in zip(line, widths)).rstrip() for line in lines)
