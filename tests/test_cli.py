"""The `autostrat candidates` command behind `bash run.sh N`."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from autostrat.cli import main


def test_candidates_lists_every_tutorial_op_with_its_layouts(capsys):
    assert main(["candidates", "--device-num", "8"]) == 0
    out = capsys.readouterr().out
    for name in ("dense1.matmul", "dense1.bias_add", "relu", "dense2.matmul", "dense2.bias_add"):
        assert f"\n{name}  " in out
    # MindSpore's seed strategy, with its device matrix, maps and slice shapes.
    assert "((2, 1), (1, 4))  [2, 1, 4]      (2, 1) (1, 0)      (2, 0)             [32, 64] [64, 16] -> [32, 16]" in out
    assert out.count("(11 candidates)") == 2 and out.count("(5 candidates)") == 3


def test_candidates_for_six_devices():
    out = subprocess.run(
        [sys.executable, "-m", "autostrat", "candidates", "--device-num", "6"], capture_output=True, text=True, check=True
    ).stdout
    # 64 is not divisible by 3: every op keeps only the all-ones strategy on 6 devices.
    assert out.count("(1 candidates)") == 5 and "[1, 1, 1, 6]" in out


def test_bad_device_num_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["candidates", "--device-num", "0"])
    assert exit_info.value.code == 2
    assert "argument --device-num: expected a positive integer, got '0'" in capsys.readouterr().err


def test_search_prints_the_plan_and_writes_json_and_ir(tmp_path, capsys):
    out_file, ir_dir = tmp_path / "plan.json", tmp_path / "ir"
    assert main(["search", "configs/ffn.yaml", "--out", str(out_file), "--dump-ir", str(ir_dir)]) == 0
    out = capsys.readouterr().out
    assert "dense2.matmul    MatMul   ((2, 4), (4, 1))" in out and "total bytes per device: 6144" in out
    assert '"total_bytes_per_device": 6144' in out_file.read_text()
    assert sorted(p.name for p in ir_dir.iterdir()) == ["step_parallel_begin.ir", "validate_rank0.ir"]


def test_search_with_another_device_num(capsys):
    assert main(["search", "configs/mlp.yaml", "--device-num", "8"]) == 0
    assert "layers.3.matmul" in capsys.readouterr().out


def test_search_errors_are_one_line(tmp_path, capsys):
    config = tmp_path / "ffn16.yaml"
    config.write_text(Path("configs/ffn.yaml").read_text().replace("[[2, 1], [1, 4]]", "[[4, 1], [1, 4]]"))
    assert main(["search", str(config)]) == 2
    err = capsys.readouterr().err
    assert err == "autostrat: error: strategies.dense1.matmul: the strategy uses 16 devices but device_num is 8\n"


def test_python_dash_m_runs_the_search():
    out = subprocess.run([sys.executable, "-m", "autostrat", "search", "configs/ffn.yaml"], capture_output=True, text=True, check=True).stdout
    assert "ReduceScatter" in out


def test_search_with_refinement_and_a_memory_budget(capsys):
    assert main(["search", "configs/mlp.yaml", "--refine", "cpsat", "--time-limit", "30", "--max-device-memory", "200KB"]) == 0
    captured = capsys.readouterr()
    assert "refined by CP-SAT: 28672 -> 28672 bytes per device, OPTIMAL" in captured.out
    assert captured.err.startswith("\rCP-SAT: best ") and captured.err.endswith("\n")
    assert "; coarsened (exact): " in captured.out


def test_search_with_shared_layers_says_what_it_merged(capsys):
    assert main(["search", "configs/gpt.yaml", "--refine", "cpsat", "--coarsen", "layers", "--time-limit", "30"]) == 0
    out = capsys.readouterr().out
    assert "(over plans whose repeated layers agree)" in out
    assert "layers sharing variables: blocks.0-1 (2 layers)" in out


def test_an_impossible_budget_is_a_one_line_error(capsys):
    assert main(["search", "configs/mlp.yaml", "--max-device-memory", "1KB"]) == 2
    assert "autostrat: error: no plan fits max_device_memory = 1,024 bytes per device: the smallest achievable peak is" in capsys.readouterr().err
