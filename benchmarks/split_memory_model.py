"""Issue #34: the stage split's own memory model (`schedule_split.group_peaks`, what the split is
searched with) against the peak every rank measures, per device group, on every schedule.

Cases: a 4-layer GPT and an 8-block stack (hidden 64, 4 heads, seq 16, batch 8, Adam) on 8
devices as 2 device groups, 4 micro-batches, each schedule (v = 2 for interleaved_1f1b and
zbv); configs/gpt_pipeline.yaml at 8 and 16 devices; a 4-block stack (hidden 32) with
Megatron seeds as 2 and 4 stages. Each plan is trained for 2 steps on LocalBackend threads;
"measured" is the most a rank of the group held (`runtime.held_memory`, the arrays
themselves). Target: model / measured within 5 % of 1.

Run: .venv/bin/python benchmarks/split_memory_model.py
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run as a script: the repository is not installed

from autostrat import nn, reset_auto_parallel_context, set_auto_parallel_context  # noqa: E402
from autostrat.frontend.config import load_config  # noqa: E402
from autostrat.frontend.run import plan_config  # noqa: E402
from autostrat.frontend.train import reference_graph, synthetic_batches, training_plan  # noqa: E402
from autostrat.models import GPT, TransformerStack, megatron_seeds  # noqa: E402
from autostrat.runtime.executor import graph_values  # noqa: E402
from autostrat.runtime.training import train_locally  # noqa: E402
from autostrat.tables import format_table  # noqa: E402

SCHEDULES = (("1f1b", 1), ("gpipe", 1), ("interleaved_1f1b", 2), ("zero_bubble_h1", 1), ("zbv", 2))


def _cell_plan(net, stages: int, schedule: str, chunks: int, seeds: dict):
    reset_auto_parallel_context()
    set_auto_parallel_context(parallel_mode="auto_parallel", device_num=8, pipeline_stages=stages,
                              pipeline_config={"pipeline_scheduler": schedule}, pipeline_interleave_num=chunks)
    primitives = dict(net.primitives_and_names())
    for name, (strategy, _) in seeds.items():
        primitives[name].shard(strategy)
    cell = nn.TrainOneStepCell(nn.PipelineCell(net, micro_size=4), nn.Adam(net.trainable_params(), learning_rate=1e-3))
    return training_plan(cell, None, net.example_inputs())[0]


def cases():
    for schedule, chunks in SCHEDULES:
        for name, build in (("GPT 4x64", lambda: GPT(layers=4, hidden=64, heads=4, seq=16, batch=8)),
                            ("stack 8x64", lambda: TransformerStack(layers=8, hidden=64, heads=4, seq=16, batch=8))):
            yield f"{name}, 2 groups, {schedule} v{chunks}", _cell_plan(build(), 2, schedule, chunks, {})
    for device_num in (8, 16):
        reset_auto_parallel_context()
        yield f"configs/gpt_pipeline.yaml at {device_num}", plan_config(load_config(ROOT / "configs" / "gpt_pipeline.yaml"), device_num)[0]
    for stages, schedule in ((2, "1f1b"), (4, "1f1b"), (4, "zero_bubble_h1")):
        net = TransformerStack(layers=4, hidden=32, heads=4, seq=8, batch=8)
        yield f"stack 4x32 Megatron, {stages} stages, {schedule}", _cell_plan(net, stages, schedule, 1, megatron_seeds(4, 8 // stages))


def row(name: str, plan) -> list[str]:
    graph = reference_graph(plan)
    measured = train_locally(plan, graph_values(graph, {}), synthetic_batches(graph, 2)).measured_peaks
    group = plan.pipeline.group_size
    most = [max(measured[device * group:(device + 1) * group]) for device in range(plan.pipeline.devices)]
    ratios = [model / held for model, held in zip(plan.pipeline.split.peak_bytes, most)]
    return [name, ", ".join(f"{m:,}" for m in plan.pipeline.split.peak_bytes), ", ".join(f"{m:,}" for m in most),
            ", ".join(f"{r:.3f}" for r in ratios), "yes" if all(abs(r - 1) <= 0.05 for r in ratios) else "no"]


def main() -> None:
    rows = [row(name, plan) for name, plan in cases()]
    print(format_table(["case", "split's model per group", "measured per group", "model/measured", "within 5 %"], rows))


if __name__ == "__main__":
    main()
