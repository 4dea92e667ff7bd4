"""Redistribution timings: the MatMul edge's cost table, and the slowest pairs the scale benchmark meets.

Cost table (default): time to fill the cost table of a [4096, 4096] float32 edge between all
MatMul candidates. Producers are the output layouts of every MatMul candidate (partial over a
split reduction factor), consumers the input-0 layouts of every candidate. "cold" clears every
memo first, "warm" refills the same table. Target (issue 3): a 50 x 50 table in <= 20 ms warm,
<= 200 ms cold. MatMul has 29 candidates on 64 devices; `--devices 128 256` measures the larger
tables (37 and 46).

Slowest pairs (issue 32): ``--collect FILE --devices 64 1024 16384`` plans the 7b case of
`benchmarks/scale.py` (``--seeding``, default layouts; ``--layers``, default 2) in this process
per device count, times every redistribution cost its search computes
(`redistribution.table.entry_price`), prints the slowest ``--top`` (20) and pickles them to FILE with
those timings; pairs priced unreachable are counted and printed. ``--pairs FILE`` times each of
them again, cold (every memo cleared), and prints them with their value; ``--before TIMES`` adds
the cold timings another checkout wrote (``FILE.times.json``, written by every ``--pairs`` run),
so one table shows before and after. ``--collect FILE --quality`` collects the pairs of
`benchmarks/quality.py`'s 7b row refined for predicted time instead (64 devices, every pair
timed under the α–β model; its BFS and the refinement's cost tables meet about 900):

    cd <main checkout> && python benchmarks/redistribution.py --collect /tmp/pairs.pkl --devices 64 1024 16384
    cd <main checkout> && python benchmarks/redistribution.py --pairs /tmp/pairs.pkl   # writes /tmp/pairs.pkl.times.json
    cp /tmp/pairs.pkl.times.json /tmp/before.json
    cd <this checkout> && python benchmarks/redistribution.py --pairs /tmp/pairs.pkl --before /tmp/before.json

Recorded (issue #32, 2 shared cores at load 5-8, so wall times are rough; 7b, layouts seeding,
2 layers): the 20 slowest pairs per device count of main's code, timed cold by main / by this
code, all values equal except the pair main priced unreachable after its state limit:
64 devices 0.70 s / 21 ms at most per pair (sum 1.03 s / 0.19 s); 1024 devices 200.9 s / 0.11 s
for the partial sum handed between the 8-device axes (inf / 534 773 760 bytes), the others
25-381 ms / 1.7-199 ms; 16384 devices 204.9 s / 0.69 s for that pair, the others 0.20-2.8 s /
0.20-2.4 s. Costs computed in the whole case: 64 devices 1.0 s / 1.7 s, 1024 devices
133.8 s / 4.6 s, 16384 devices 188.4 s / 20.0 s; pairs priced unreachable 13 / 13, 14 / 13,
14 / 13 (13 want partial values their producer lacks, which no plan creates; main's 14th is the
handed pair); fallbacks 0 / 0, 2 / 0, 2 / 0 (main's two: its greedy fallback failing on that pair).

Recorded (issue #32, the quality row: ``--collect --quality`` by main's code (aeb7478), 1 347
costs in 89.3 s (85.6 s by this code), 13 priced unreachable (partial values their producer
lacks), no fallback; its 20 slowest timed pairs cold, main / this code, all values equal, 2
shared cores with a test suite beside): the partial sum kept inside the servers, rows to columns
across them ([131072, 4096]), 3 507 ms / 3.8 ms (the bound towards partial targets); the other
19 (partial sums over the 8 servers, or the 8-axes' roles swapped) 1.3-12.1 s / 0.9-13.9 s,
unchanged within the noise: their bound misses the AllToAlls inside the servers that the
fastest plans add to the traffic across them. Sum 76.2 s / 74.0 s.

Recorded (issue #32, branch axes: a permute's children found per class of child, not per
relabelling; 2 shared cores at load 5-7, cold, main / this code, every value equal): the scale
benchmark's slowest pairs are all priced in bytes, where no timed permute is met, so their
times are unchanged within the noise (64 devices: sum 0.18 s / 0.10 s, at most 25 / 15 ms;
1024: 2.66 s / 2.14 s, at most 243 / 210 ms; 16384: 16.3 s / 14.1 s, at most 2.2 / 2.3 s).
The quality row's 20 slowest pairs (timed, 64 devices, collected by main): sum 29.9 s / 20.2 s;
the five partial sums handed across the servers with the rows made columns 3.3-4.3 s /
1.6-2.4 s; the smallest a few hundred ms either way (216 / 526 ms at worst; this code lists
a state shape's classes for every link at once, main only for the bundles it popped).

Issue pairs (default run, after the table): the pairs issue #32 names, cold, best of 3 (CPU and
wall milliseconds: the machine may be shared); target: the stuck pair (timed) in <= 50 ms.
``--check`` also plans each by Dijkstra (every bound 0, no state limit), whose objective proves
the A* one optimal. Recorded (branch axes, load 5): the handed partial pair timed, 4 082 ns (one
CollectivePermute across the servers: 4 µs + 4 096 B at 50 GB/s), 32 ms CPU, 51 ms wall (main's
code: 44.3 s, enumerating 10! relabellings per permute bundle); the stuck pair timed 19.7 ms CPU.

Recorded (issue #32, branch wholeaxes: a popped permute bundle first tries the relabelling
nearest the target's order, `search.Search._towards`; load 10-15): the pinned permute (rows
handed from the major 8-axis to the minor one of dm[8, 16, 8], 10 prime axes each pinned by the
target) timed 47.2 ms CPU, 4 656 ns, one CollectivePermute across the servers (main: 46.6 s for
the same plan, listing 10! relabellings per bundle); stuck timed 20.3 ms CPU; handed partial
timed 36.9 ms. The quality row's 20 slowest timed pairs, collected by this code (821 costs in
58.8 s, none unreachable, no fallback), cold, main / this code: every value equal, sum 48.5 s /
45.1 s, each within the noise (their rests are popped: the bound misses the AllToAlls inside
the servers, as above).

Run: python benchmarks/redistribution.py [--devices 8 16 64] [--check]
"""

