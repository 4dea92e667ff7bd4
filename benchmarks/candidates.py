"""How long candidate generation takes for the ops of a GPT-style layer.

Prints, per device_num, the number of candidates of each op and the time to enumerate them
cold (cache cleared) and warm (cached). Run: .venv/bin/python benchmarks/candidates.py
"""

from __future__ import annotations

import time

from autostrat.tables import format_table
from autostrat.rules import make_rule
from autostrat.strategies import generate_strategies

BATCH, SEQ, HIDDEN, HEADS = 16, 128, 1024, 16
HEAD = HIDDEN // HEADS
GPT_LAYER_OPS = [
    ("qkv MatMul", "MatMul", [(BATCH * SEQ, HIDDEN), (HIDDEN, 3 * HIDDEN)], {}),
    ("heads Reshape", "Reshape", [(BATCH * SEQ, HIDDEN)], {"shape": (BATCH, SEQ, HEADS, HEAD)}),
    ("heads Transpose", "Transpose", [(BATCH, SEQ, HEADS, HEAD)], {"perm": (0, 2, 1, 3)}),
    ("scores BatchMatMul", "BatchMatMul", [(BATCH, HEADS, SEQ, HEAD), (BATCH, HEADS, SEQ, HEAD)], {"transpose_b": True}),
    ("Softmax", "Softmax", [(BATCH, HEADS, SEQ, SEQ)], {}),
    ("LayerNorm", "LayerNorm", [(BATCH * SEQ, HIDDEN), (HIDDEN,), (HIDDEN,)], {}),
    ("ffn GeLU", "GeLU", [(BATCH * SEQ, 4 * HIDDEN)], {}),
]


def measure(device_num: int) -> list[list[str]]:
    rows = []
    for label, op_type, shapes, attrs in GPT_LAYER_OPS:
        rule = make_rule(op_type, shapes, **attrs)
        generate_strategies.cache_clear()
        start = time.perf_counter()
        count = len(generate_strategies(rule, device_num))
        cold = time.perf_counter() - start
        start = time.perf_counter()
        generate_strategies(rule, device_num)
        warm = time.perf_counter() - start
        rows.append([str(device_num), label, str(count), f"{cold * 1e3:.2f}", f"{warm * 1e6:.1f}"])
    return rows


def main() -> None:
    rows = [row for device_num in (8, 64, 96) for row in measure(device_num)]
    print(format_table(["device_num", "op", "candidates", "cold ms", "warm us"], rows))


if __name__ == "__main__":
    main()
