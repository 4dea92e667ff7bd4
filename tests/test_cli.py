"""The `autostrat candidates` command behind `bash run.sh N`."""

from __future__ import annotations

import re
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
    assert sorted(p.name for p in ir_dir.iterdir()) == ["step_parallel_begin_0000.ir", "step_parallel_end_0001.ir"]


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
    # The per-op model's optimum (28 672 bytes) writes copies that peak at 206 368 bytes: the
    # search asks again for a plan its model puts lower, and that one fits.
    assert ("refined by CP-SAT: 28672 -> 32768 bytes per device, OPTIMAL among candidates with every divisor as a "
            "split, repeated calculation allowed (under 175,648 bytes for the per-op memory "
            "model, so that the plan's copies fit the budget)") in captured.out
    assert "peak memory per device: 185632 bytes" in captured.out
    assert "; coarsened (exact): " in captured.out


def test_search_with_shared_layers_says_what_it_merged(capsys):
    assert main(["search", "configs/gpt.yaml", "--refine", "cpsat", "--coarsen", "layers", "--time-limit", "30"]) == 0
    out = capsys.readouterr().out
    assert "(over plans whose repeated layers agree)" in out
    assert "layers sharing variables: blocks.0-1 (2 layers)" in out


def test_an_impossible_budget_is_a_one_line_error(capsys):
    assert main(["search", "configs/mlp.yaml", "--max-device-memory", "1KB"]) == 2
    err = capsys.readouterr().err  # below the peak floor: refused before any cost table
    assert err.startswith("autostrat: error: no choice of strategies fits max_device_memory = 1,024 bytes per device: ") and err.count("\n") == 1


def test_version(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0 and re.fullmatch(r"autostrat \d+\.\d+\.\d+\n", capsys.readouterr().out)


def test_run_help_says_it_starts_mpiexec_and_documents_fault_injection(capsys):
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "then start the ranks itself (mpiexec of the mpich wheel in this environment" in help_text
    assert "--inject-fault RANK:KIND[:AT] make one rank fail on purpose" in help_text
    assert "KIND is hang, kill, loop, raise" in help_text


@pytest.mark.parametrize("argv,message", [
    (["run", "configs/ffn.yaml", "--steps", "0"], "argument --steps: expected a positive integer, got '0'"),
    (["run", "configs/ffn.yaml", "--steps", "-2"], "argument --steps: expected a positive integer, got '-2'"),
    (["run", "configs/ffn.yaml", "--timeout", "-1"], "argument --timeout: expected a positive number, got '-1'"),
    (["run", "configs/ffn.yaml", "--stall-timeout", "0"], "argument --stall-timeout: expected a positive number, got '0'"),
    (["run", "configs/ffn.yaml", "--timeout", "nan"], "argument --timeout: expected a positive number, got 'nan'"),
    (["run", "configs/ffn.yaml", "--device-num", "0"], "argument --device-num: expected a positive integer, got '0'"),
    (["search", "configs/ffn.yaml", "--time-limit", "0"], "argument --time-limit: expected a positive number, got '0'"),
    (["run", "configs/ffn.yaml", "--stall-timeout", "nan"], "argument --stall-timeout: expected a positive number, got 'nan'"),
    (["run", "configs/ffn.yaml", "--seed", "-1"], "argument --seed: expected a whole number >= 0, got '-1'"),
])
def test_options_no_run_can_honour_are_usage_errors(argv, message, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(argv + (["--run-dir", str(tmp_path / "run")] if argv[0] == "run" else []))
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_warnings_are_one_line_for_a_person(tmp_path):
    config = tmp_path / "disagree.yaml"
    config.write_text(Path("configs/ffn.yaml").read_text().replace(
        "  dense1.matmul: [[2, 1], [1, 4]]\n", "  dense1.matmul: [[2, 1], [1, 4]]\n  dense1.bias_add: [[8, 1], [1]]\n"))
    done = subprocess.run([sys.executable, "-m", "autostrat", "search", str(config)], capture_output=True, text=True, check=True)
    assert done.stderr == ("autostrat: warning: seeds of dense1.matmul and dense1.bias_add disagree on dense1.matmul:0: "
                           "a redistribution of 1536 bytes per device is inserted\n")