from __future__ import annotations

import argparse
import io
import json
import math
import pickle
import sys
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run as a script: the repository is not installed

from autostrat.redistribution import cost_table  # noqa: E402
from autostrat.redistribution.memo import clear_memos  # noqa: E402
from autostrat.rules import make_rule  # noqa: E402
from autostrat.strategies import generate_strategies  # noqa: E402
from autostrat.tables import format_table  # noqa: E402

SHAPE = (4096, 4096)
PAIR_HEADERS = ["devices", "dtype", "objective", "source", "destination", "value", "ms"]


def edge_layouts(device_num: int):
    candidates = generate_strategies(make_rule("MatMul", [SHAPE, SHAPE]), device_num)
    return [s.output_layouts[0] for s in candidates], [s.input_layouts[0] for s in candidates]


def timed(producers, consumers) -> tuple[float, object]:
    start = time.perf_counter()
    table = cost_table(producers, consumers, "float32")
    return (time.perf_counter() - start) * 1000, table


def print_tables(devices: list[int]) -> None:
    print(f"{'devices':>7} {'table':>7} {'cold ms':>9} {'warm ms':>9} {'us/pair cold':>13} {'max MB':>8}")
    for device_num in devices:
        producers, consumers = edge_layouts(device_num)
        clear_memos()
        cold, table = timed(producers, consumers)
        warm, again = timed(producers, consumers)
        assert (table == again).all()
        size = f"{len(producers)}x{len(consumers)}"
        pairs = len(producers) * len(consumers)
        print(f"{device_num:>7} {size:>7} {cold:>9.1f} {warm:>9.2f} {cold * 1000 / pairs:>13.0f} {table.max() / 2**20:>8.1f}")


def issue_pairs() -> list[tuple[str, object, object, object]]:
    """``(name, src, dst, model)`` of the pairs issue #32 names: the stuck timed pair on 64
    devices (8 servers of 8) and the partial sum handed between two 8-device axes on 1024
    (128 servers of 8), each timed and in bytes."""
    from autostrat.cost import Hardware
    from autostrat.layout import DeviceMatrix, Layout, TensorMap

    shape = (64, 32, 2048, 128)
    stuck = (Layout(DeviceMatrix((8, 1, 8, 1)), TensorMap((3, 1, 2, 0)), shape),
             Layout(DeviceMatrix((1, 1, 8, 1, 8)), TensorMap((4, 3, 1, 0)), shape))
    matrix = DeviceMatrix((8, 16, 8))
    handed = (Layout(matrix, TensorMap((-1, -1)), (128, 8), partial=(2,)), Layout(matrix, TensorMap((-1, -1)), (128, 8), partial=(0,)))
    # Timed too since a permute's children are found by class (`relabellings.first_relabellings`):
    # over 10 prime axes of 2 the 10! relabellings per bundle took minutes per state.
    # Rows handed from the major 8-axis to the minor one: the target pins each of the 10 prime
    # axes in its own role, so a permute's classes are its 10! relabellings (85 s before the
    # permute towards the target's order, `search.Search._towards`).
    pinned = tuple(Layout(matrix, TensorMap(entries), (1024, 1024)) for entries in ((2, 1), (0, 1)))
    return [("stuck, time", *stuck, Hardware().alpha_beta(64)), ("stuck, bytes", *stuck, None),
            ("handed partial, time", *handed, Hardware().alpha_beta(1024)), ("handed partial, bytes", *handed, None),
            ("pinned permute, time", *pinned, Hardware().alpha_beta(1024))]


