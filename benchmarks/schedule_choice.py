"""Issue #34: the schedule the search chooses on the published LLaMA 3.1 405B shape, against
torchtitan's measurement (interleaved 1F1B 128 tokens/s/GPU over 1F1B's 100: ratio 1.28).

Shape: configs/models/llama-3.1-405b.json (126 layers, hidden 16 384, 128 heads, 8 KV heads),
sequence 8192, on 512 H100s (the ``h100-sxm-80gb`` profile) as FSDP 8 x TP 8 x PP 8, local
batch 32 sequences per data-parallel rank, bf16, full recompute, Adam state split over the 8
data-parallel ranks (autostrat's ZeRO 1 stands for FSDP; parameters and gradients stay whole),
sequence parallel as torchtitan's TP plan has it (its norms ``SequenceParallel``: the residual
stream between blocks split over the 8 TP ranks; without it a block's checkpoint is 8 times
larger, 1.07 GB a micro-batch, and 1F1B's first device peaks at 184.6 GB, no schedule under 80).
torchtitan's micro-batches default to the pipeline degree: 8 micro-batches of 4 sequences.

How (cases):
- Unit costs: `autostrat estimate`'s planning (`report.estimate.given_plan_config`) of the
  same shape with 2 layers on one stage's 64 devices (tp 8 x dp 8), one micro-batch of
  ``8 x 32 / m`` sequences; its units (embedding, block 0, block 1, head and loss:
  `search.stages.unit_costs`) are extended to 126 blocks (block 0's costs for blocks 0-124, block
  1's for the last: alike blocks cost alike, tested in tests/test_stages.py, but the last block
  is not like the others: it holds less from B to W, 2.265 GB a micro-batch against 2.399. Every
  block, the last too, keeps its output, 0.134 GB a micro-batch (sequence-parallel), from F to B
  as the next unit's input, which that unit's backward reads as the original (a backward op reads
  the recomputed copies of its own block alone: `autodiff.recompute`; until it did, the head's
  backward read the last block's recomputed output, which kept no checkpoint, and every block
  recomputed its output's matmul, ffn_down, for the next block's backward: 4 % of the step); a
  3-layer plan's middle block has block 0's figures to the byte. Block 1's repeated 125 times,
  before, left 124 blocks' checkpoints out of every peak: without sequence parallel 1F1B peaked
  at 69.9 GB so, 184.6 with them).
- Each row: a schedule (1F1B, interleaved 1F1B with v = 2, 4, 8, ZB-H1, zbv) split by
  `search.schedule_split.split_stages` on 8 device groups, its simulated step (the
  micro-batches' part: the once-per-step gradient synchronisation and update, the same for
  every schedule, are left out of all rows) and bubble, the split model's largest group peak,
  the W inputs that group holds at most where the backward is split (`_w_inputs_held`), and
  tokens/s/device; the ratio to 1F1B. The search's own choice: `choose_schedule` over every
  candidate schedule and v and m in {8, 16, 32}, under 80 GB per device.

Why ZB-H1 peaks at 337.8 GB against 1F1B's 83.8: full recompute keeps a block's input (0.134 GB
a micro-batch, sequence-parallel) from F to B, but W's inputs (the matmuls' inputs, which B
recomputes, and the output gradients B writes: 2.40 GB a block) from B to W. ZB-H1's device d
runs micro-batch i's W after the B of i + d, so the last device (15 blocks and the head: 37.3 GB
of W inputs a micro-batch) runs no W before its 8th B and holds all 8 (the column "most B-to-W
held"): 21.8 GB of parameters and optimiser state, 7 x 37.3 waiting, and the 8th B's walk, 54.9
(the W inputs it leaves, the block it recomputes and the activation gradient it writes). The
runtime holds the same (tests/test_pipeline_memory.py: under recompute ZB-H1's last stage
measures the peak it has without recompute), as Qi et al.'s implementation does
(sail-sg/zero-bubble-pipeline-parallelism issue 74: under recompute ZB-H1's memory grows with
the stage). zbv holds back at most one micro-batch chunk's W on its peak group (2.4 GB): its
peak is not W's inputs. torchtitan measured 82.5 GiB (88.6 GB) for 1F1B and 72.7 GiB (78.1 GB)
for interleaved 1F1B (issue #34); the split's model gives 83.8 and 76.3 GB (v = 2).

Run: .venv/bin/python benchmarks/schedule_choice.py   (three 2-layer plans: a minute or two)
"""

from __future__ import annotations

import json
import sys
import tempfile
from dataclasses import fields, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from autostrat.frontend.run import plan_config  # noqa: E402
from autostrat.report.estimate import given_plan_config  # noqa: E402
from autostrat.search.schedule_split import choose_schedule, split_stages  # noqa: E402
from autostrat.search.schedules import schedule_orders  # noqa: E402
from autostrat.search.stages import UnitCosts, unit_costs  # noqa: E402
from autostrat.tables import format_table  # noqa: E402

