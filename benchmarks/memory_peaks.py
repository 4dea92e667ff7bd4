"""Issue #16, item 4: the predicted peak memory per device next to what every rank measures.

Every config of configs/ (training ones for two steps with their optimiser, forward ones for
one step) and the 2-layer GPT (hidden 64, 4 heads, seq 16, batch 8, Adam) under a few
strategies, run on LocalBackend threads. Columns: case; device_num; the plan's predicted peak
(`plan.prediction.peak_bytes`); the smallest and largest peak a rank measured
(`executor.RankResult.peak_bytes`); the smallest and largest ratio measured / predicted.
Target: every ratio within 5 % of 1 on the training configs and the GPT.

Run: .venv/bin/python benchmarks/memory_peaks.py
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from autostrat import nn, reset_auto_parallel_context, set_auto_parallel_context
from autostrat.frontend.config import load_config
from autostrat.frontend.run import plan_config
from autostrat.frontend.train import TrainOneStepCell, synthetic_batches, training_plan
from autostrat.models import GPT, megatron_seeds
from autostrat.runtime.executor import execute, graph_values
from autostrat.runtime.job import random_batch
from autostrat.runtime.local import LocalCluster
from autostrat.runtime.program import lower_programs
from autostrat.runtime.training import train_locally
from autostrat.tables import format_table

ROOT = Path(__file__).resolve().parent.parent


def measured_peaks(plan) -> list[int]:
    """Every rank's peak: over two training steps, or one forward step."""
    values = graph_values(plan.graph, {})
    if plan.graph.updates:
        return list(train_locally(plan, values, synthetic_batches(plan.graph, 2)).measured_peaks)
    programs, batch = lower_programs(plan), random_batch(plan.graph, np.random.default_rng(0))
    results = LocalCluster(plan.device_num).run(lambda backend: execute(programs[backend.rank], backend, values | batch))
    return [result.peak_bytes for result in results]


def gpt_plan(mode: str, device_num: int, model_parallel: int):
    net = GPT(layers=2, hidden=64, heads=4, seq=16, batch=8)
    set_auto_parallel_context(parallel_mode=mode, device_num=device_num)
    for name, (strategy, _) in (megatron_seeds(2, model_parallel, data_parallel=device_num // model_parallel)
                                if model_parallel else {}).items():
        primitive = net
        for part in name.split("."):
            primitive = primitive[int(part)] if part.isdigit() else getattr(primitive, part)
        primitive.shard(strategy)
    plan, _, _ = training_plan(TrainOneStepCell(net, nn.Adam(net.trainable_params(), 1e-3)), None, net.example_inputs(), 2)
    reset_auto_parallel_context()
    return plan


def cases():
    for path in sorted((ROOT / "configs").glob("*.yaml")):
        yield f"configs/{path.name}", plan_config(load_config(path))[0]
    for name, mode, device_num, model_parallel in (("megatron tp4 dp2", "auto_parallel", 8, 4),
                                                   ("megatron tp8", "auto_parallel", 8, 8),
                                                   ("megatron tp2", "auto_parallel", 2, 2),
                                                   ("data parallel", "data_parallel", 8, 0),
                                                   ("unseeded", "auto_parallel", 4, 0)):
        yield f"GPT 2x64 {name}", gpt_plan(mode, device_num, model_parallel)


def main() -> None:
    rows = []
    for name, plan in cases():
        predicted, measured = plan.prediction.peak_bytes, measured_peaks(plan)
        rows.append([name, str(plan.device_num), str(predicted), str(min(measured)), str(max(measured)),
                     f"{min(measured) / predicted:.4f}", f"{max(measured) / predicted:.4f}"])
    print(format_table(["case", "devices", "predicted", "measured min", "measured max", "ratio min", "ratio max"], rows))


if __name__ == "__main__":
    main()