def print_issue_pairs(check: bool) -> None:
    """The issue's pairs, cold (best of 3, CPU and wall ms); with `check`, each also by Dijkstra
    (the search's bound set to 0, no state limit): equal objectives prove the A* optimum."""
    from autostrat.redistribution.table import collector_paused, entry_price

    rows = []
    for name, src, dst, model in issue_pairs():
        runs = []
        for _ in range(3):
            clear_memos()
            with collector_paused():  # as a cost table computes its entries
                wall, cpu = time.perf_counter(), time.process_time()
                value = entry_price(src, dst, "float32", model)
                runs.append(((time.process_time() - cpu) * 1000, (time.perf_counter() - wall) * 1000))
        cpu_ms, wall_ms = min(runs)
        # Dijkstra lists every class of every permute it pops: 10! per bundle for the pinned pair.
        dijkstra = f"{dijkstra_objective(src, dst, model):.0f}" if check and not name.startswith("pinned") else "-"
        rows.append([name, str(src), str(dst), f"{value:.0f}", f"{cpu_ms:.1f}", f"{wall_ms:.1f}", dijkstra])
    print(format_table(["pair", "source", "destination", "objective", "cpu ms", "wall ms", "dijkstra"], rows))


def dijkstra_objective(src, dst, model) -> float:
    """The objective with every A* bound and estimate 0 and no state limit: plain Dijkstra
    over the same states and steps, which needs no admissibility argument."""
    from unittest import mock

    from autostrat.redistribution import search
    from autostrat.redistribution.table import entry_price

    clear_memos()
    with mock.patch.object(search.Search, "_bound", lambda self, node: 0), \
            mock.patch.object(search.Search, "_estimate", lambda self, node, signature: (0, True)), \
            mock.patch.object(search, "SETTLED_LIMIT", 10**9):
        value = entry_price(src, dst, "float32", model)
    clear_memos()
    return value


def collect_pairs(device_num: int, seeding: str, layers: int) -> tuple[list[dict], object]:
    """Every redistribution cost the scale benchmark's 7b case computes on `device_num`
    devices, with its value and the milliseconds it took as the search met it; and the run's
    `phases.PairCounts`."""
    import scale  # this folder is on sys.path
    from phases import PhaseClock

    case = {"model": "7b", "devices": device_num, "seeding": seeding, "layers": layers,
            "refine": None, "coarsen": None, "time_limit": 60.0, "allow_repeated": None}
    return _met_by(device_num, lambda: scale.plan_case(case, PhaseClock(io.StringIO())))


def collect_quality_pairs(time_limit: float) -> tuple[list[dict], object]:
    """`collect_pairs` for the 7b row of `benchmarks/quality.py` refined for predicted time
    (64 devices; its BFS and its refinement's cost tables time every pair under the α–β model):
    the Megatron plan gives its memory budget, as in quality.py, and its pairs (in bytes) are
    not collected."""
    import quality  # this folder is on sys.path

    from autostrat.search import SearchOptions, search

    device_num, build = quality.MODELS["7b"]
    layers, data = len(build().blocks), device_num // quality.TENSOR_PARALLEL
    seeds = quality.megatron_seeds(layers, quality.TENSOR_PARALLEL, data_parallel=data)
    budget = search(quality.training_graph(build(), device_num, seeds), device_num, SearchOptions()).prediction.peak_bytes
    first_block = quality.training_graph(build(), device_num, quality.megatron_seeds(layers, quality.TENSOR_PARALLEL, True,
                                                                                     data_parallel=data))
    clear_memos()
    return _met_by(device_num, lambda: search(first_block, device_num, quality.refined_options(budget, time_limit)))