LAYERS, SEQ, DP, TP, PP, LOCAL_BATCH = 126, 8192, 8, 8, 8, 32
BUDGET = 80 * 10**9
ROWS = [("1f1b", 1), ("interleaved_1f1b", 2), ("interleaved_1f1b", 4), ("interleaved_1f1b", 8), ("zero_bubble_h1", 1), ("zbv", 2)]
CONFIG = """hardware: h100-sxm-80gb
precision: bf16
model: {{hf_config: {model}, params: {{seq: {seq}}}}}
global_batch: {batch}
plan: {{tp: {tp}, pp: 1, dp: {dp}, sequence_parallel: true, recompute: full, zero: 1, micro_batch: {per_rank}}}
"""


def micro_batch_costs(micro_batches: int) -> UnitCosts:
    """The 405B shape's unit costs of one of `micro_batches` micro-batches on one stage's devices."""
    per_rank = LOCAL_BATCH // micro_batches
    with tempfile.TemporaryDirectory() as folder:
        model = json.loads((ROOT / "configs/models/llama-3.1-405b.json").read_text()) | {"num_hidden_layers": 2}
        (Path(folder) / "405b-2.json").write_text(json.dumps(model))
        path = Path(folder) / "405b.yaml"
        path.write_text(CONFIG.format(model=Path(folder) / "405b-2.json", seq=SEQ, batch=DP * per_rank, tp=TP, dp=DP,
                                      per_rank=per_rank))
        config, _ = given_plan_config(path)
        plan, _ = plan_config(config)
    return _extended(unit_costs(plan, plan.hardware))


def _extended(costs: UnitCosts) -> UnitCosts:
    """The 2-layer units (embedding, block 0, block 1, head) with block 0's repeated to `LAYERS - 1`
    blocks before the last (module docstring): every per-unit figure (each tuple field, filled per unit by `UnitCosts`), so a figure added
    to `UnitCosts` is spread too."""
    picks = [0] + [1] * (LAYERS - 1) + [2, 3]
    per_unit = {field.name: getattr(costs, field.name) for field in fields(costs) if isinstance(getattr(costs, field.name), tuple)}
    return replace(costs, **{name: tuple(figures[index] for index in picks) for name, figures in per_unit.items()})


def _w_inputs_held(costs: UnitCosts, split, schedule) -> str:
    """On the device group of the split's largest model peak, the most micro-batch chunks it
    holds between a B and its W (walking its order) and their W inputs (`weight_held_bytes`)."""
    if not schedule.split_backward:
        return "-"
    device = max(range(schedule.devices), key=lambda group: split.peak_bytes[group])
    per_chunk = [sum(costs.weight_held_bytes[first:end]) for first, end in
                 (split.bounds[schedule.stage(device, chunk)] for chunk in range(schedule.chunks))]
    waiting, most, held = [0] * schedule.chunks, 0, 0
    for instruction in schedule.orders[device]:
        waiting[instruction.chunk] += (instruction.kind == "B") - (instruction.kind == "W")
        if sum(waiting) > most:
            most, held = sum(waiting), sum(count * size for count, size in zip(waiting, per_chunk))
    return f"{device}: {most} ({held / 1e9:,.1f} GB)"


def _tokens_per_s(step_ns: int) -> float:
    return DP * LOCAL_BATCH * SEQ / (step_ns / 1e9) / (DP * TP * PP)


def main() -> None:
    costs = {m: micro_batch_costs(m) for m in (8, 16, 32)}
    rows, base = [], None
    for name, chunks in ROWS:
        schedule = schedule_orders(name, PP, 8, chunks)
        split = split_stages(costs[8], schedule)
        base = base or split.step_time_ns
        rows.append([f"{name} v={chunks}", "8", f"{split.step_time_ns / 1e9:,.3f}", f"{split.bubble:.3f}",
                     f"{max(split.peak_bytes) / 1e9:,.1f}", _w_inputs_held(costs[8], split, schedule),
                     f"{_tokens_per_s(split.step_time_ns):,.1f}",
                     f"{base / split.step_time_ns:.3f}"])
    choices = choose_schedule(lambda m: costs[m], PP, (8, 16, 32), BUDGET)
    if choices:
        best = choices[0]
        rows.append([f"search: {best.schedule} v={best.chunks}", str(best.micro_batches), f"{best.split.step_time_ns / 1e9:,.3f}",
                     f"{best.split.bubble:.3f}", f"{max(best.split.peak_bytes) / 1e9:,.1f}",
                     _w_inputs_held(costs[best.micro_batches], best.split,
                                    schedule_orders(best.schedule, PP, best.micro_batches, best.chunks)),
                     f"{_tokens_per_s(best.split.step_time_ns):,.1f}", f"{base / best.split.step_time_ns:.3f}"])
    else:
        rows.append(["search: no schedule fits 80 GB by the split's model", "", "", "", "", "", "", ""])
    headers = ["schedule", "m", "step (s)", "bubble", "model peak (GB)", "its group: most B-to-W held", "tokens/s/device", "vs 1F1B (target 1.28 ± 0.10)"]
    print(format_table(headers, rows))


if __name__ == "__main__":
    main()
