"""Sample code and benchmark scripts run to completion and print what they promise."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run(script: str) -> str:
    return subprocess.run([sys.executable, str(ROOT / script)], capture_output=True, text=True, check=True).stdout


def test_tensor_layout_sample_reproduces_the_tutorial_figure():
    out = run("sample_code/tensor_layout/layout.py")
    assert "device matrix [2, 1, 4]" in out
    assert "4     (1, 0, 0)   128-255  0-15" in out
    # The local MatMuls reduce over all of k as the whole one does, but BLAS may block a
    # [128, 784] product differently from a [256, 784] one: float32 rounding, not zero.
    error = float(re.search(r"max relative error (\S+)", out).group(1))
    assert error <= 1e-6


def test_candidates_benchmark_prints_its_table():
    out = run("benchmarks/candidates.py")
    assert out.splitlines()[0].split() == ["device_num", "op", "candidates", "cold", "ms", "warm", "us"]
    assert "8           qkv MatMul          11" in out


def test_sharding_propagation_sample_checks_the_tutorial():
    out = run("sample_code/sharding_propagation/train.py")  # one process: the 8 ranks as threads
    assert "step 20/20: loss" in out
    assert "measured = predicted on every rank" in out
    assert "(limit 1e-05): OK" in out


def test_scale_benchmark_prints_a_row_per_case():
    # One 1-layer 7B-wide case on 8 devices plans in about a second, in its own process.
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks/scale.py"), "--models", "7b", "--layers", "1",
                          "--devices", "8", "--seeding", "megatron", "--timeout", "120"],
                         capture_output=True, text=True, check=True, timeout=120).stdout
    header, row = out.strip().splitlines()[-2:]
    assert header.split()[:4] == ["model", "devices", "layers", "seeding"]
    columns = row.split()
    assert columns[:4] == ["7b", "8", "1", "megatron"]
    assert float(columns[-5]) > 0  # peak MB, measured in the child
    assert columns[-2:] == ["ok", "-"]  # no target for a shortened model