def _met_by(device_num: int, run) -> tuple[list[dict], object]:
    """The costs `run()` computes (`redistribution.table.entry_price`), each with its value and
    milliseconds, and the run's `phases.PairCounts` (fallbacks and searches stopped at their budget)."""
    from phases import counted_pairs

    from autostrat.redistribution import table

    met, compute = [], table.entry_price

    def timed_cost(src, dst, dtype, model):
        start = time.perf_counter()
        value = compute(src, dst, dtype, model)
        met.append({"devices": device_num, "src": src, "dst": dst, "dtype": dtype, "model": model,
                    "value": value, "ms": (time.perf_counter() - start) * 1000})
        return value

    table.entry_price = timed_cost
    try:
        with counted_pairs() as counts, warnings.catch_warnings():
            warnings.simplefilter("ignore")  # unreached ops' warnings
            run()
    finally:
        table.entry_price = compute
    clear_memos()
    return met, counts


def pair_row(pair: dict, value, ms: float, *extra) -> list[str]:
    objective = "bytes" if pair["model"] is None else "ns"
    return [str(pair["devices"]), pair["dtype"], objective, str(pair["src"]), str(pair["dst"]),
            "unreachable" if math.isinf(value) else f"{value:.0f}", f"{ms:.1f}", *extra]


def print_collected(path: Path, devices: list[int], seeding: str, layers: int, top: int, quality: bool = False) -> None:
    slowest = []
    for device_num in [64] if quality else devices:
        met, counts = collect_quality_pairs(60.0) if quality else collect_pairs(device_num, seeding, layers)
        unreachable = [pair for pair in met if math.isinf(pair["value"])]
        print(f"{device_num} devices: {len(met)} costs computed in {sum(p['ms'] for p in met) / 1000:.1f} s, "
              f"{len(unreachable)} priced unreachable, "
              f"{counts.fallbacks} answered by the constructive fallback, {counts.cut} timed searches stopped at their budget",
              flush=True)
        for pair in unreachable[:5]:
            print(f"  unreachable: {pair['src']} -> {pair['dst']}")
        slowest += sorted(met, key=lambda pair: -pair["ms"])[:top]
    path.write_bytes(pickle.dumps(slowest))
    print(format_table(PAIR_HEADERS, [pair_row(pair, pair["value"], pair["ms"]) for pair in slowest]))


def time_pairs(path: Path, before: Path | None) -> None:
    """Time every pair of `path` cold; print them beside `before`'s timings and values."""
    from autostrat.redistribution.table import collector_paused, entry_price

    pairs = pickle.loads(path.read_bytes())
    earlier = json.loads(before.read_text()) if before else None
    rows, times = [], []
    for index, pair in enumerate(pairs):
        clear_memos()
        with collector_paused():  # as a cost table computes its entries
            start = time.perf_counter()
            value = entry_price(pair["src"], pair["dst"], pair["dtype"], pair["model"])
            ms = (time.perf_counter() - start) * 1000
        times.append({"ms": ms, "value": value})
        extra = [] if earlier is None else [f"{earlier[index]['ms']:.1f}", f"{earlier[index]['value']:.0f}"]
        rows.append(pair_row(pair, value, ms, *extra))
    Path(f"{path}.times.json").write_text(json.dumps(times))
    headers = PAIR_HEADERS[:-1] + ["cold ms"] + ([] if earlier is None else ["before ms", "before value"])
    print(format_table(headers, rows))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, nargs="+", help="device counts (default 8 16 64; with --collect 64 1024 16384)")
    parser.add_argument("--collect", type=Path, metavar="FILE", help="collect the scale benchmark's slowest pairs into FILE")
    parser.add_argument("--quality", action="store_true",
                        help="with --collect: the pairs of quality.py's 7b row refined for time instead (64 devices, minutes)")
    parser.add_argument("--seeding", choices=["megatron", "layouts", "none"], default="layouts", help="scale seeding (default layouts)")
    parser.add_argument("--layers", type=int, default=2, help="layers of the 7b case (default 2)")
    parser.add_argument("--top", type=int, default=20, help="slowest pairs kept per device count (default 20)")
    parser.add_argument("--pairs", type=Path, metavar="FILE", help="time the pairs of FILE cold")
    parser.add_argument("--before", type=Path, metavar="TIMES", help="with --pairs: another checkout's timings of them")
    parser.add_argument("--check", action="store_true", help="check the issue's pairs against Dijkstra (minutes)")
    args = parser.parse_args()
    if args.collect:
        print_collected(args.collect, args.devices or [64, 1024, 16384], args.seeding, args.layers, args.top, args.quality)
    elif args.pairs:
        time_pairs(args.pairs, args.before)
    else:
        print_tables(args.devices or [8, 16, 64])
        print()
        print_issue_pairs(args.check)


if __name__ == "__main__":
    main()
