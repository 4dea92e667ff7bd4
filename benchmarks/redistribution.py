"""Time to fill the cost table of a [4096, 4096] float32 edge between all MatMul candidates.

Producers are the output layouts of every MatMul candidate (partial over a split reduction
factor), consumers the input-0 layouts of every candidate. "cold" clears every memo first,
"warm" refills the same table. Target (issue 3): a 50 x 50 table in <= 20 ms warm, <= 200 ms cold.
MatMul has 29 candidates on 64 devices; `--devices 128 256` measures the larger tables (37 and 46).

Run: python benchmarks/redistribution.py [--devices 8 16 64]
"""

from __future__ import annotations

import argparse
import time

from autostrat.redistribution import cost_table
from autostrat.redistribution.memo import clear_memos
from autostrat.rules import make_rule
from autostrat.strategies import generate_strategies

SHAPE = (4096, 4096)


def edge_layouts(device_num: int):
    candidates = generate_strategies(make_rule("MatMul", [SHAPE, SHAPE]), device_num)
    return [s.output_layouts[0] for s in candidates], [s.input_layouts[0] for s in candidates]


def timed(producers, consumers) -> tuple[float, object]:
    start = time.perf_counter()
    table = cost_table(producers, consumers, "float32")
    return (time.perf_counter() - start) * 1000, table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, nargs="+", default=[8, 16, 64], help="device counts (default 8 16 64)")
    print(f"{'devices':>7} {'table':>7} {'cold ms':>9} {'warm ms':>9} {'us/pair cold':>13} {'max MB':>8}")
    for device_num in parser.parse_args().devices:
        producers, consumers = edge_layouts(device_num)
        clear_memos()
        cold, table = timed(producers, consumers)
        warm, again = timed(producers, consumers)
        assert (table == again).all()
        size = f"{len(producers)}x{len(consumers)}"
        pairs = len(producers) * len(consumers)
        print(f"{device_num:>7} {size:>7} {cold:>9.1f} {warm:>9.2f} {cold * 1000 / pairs:>13.0f} {table.max() / 2**20:>8.1f}")


if __name__ == "__main__":
    main()
