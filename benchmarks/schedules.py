"""Issue #34: each pipeline schedule's simulated step against its closed form.

For p devices and m micro-batches (v chunks per device for interleaved_1f1b, 2 for zbv), every
stage with the same forward F, input-gradient B and weight-gradient W times (a device's, over its
chunks: each chunk takes 1/v of them) and free sends, `search.schedule_simulation.simulate` runs
each schedule's instruction orders. Columns: the step; the bubble, the idle share of the devices'
time, from the simulation and from the closed form's bubble time per device over m (F + B + W)
plus it: GPipe and 1F1B (p - 1)(F + B + W), interleaved (p - 1)(F + B + W)/v, ZB-H1
(p - 1)(F + B - W) (it holds for m >= p and W <= min(F, B)), ZB-V (p - 1) F/2, the devices'
start offsets, the least any order allows (the paper's table lists a bubble rate of 0 at
F = B = W); it is ZB-V's step at F = B = W and m >= 2p, and a lower bound (">=") at other
times, for which the paper gives no closed form; "n/a" where a closed form does not hold; per
device, the most micro-batch activations it holds (per chunk: interleaved and ZB-V count a
micro-batch once per chunk), until the weight gradient and until the input gradient.

Run: .venv/bin/python benchmarks/schedules.py [--devices 4] [--micro-batches 8] [--chunks 2] [--times F B W]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run as a script: the repository is not installed

from autostrat.errors import AutostratError  # noqa: E402
from autostrat.search.schedule_simulation import StageTimes, simulate  # noqa: E402
from autostrat.search.schedules import SCHEDULE_ORDERS, schedule_orders  # noqa: E402
from autostrat.tables import format_table  # noqa: E402


def closed_form_bubble(name: str, p: int, m: int, v: int, forward: float, backward: float, weight: float) -> float | None:
    """The bubble time per device on uniform stages by the closed form; None where it does not hold
    (ZB-V's `zbv_bound` is then a lower bound)."""
    if name == "zero_bubble_h1":
        return (p - 1) * (forward + backward - weight) if m >= p and weight <= min(forward, backward) else None
    if name == "zbv":
        return (p - 1) * forward / 2 if m >= 2 * p and forward == backward == weight else None
    return (p - 1) * (forward + backward + weight) / (v if name == "interleaved_1f1b" else 1)


def zbv_bound(p: int, forward: float) -> float:
    """The least bubble time per device any ZB-V order allows with a device's forward `forward`
    (over both chunks), whatever B and W take: device p - 1 cannot start before the first
    micro-batch's p - 1 chunk forwards, (p - 1) F / 2, and then has all of its work to run.
    It is ZB-V's closed form at F = B = W; Qi et al. give none for other times (their ZB-V
    there is planned by their automatic scheduler)."""
    return (p - 1) * forward / 2


def closed_form_text(name: str, p: int, m: int, v: int, forward: float, backward: float, weight: float) -> str:
    """The closed form's bubble share of the step; ZB-V's bound as ">= x" where its closed form does
    not hold (unequal times, m >= 2p); "n/a" for the others where theirs does not."""
    bubble, prefix = closed_form_bubble(name, p, m, v, forward, backward, weight), ""
    if bubble is None and name == "zbv" and m >= 2 * p:
        bubble, prefix = zbv_bound(p, forward), ">="
    return "n/a" if bubble is None else f"{prefix}{bubble / (m * (forward + backward + weight) + bubble):.1%}"


def row(name: str, p: int, m: int, v: int, forward: float, backward: float, weight: float) -> list[str]:
    """One schedule's line of the table."""
    chunks = {"interleaved_1f1b": v, "zbv": 2}.get(name, 1)
    times = StageTimes.uniform(p * chunks, forward / chunks, backward / chunks, weight / chunks)
    run = simulate(schedule_orders(name, p, m, chunks if name == "interleaved_1f1b" else None), times)
    return [f"{name}{f' (v={chunks})' if chunks > 1 else ''}", f"{run.step_ns:g}", f"{run.bubble:.1%}",
            closed_form_text(name, p, m, chunks, forward, backward, weight),
            " ".join(map(str, run.peak_activations)), " ".join(map(str, run.peak_until_backward))]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, default=4)
    parser.add_argument("--micro-batches", type=int, default=8)
    parser.add_argument("--chunks", type=int, default=2, help="model chunks per device of interleaved_1f1b")
    parser.add_argument("--times", type=float, nargs=3, default=[1, 1, 1], metavar=("F", "B", "W"),
                        help="a device's forward, input-gradient and weight-gradient time per micro-batch")
    args = parser.parse_args(argv)
    try:
        rows = [row(name, args.devices, args.micro_batches, args.chunks, *args.times) for name in SCHEDULE_ORDERS]
    except AutostratError as error:
        print(f"schedules: error: {error}", file=sys.stderr)
        return 2
    forward, backward, weight = args.times
    print(f"p = {args.devices} devices, m = {args.micro_batches} micro-batches, F = {forward:g}, B = {backward:g}, "
          f"W = {weight:g}, sends free")
    print(format_table(["schedule", "step", "bubble", "closed form", "peak activations to W", "to B"], rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
