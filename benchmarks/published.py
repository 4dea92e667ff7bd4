"""Issue #33: autostrat's predictions against published training runs, per row and column:
published, predicted, ratio (and the issue's target), or why an entry is not yet expressible.

Published runs: Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer
Models" (arXiv 2205.05198), Table 5 (step time with full recompute, and with sequence
parallelism + selective recompute) and Fig. 1 (memory per GPU: parameters + optimiser state;
activations without and with SP + selective recompute), on A100-80GB (the ``a100-80gb``
profile), sequence 2048, micro-batch 1 (22B: 4), fp16 with fp32 gradients, vocab 51 200; the
models are configs/models/gpt-{22b,175b,530b,1t}.json.

Precision: the paper counts fp32 gradients (18 bytes per parameter: a 16-bit parameter, its fp32
gradient, fp32 main parameter and two Adam moments), which is Megatron's fp16 run with
``--accumulate-allreduce-grads-in-fp32``; its table's fp16 row (fp16 gradients, 20 bytes) is
another run. autostrat has no fp16-with-fp32-gradients precision of its own; its ``bf16`` is that
run byte for byte and second for second on A100 (16-bit parameters and activations, fp32
gradient buffer reduced in fp32, fp32 main parameters; bf16 and fp16 share the 312 TFLOP/s
tensor-core peak and the 2-byte size), so the estimates are priced in ``bf16`` (`PRECISION`).

Each entry is `autostrat estimate`'s figure (`autostrat.report.estimate`) for the row's plan:
- time, full recompute: ``plan: {tp, pp, vp: interleave, dp, recompute: full}``; step_time_s;
- parameters + optimiser: that estimate's parameters + gradients + optimiser state (Fig. 1's bar
  counts all three) of the stage holding the most of the stages of layers only (`weights_gib`:
  between the first and the last, where there are three or more; Fig. 1 counts the layers'
  matrices, below); the fullest stage's, tables included, is printed after the table;
- activations without SP/selective: the plan with ``recompute: none``, the most activation bytes
  a device of any stage holds at once (`memory_breakdown.MemoryBreakdown.most_activation_bytes`);
- the SP + selective columns: ``sequence_parallel: true, recompute: selective``, its step time
  and its activations as above.
An entry the estimate refuses is printed with the estimate's reason, never as a number. The
175B and 530B rows run interleaved 1F1B with 3 model stages per pipeline rank (``vp: 3``); the
layers are split evenly over the model stages, as Megatron splits them (the estimate's given
split: 4, 1 and 2 layers per model stage on 175B, 530B and 1T, the embedding on the first).

Efficiency factors: ``matmul_efficiency`` of the profile is fitted once over every expressible
step-time entry (both time columns; least squares of the log ratio over (0, 1]), with the
leave-one-out error: each entry predicted with the factor fitted on the others. The factor
divides the flop time of every op, so an entry's step time is T(e) = F / e + R (R: memory
traffic, communication, the bubble's share of them); the table's estimate (the profile as
shipped, `cost.hardware`, with the factor e this fit printed) and one more at e / 2 give F and
R, and the fits run on that model: at the shipped factor the model is the table, elsewhere it
is exact up to the nanosecond rounding of each op, unless the stage split moves.
The fit's table prints each entry predicted at the factor as shipped and at the fitted one, and
their mean absolute relative errors (issue #37: whether the factor moves with the step-time model
of overlap, collective algorithms and interleaved schedules). Measured 2026-12-02 (load 3-4),
with Megatron's dropout (its elementwise passes priced: +4.9 % and +13.6 % on 22B's selective
and full-recompute steps, +2.4 % and +11.2 % on 175B's, against the same plans without it):
over all eight step-time entries the fit gives 0.835 against the shipped 0.7977, MARE 4.06 %
-> 3.29 % (leave-one-out 3.77 %), every entry within ±15 % at both (the worst 530B full
recompute, +11.2 % at the shipped factor). The shipped factor was fitted on 22B and 1T before
the dropout; refitting it would move it 4.7 % for 0.77 points of error (before the dropout:
0.8084, MARE 4.46 % -> 4.41 %). 2026-12-04 (load 1), with sequence parallelism gathering the
norms' outputs again in the backward: 0.846, MARE 4.00 % -> 2.85 % (leave-one-out 3.26 %), the
worst still 530B full recompute, +11.2 %.
`calibration.py` fits this machine's MPI ranks (a CPU host), not an A100: it has no factor to give.

Memory: after the table, `paper_accounting` prints what Fig. 1 counts, which its formulas
reproduce exactly; where it differs from what the estimate counts, the memory ratios measure
accounting as much as modelling:
- parameters + optimiser: the paper counts the layers' matrices only; the estimate counts every
  parameter on the stage (embedding and position tables, biases, norms too: on a first pipeline
  stage of 2 or 3 layers the tables add 7-11 %), hence the column's stages of layers only.
  Gradients are summed over micro-batches in place (`runtime.pipeline`, `search.stage_buffers`),
  as Megatron adds them into its main gradients, so a peak holds one copy of them, and next to
  it a micro-batch's gradient being added in: on a 1T middle stage 1.22 GiB over Fig. 1's 18
  bytes a parameter (3.7 %), the fp32 gradient of its largest matrix (4h²/t elements), which
  Megatron's fused weight-gradient kernel adds into the sum directly. The first stage's tied embedding gradient is computed on its own
  vocabulary rows, the tp-th of the table, as Megatron's VocabParallelEmbedding does (the lookup's
  GatherGrad priced against where the table's update reads it: `search.propagate`); before, it
  was computed for all 51 200 rows, 2 · 4 + 2 bytes per table element (12.2 GiB on 1T's first
  stage). The first stage still holds the table's 18 bytes per element of its rows (parameter,
  fp32 gradient, main copy and moments), which Fig. 1 leaves out.
- activations: the paper's layers drop as Megatron-LM does by default (its arguments'
  ``--attention-dropout 0.1`` and ``--hidden-dropout 0.1``, `_add_regularization_args` in
  megatron/training/arguments.py; the hidden one also after the embedding), and so do the GPT
  configs (``attn_pdrop``, ``resid_pdrop``, ``embd_pdrop`` 0.1, `models.gpt.GPT`): each Dropout
  keeps a 1-byte mask for its backward, as PyTorch's does (the paper's 3·a·s/(h·t) + 2 of the
  s·b·h units: the attention probabilities' mask and output, the masks after the attention and
  the MLP). The 22B run is one micro-batch of 4 sequences: the paper's formula gives its Fig. 1 bars
  at b = 4 (and at no other b), and with pp = dp = 1 only a micro-batch of 4 holds 4 sequences'
  activations at once. Without SP the given plan keeps the norms and residual adds whole on the
  tp devices, as Megatron does (`models.megatron_plan`).
  ``--terms`` prints a layer's activations term by term against the paper's (`activation_terms`,
  the one-stage 22B row): a layer keeps every term of the paper, exactly, without SP and with
  SP + selective (1.000 both; the rows 1.002-1.007 without SP with the tables and the head,
  1.027-1.031 with SP + selective on the pipelined rows and 1.089 on the one-stage 22B: at its
  most the blocks hold 15.9 s·b·h over their 48 · 34/t, the last layer's backward recomputing
  its attention core, 5·a·s/(h·t) = 13.3, while the layers below still hold theirs). Each LayerNorm output is kept as its sequence's part and gathered again
  for the weight gradients in the backward, as Megatron's is (``backward_regathers``, with
  the weight-gradient products seeded as Megatron computes them:
  `models.megatron_plan.weight_gradient_seeds`). Measured 2026-12-04 at a load of 1; before
  (2026-12-02), the forward's gathered copy (2·s·b·h each) was kept to the backward: 30/t of
  the paper's 34/t a layer, 0.914-0.924 and 1.050, and the 1T plan peaked at 86.05 GiB. Every
  attention reads one causal mask (`models.gpt.causal_mask_tensor`; one a layer was 0.75 GiB on
  the 22B row).

Search: after the table, per row the plan-space search's candidates and its bounds
(`bound_counts`: the candidates, those past the memory floor, and those whose step-time bound
is below the published plan's predicted step: the most branch and bound prices once it has found
that plan), then each row's plan-space search (`report.plan_space`, what ``autostrat search``
does with the row's model, devices and global batch and no plan) next to the published plan,
the faster of its two recompute columns: predicted step and peak of both, whether the searched
one fits 80 GiB, their ratio, the candidates priced / pruned by the memory floor / pruned by
the step-time bound / refused / left unpriced, and the search's wall seconds against the
issue's 30 s. Every priced candidate is a full estimate (3-8 CPU-s on 175B and 1T). The whole
branch and bound takes minutes to hours on the rows but 530B, so the issue's 30 s needs
``--time-limit`` (below). Measured 2026-12-04 (load 1-2), ``--time-limit 25`` on 2 processes,
twice, the same answers: 22B tp 4 pp 2 vp 12 sp, recompute none, mb 2, 0.995 s (0.909 of the
published plan's 1.095 s), 76.6 GiB, 28-31 priced; 175B tp 8 pp 8 vp 12 sp selective mb 2,
13.47 s (0.976 of 13.81), 68.2 GiB, 10 priced, 24 left unpriced; 530B the published plan itself,
38.67 s, the branch and bound complete in 18.4 s (5 priced: optimal over the candidates); 1T
tp 8 pp 64 vp 2 sp selective, 73.09 s (0.962 of 75.99), 77.6 GiB, 4 priced and every other
candidate pruned but the op-level search's plan. Two changes make that possible: the memory
floor (`report.memory_floor`), which counts the activations the schedule keeps in flight and a
sequence-parallel plan's gradient sums whole (past 80 GiB: 239 / 407 / 269 / 250 of 339 /
3 345 / 2 922 / 4 206 candidates, against 1 314 / 1 149 / 909 on 175B / 530B / 1T with the
parameters and optimiser state alone), and the backward run as Megatron's under sequence
parallelism (the norms' outputs kept as sequence parts and gathered again, every weight
gradient each device's part of the weight: `models.megatron_plan.weight_gradient_seeds`; the
1T published plan peaked at 86.05 GiB with the gathered copies kept, 102.5 GiB with them
gathered again but the weight gradients left to propagation). Before both, the larger rows
found no plan that fits within 25 s.

Run: .venv/bin/python benchmarks/published.py [--rows 22B 1T] [--no-search] [--no-fit] [--terms] [--processes N]
[--time-limit S]   (22B, 175B, 530B and 1T took 4.4, 11.3, 20.0 and 23.6 s for their three plans at
a load of 1 on 2 cores, the fit 34.1 s more; 203 s in all with --time-limit 25)
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run as a script: the repository is not installed

from autostrat.cost import PROFILES  # noqa: E402
from autostrat.errors import AutostratError  # noqa: E402
from autostrat.report.estimate import estimate  # noqa: E402
from autostrat.models import from_hf_config  # noqa: E402
from autostrat.report.plan_bound import ModelShape, op_level_bound, step_time_bound  # noqa: E402
from autostrat.report.memory_floor import LayerActivations, peak_floor  # noqa: E402
from autostrat.report.plan_space import plan_candidates, search_plan_space  # noqa: E402
from autostrat.tables import format_table  # noqa: E402
from activation_terms import print_terms  # noqa: E402  (beside this script)
from published_runs import COLUMNS, PRECISION, ROWS, Row, estimated  # noqa: E402

GIB = 2**30


def predictions(row: Row, folder: Path, plans: dict | None = None) -> dict:
    """Per column, the predicted figure (a number) or the reason none is expressible (text);
    the estimates of the published plan, full recompute and SP + selective, go into `plans`."""
    full = estimated(row, folder, "full", recompute="full")
    selective = estimated(row, folder, "selective", recompute="full", selective=True)
    if plans is not None:
        plans[row.name] = {"full recompute": full, "SP + selective": selective}
    none = estimated(row, folder, "none", recompute="none") if not isinstance(full, str) else full
    weights = activations = fullest = full
    if not isinstance(full, str):
        weights, fullest = weights_gib(full.memory)
    if not isinstance(none, str):
        activations = max(stage.most_activation_bytes for stage in none.memory) / GIB
    return {"full": full if isinstance(full, str) else full.step_time_s,
            "selective": selective if isinstance(selective, str) else selective.step_time_s,
            "weights": weights, "weights_fullest": fullest, "activations": activations,
            "selective_activations": selective if isinstance(selective, str) else max(
                stage.most_activation_bytes for stage in selective.memory) / GIB}


def weights_gib(memory) -> tuple[float, float]:
    """(parameters + gradients + optimiser state of the fullest device group holding layers only,
    of the fullest group), GiB, from an estimate's per-stage `memory`. Layers only: the groups
    between the first (the embedding, and a tied table's update) and the last (the LM head),
    what Fig. 1's formula counts (module docstring); with fewer than three groups, every group."""
    totals = [sum(stage.bytes_by_kind[kind] for kind in ("parameters", "gradients", "optimizer_state")) / GIB
              for stage in memory]
    return max(totals[1:-1] or totals), max(totals)


def table(rows, predicted: dict) -> str:
    headers = ["model", "GPUs", "TPxPPxDP", "batch", "interleave", "column", "published", "predicted", "ratio", "target",
               "within"]
    lines, reasons = [], []
    for row in rows:
        for key, heading, target in COLUMNS:
            value, published = predicted[row.name][key], row.published[key]
            cells = [row.name, str(row.gpus), f"{row.tp}x{row.pp}x{row.dp}", str(row.global_batch), str(row.interleave),
                     heading, f"{published:g}"]
            if isinstance(value, str):
                reasons.append(f"[{len(reasons) + 1}] {row.name}, {heading}: {value}")
                lines.append(cells + [f"not yet expressible [{len(reasons)}]", "", f"±{target:.0%}", ""])
                continue
            ratio = value / published
            lines.append(cells + [f"{value:.4g}", f"{ratio:.3f}", f"±{target:.0%}", "yes" if abs(ratio - 1) <= target else "no"])
    return format_table(headers, lines) + "\n" + "\n".join(reasons)


def paper_accounting(row: Row) -> str:
    """What Fig. 1 counts for `row`, from the paper's formulas (Korthikanti et al. §4, Table 2),
    next to the published figures: parameters + optimiser 18 bytes (16-bit parameter, fp32
    gradient, fp32 main parameter and two Adam moments) per parameter of the layers' matrices,
    12·h²·l / (p·t) (no embedding, biases or norms); activations per layer s·b·h·(10 + 24/t +
    5·a·s/(h·t)) bytes without SP/selective and s·b·h·34/t with both (dropout masks and outputs
    included), times the layers a first stage holds in flight: l (1F1B: p micro-batches of l/p
    layers), times 1 + (p - 1)/(p·v) when interleaved over v > 1, with b sequences per micro-batch
    (the row's)."""
    shape = json.loads((ROOT / "configs" / "models" / row.model).read_text())
    h, a, l, s = shape["n_embd"], shape["n_head"], shape["n_layer"], 2048
    t, p, v = row.tp, row.pp, row.interleave
    weights = 18 * 12 * h * h * l // (p * t)
    factor = l * (1 + (p - 1) / (p * v)) if v > 1 else l
    b = row.micro_batch
    full = s * b * h * (10 + 24 / t + 5 * a * s / (h * t)) * factor
    selective = s * b * h * 34 / t * factor
    return (f"{row.name}: params + optimiser {weights / GIB:.2f} GiB (published {row.published['weights']:g}); "
            f"b = {b}: activations {full / GIB:.2f} (published {row.published['activations']:g}), "
            f"SP + selective {selective / GIB:.2f} (published {row.published['selective_activations']:g})")


def searched(row: Row, folder: Path, processes: int = 1, time_limit: float | None = None):
    """The plan-space search (`autostrat search`, `report.plan_space`) of `row`'s model, devices
    and global batch under the profile's 80 GiB, its candidates priced on `processes` processes
    within `time_limit` seconds (None: the whole branch and bound), and its wall seconds; or
    why it found none."""
    path = folder / f"{row.name}_search.yaml"
    path.write_text("\n".join(["hardware: a100-80gb", f"precision: {PRECISION}",
                               f"model: {{hf_config: {ROOT / 'configs' / 'models' / row.model}, params: {{seq: 2048}}}}",
                               f"global_batch: {row.global_batch}", f"device_num: {row.gpus}", ""]))
    started = time.perf_counter()
    try:
        found = search_plan_space(path, processes=processes, time_limit=time_limit, progress=lambda done, total: print(
            f"{row.name}: {done} of {total} candidates priced, {time.perf_counter() - started:.0f} s", file=sys.stderr,
            flush=True) if done % 25 == 0 or done == total else None)
    except AutostratError as error:
        found = str(error).split(": ", 1)[1]
    return found, time.perf_counter() - started


def _peak(estimate) -> float:
    return max(stage.peak_bytes for stage in estimate.memory) / GIB


def side_by_side(rows, plans: dict, searches: dict) -> str:
    """Per row, the published plan's predictions (the faster of its two recompute columns is the
    one to beat) next to the searched plan's, and the search's wall time against the 30 s target."""
    headers = ["model", "GPUs", "published plan", "step (s)", "peak (GiB)", "searched plan", "step (s)", "peak (GiB)",
               "fits 80 GiB", "searched / published", "priced / memory / time pruned / refused / not priced",
               "at most above the fastest", "search (s)", "<= 30 s"]
    lines, notes = [], []
    for row in rows:
        given = [(name, one) for name, one in plans[row.name].items() if not isinstance(one, str)]
        name, best = min(given, key=lambda item: item[1].step_time_s) if given else ("not expressible", None)
        published = [row.name, str(row.gpus), f"{row.tp}x{row.pp}x{row.dp} vp {row.interleave}, {name}",
                     f"{best.step_time_s:.4g}" if best else "", f"{_peak(best):.2f}" if best else ""]
        found, seconds = searches[row.name]
        if isinstance(found, str):
            notes.append(f"[{len(notes) + 1}] {row.name}: {found}")
            lines.append(published + [f"none found [{len(notes)}]", "", "", "", "", "", "", f"{seconds:.1f}", ""])
            continue
        counts, chosen = found.counts(), found.best.estimate
        broken = [one.name() for one in found.priced if one.estimate is not None and one.bound > one.peak_bytes]
        slow = [one.name() for one in found.priced if one.estimate is not None and one.time_bound > one.step_ns]
        notes.append(f"[{len(notes) + 1}] {row.name}: the memory floor is below the peak of every priced candidate: "
                     f"{'no, ' + ', '.join(broken) if broken else 'yes'}; the step-time bound below its step: "
                     f"{'no, ' + ', '.join(slow) if slow else 'yes'}")
        ratio = f"{chosen.step_time_s / best.step_time_s:.3f}" if best else ""
        lines.append(published + [found.best.name(), f"{chosen.step_time_s:.4g}", f"{_peak(chosen):.2f}",
                                  "yes" if _peak(chosen) * GIB <= 80 * GIB else "no", ratio,
                                  f"{counts['priced']} / {counts['pruned'] - counts['pruned_by_time']} / "
                                  f"{counts['pruned_by_time']} / {counts['refused']} / {counts['not_priced']}",
                                  f"{found.gap():.1%}", f"{seconds:.1f}", "yes" if seconds <= 30 else "no"])
    return format_table(headers, lines) + ("\n" + "\n".join(notes) if notes else "")


def bound_counts(rows, plans: dict) -> str:
    """Per row, the plan-space search's candidates, those past the memory floor, and those
    whose step-time bound (`report.plan_bound`) is below the published plan's predicted step:
    what branch and bound must price at most once that plan is found (every one it prices has a
    bound below the chosen step, which is at most the published plan's)."""
    headers = ["model", "GPUs", "candidates", "past the memory floor", "step bound < published plan's step",
               "published plan's step (s)", "op-level bound (s)"]
    lines = []
    for row in rows:
        best = min((one for one in plans[row.name].values() if not isinstance(one, str)),
                   key=lambda one: one.step_time_s, default=None)
        net = from_hf_config(ROOT / "configs" / "models" / row.model, seq=2048)
        shape, hardware = ModelShape.of(net), PROFILES["a100-80gb"]
        candidates = plan_candidates(row.gpus, row.global_batch, shape.layers, hardware.devices_per_server)
        activations, weights = LayerActivations.of(net), [shape.block_weights] * shape.layers
        past = [one for one in candidates
                if peak_floor(one, weights, PRECISION, activations, shape.seq) <= hardware.device_memory]
        below = "" if best is None else str(sum(step_time_bound(shape, one, hardware, PRECISION) < best.step_time_s * 1e9
                                                for one in past))
        lines.append([row.name, str(row.gpus), str(len(candidates)), str(len(past)), below,
                      "" if best is None else f"{best.step_time_s:.4g}",
                      f"{op_level_bound(shape, row.gpus, row.global_batch, hardware, PRECISION) / 1e9:.4g}"])
    return format_table(headers, lines)


STEP_TIMES = ("full", "selective")  # the step-time columns the fit reads


def fit_efficiency(rows, folder: Path, predicted: dict) -> tuple[float, dict, dict]:
    """The fitted matmul_efficiency over every expressible step-time entry (`STEP_TIMES`), per
    entry the ratio predicted with the factor fitted on the other entries, and per entry its
    two-point model (see the module docstring)."""
    models = {}
    for row in rows:
        for column in STEP_TIMES:
            if isinstance(predicted[row.name][column], str):
                continue
            shipped, half = predicted[row.name][column], PROFILES["a100-80gb"].matmul_efficiency / 2
            slower = estimated(row, folder, f"{column}_e{half}", recompute="full", selective=column == "selective",
                               efficiency=half).step_time_s
            flops = (slower - shipped) * half * 2  # T(e) = flops / e + rest, at e and at e / 2
            models[row.name, column] = (flops, shipped - flops / (half * 2), row.published[column])

    def ratio(entry, efficiency: float) -> float:
        flops, rest, published = models[entry]
        return (flops / efficiency + rest) / published

    def fitted(entries) -> float:
        def loss(efficiency):
            return sum(math.log(ratio(entry, efficiency)) ** 2 for entry in entries)
        low, high = 0.05, 1.0
        for _ in range(60):  # golden section on the model: the bracket shrinks below 1e-6
            a, b = high - (high - low) / 1.618034, low + (high - low) / 1.618034
            low, high = (low, b) if loss(a) <= loss(b) else (a, high)
        return round((low + high) / 2, 4)

    leave_one_out = {entry: ratio(entry, fitted([other for other in models if other != entry]))
                     for entry in models if len(models) > 1}
    return fitted(list(models)), leave_one_out, models


def efficiency_table(models: dict, efficiency: float, leave_one_out: dict) -> str:
    """Per step-time entry of the fit (`fit_efficiency`'s two-point `models`), published,
    predicted with the profile's matmul_efficiency as shipped and with the `efficiency` the fit
    gives, each one's error and the leave-one-out error; the last line their mean absolute
    relative errors (MARE): the factor before and after the fit, on one model."""
    shipped = PROFILES["a100-80gb"].matmul_efficiency
    headers = ["entry", "published (s)", "T(e) (s)", f"predicted at {shipped:g} (s)", "error",
               f"predicted at {efficiency:g} (s)", "error", "leave-one-out error"]
    lines, errors = [], {"shipped": [], "fitted": [], "out": []}
    for (name, column), (flops, rest, published) in models.items():
        before, after = flops / shipped + rest, flops / efficiency + rest
        out = leave_one_out.get((name, column), after / published)
        errors["shipped"].append(before / published - 1)
        errors["fitted"].append(after / published - 1)
        errors["out"].append(out - 1)
        lines.append([f"{name} {column}", f"{published:g}", f"{flops:.3f} / e + {rest:.3f}", f"{before:.4g}",
                      f"{before / published - 1:+.1%}", f"{after:.4g}", f"{after / published - 1:+.1%}", f"{out - 1:+.1%}"])

    def mare(found: list) -> str:
        return f"{sum(map(abs, found)) / len(found):.2%}" if found else ""

    lines.append(["MARE", "", "", "", mare(errors["shipped"]), "", mare(errors["fitted"]), mare(errors["out"])])
    return format_table(headers, lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", nargs="+", default=[row.name for row in ROWS], choices=[row.name for row in ROWS])
    parser.add_argument("--no-search", action="store_true", help="leave out the plan-space search of every row")
    parser.add_argument("--no-fit", action="store_true", help="leave out the efficiency fit")
    parser.add_argument("--terms", action="store_true", help="the activations of a layer term by term (one-stage rows)")
    parser.add_argument("--processes", type=int, default=2, help="processes pricing each search's candidates (this one among them)")
    parser.add_argument("--time-limit", type=float, help="seconds each search may price candidates (default: its whole "
                                                         "branch and bound)")
    args = parser.parse_args()
    rows = [row for row in ROWS if row.name in args.rows]
    started, predicted, plans, searches = time.perf_counter(), {}, {}, {}
    with tempfile.TemporaryDirectory(prefix="autostrat-published-") as work:
        folder = Path(work)
        for row in rows:
            row_started = time.perf_counter()
            predicted[row.name] = predictions(row, folder, plans)
            print(f"{row.name}: estimated in {time.perf_counter() - row_started:.1f} s", file=sys.stderr, flush=True)
        print("Korthikanti et al. 2022 (arXiv 2205.05198), Table 5 and Fig. 1, against autostrat estimate "
              f"(a100-80gb as shipped, fp16 with fp32 gradients: precision {PRECISION}):")
        print(table(rows, predicted), flush=True)
        print("\nThe plan-space search's candidates and its bounds (`report.plan_space`, `report.plan_bound`):")
        print(bound_counts(rows, plans), flush=True)
        for row in rows if not args.no_search else ():
            searches[row.name] = searched(row, folder, args.processes, args.time_limit)
            print(f"{row.name}: searched in {searches[row.name][1]:.1f} s", file=sys.stderr, flush=True)
        if searches:
            print("\nThe published plan against autostrat search's (the fastest predicted plan that fits 80 GiB, "
                  "report.plan_space; its candidates priced, pruned by the memory floor, pruned by the step-time "
                  "bound, refused):")
            print(side_by_side(rows, plans, searches), flush=True)
        fit_started = time.perf_counter()
        efficiency, leave_one_out, models = fit_efficiency(rows, folder, predicted) if not args.no_fit else (0, {}, {})
    if not args.no_fit:
        entries = ", ".join(f"{name} {column}" for name, column in models) or "no"
        print(f"\nfitted a100-80gb matmul_efficiency over the step-time entries {entries}: {efficiency:g} "
              f"(fit: {time.perf_counter() - fit_started:.1f} s; shipped: {PROFILES['a100-80gb'].matmul_efficiency:g})")
        print(efficiency_table(models, efficiency, leave_one_out), flush=True)
    print("\nWhat Fig. 1 counts (`paper_accounting`), in GiB:")
    for row in rows:
        fullest = predicted[row.name]["weights_fullest"]
        stage = "" if isinstance(fullest, str) else f"; predicted on the fullest stage, tables included, {fullest:.2f}"
        print("  " + paper_accounting(row) + stage)
    if args.terms:
        print_terms(rows)
    print(f"total {time.perf_counter() - started:.1f} s")


if __name__ == "__main__":
    main()
