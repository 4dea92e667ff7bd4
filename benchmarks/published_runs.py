"""The published training runs `benchmarks/published.py` predicts (Korthikanti et al. 2022,
Table 3 and Fig. 7; its docstring says where each figure comes from), and the estimate config of
each run's plan.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run beside a script: the repository may not be installed

from autostrat.errors import ConfigError  # noqa: E402
from autostrat.report.estimate import estimate  # noqa: E402
PRECISION = "bf16"  # fp16 with fp32 gradients, as the paper counts them (module docstring)
# Columns: key, heading, target (relative), published value's index in Row.published.
COLUMNS = (("full", "time, full recompute (s)", 0.15), ("selective", "time, SP + selective (s)", 0.15),
           ("weights", "params + optimiser (GiB)", 0.05), ("activations", "activations, no SP/selective (GiB)", 0.10),
           ("selective_activations", "activations, SP + selective (GiB)", 0.10))


@dataclass(frozen=True)
class Row:
    """One published run: model file, GPUs, TP x PP x DP, global batch, interleave, per column
    (`COLUMNS`) the published figure, and the sequences per micro-batch."""

    name: str
    model: str
    gpus: int
    tp: int
    pp: int
    dp: int
    global_batch: int
    interleave: int
    published: dict
    micro_batch: int = 1


ROWS = (
    # 22B: one micro-batch of the 4 sequences (the paper's formulas give its Fig. 1 bars at b = 4, module docstring).
    Row("22B", "gpt-22b.json", 8, 8, 1, 1, 4, 1,
        {"full": 1.42, "selective": 1.10, "weights": 45.56, "activations": 59.25, "selective_activations": 9.56}, 4),
    Row("175B", "gpt-175b.json", 64, 8, 8, 1, 64, 3,
        {"full": 18.13, "selective": 13.75, "weights": 45.56, "activations": 66.84, "selective_activations": 12.35}),
    Row("530B", "gpt-530b.json", 280, 8, 35, 1, 280, 3,
        {"full": 49.05, "selective": 37.83, "weights": 31.64, "activations": 114.02, "selective_activations": 23.08}),
    Row("1T", "gpt-1t.json", 512, 8, 64, 1, 512, 1,
        {"full": 94.42, "selective": 71.49, "weights": 32.96, "activations": 131.25, "selective_activations": 26.56}),
)
A100 = ("device_flops: 312.0e12\ndevice_memory_bandwidth: 2.039e12\nintra_server_bandwidth: 300.0e9\n"
        "inter_server_bandwidth: 25.0e9\nintra_server_latency: 2.0e-6\ninter_server_latency: 4.0e-6\ndevices_per_server: 8\n")


def config_text(row: Row, folder: Path, recompute: str, selective: bool = False, efficiency: float | None = None) -> str:
    """The estimate config of `row`'s plan (in `folder`: the profile file a fitted efficiency needs)."""
    hardware = "a100-80gb"
    if efficiency is not None:
        hardware = f"a100_{efficiency:.6f}.yaml"
        (folder / hardware).write_text(A100 + f"matmul_efficiency: {efficiency!r}\n")
    return "\n".join([
        f"hardware: {hardware}", f"precision: {PRECISION}",
        f"model: {{hf_config: {ROOT / 'configs' / 'models' / row.model}, params: {{seq: 2048}}}}",
        f"global_batch: {row.global_batch}",
        f"plan: {{tp: {row.tp}, pp: {row.pp}, vp: {row.interleave}, dp: {row.dp}, sequence_parallel: {str(selective).lower()}, "
        f"recompute: {'selective' if selective else recompute}, micro_batch: {row.micro_batch}}}", ""])


def estimated(row: Row, folder: Path, name: str, **choices):
    """`autostrat estimate` of `row` with `choices` (`config_text`), or the reason it refuses."""
    path = folder / f"{row.name}_{name}.yaml"
    path.write_text(config_text(row, folder, **choices))
    try:
        return estimate(path)
    except ConfigError as error:
        return str(error).split(": ", 1)[1]
