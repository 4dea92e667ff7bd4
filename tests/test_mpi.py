"""The runtime under real MPI ranks (`autostrat run` -> mpiexec), and what happens when a rank
fails: it raises, is killed, hangs in a collective or loops forever."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from autostrat.errors import RuntimeBackendError
from autostrat.runtime import launcher
from autostrat.runtime.launcher import alive, rank_pids

ROOT = Path(__file__).resolve().parent.parent


def run(tmp_path, *args, timeout=90, env=None):
    """`autostrat run` in a subprocess, with `env` added to the environment; returns (exit
    status, stdout, stderr, run dir, seconds)."""
    run_dir = tmp_path / "run"
    command = [sys.executable, "-m", "autostrat", "run", *args, "--run-dir", str(run_dir)]
    started = time.monotonic()
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=os.environ | (env or {}))
    return done.returncode, done.stdout, done.stderr, run_dir, time.monotonic() - started


def assert_nothing_left(run_dir: Path, device_num: int) -> None:
    pids = rank_pids(run_dir, device_num)
    assert pids, f"no rank recorded its pid in {run_dir}"
    assert not [pid for pid in pids.values() if alive(pid)]
    leftover = subprocess.run(["pgrep", "-f", str(run_dir)], capture_output=True, text=True).stdout.split()
    assert not leftover, f"processes of the run still alive: {leftover}"


@pytest.mark.parametrize("config", ["ffn", "mlp", "gpt", "resnet", "transformer_stack"])
def test_config_on_8_mpi_ranks(tmp_path, config):
    code, out, err, run_dir, _ = run(tmp_path, f"configs/{config}.yaml", "--device-num", "8", "--steps", "1")
    assert code == 0, err
    assert "bytes: measured = predicted on every rank" in out
    assert ": OK" in out
    assert (run_dir / "report.txt").exists() and (run_dir / "rank_7" / "log").exists()
    assert_nothing_left(run_dir, 8)
    assert_peaks_within(out, 8)
    if config == "transformer_stack":  # bucket_bytes: its sync ran on the stream, as equal to the reference and bytes as above
        assert re.search(r"gradient synchronisation: \d+ step\(s\) in \d+ bucket\(s\) on the communication stream", out), out


def assert_peaks_within(out: str, device_num: int, tolerance: float = 0.05) -> None:
    """The report's peak memory line: every rank's measured peak within `tolerance` of the
    predicted one."""
    [line] = [line for line in out.splitlines() if line.startswith("peak memory per device (bytes)")]
    predicted = int(re.search(r"predicted (\d+);", line).group(1))
    measured = {}
    for first, last, value in re.findall(r"rank (\d+)(?:-(\d+))? (\d+)", line):
        for rank in range(int(first), int(last or first) + 1):
            measured[rank] = int(value)
    assert sorted(measured) == list(range(device_num)), line
    for rank, peak in measured.items():
        assert abs(peak / predicted - 1) <= tolerance, f"rank {rank}: measured {peak} bytes, predicted {predicted}: {line}"


@pytest.mark.slow
@pytest.mark.parametrize("config,device_num", [("ffn", 4), ("gpt", 4), ("mlp", 6), ("resnet", 6)])
def test_config_on_4_and_6_mpi_ranks(tmp_path, config, device_num):
    code, out, err, _, _ = run(tmp_path, f"configs/{config}.yaml", "--device-num", str(device_num), "--steps", "1")
    assert code == 0, err
    assert "bytes: measured = predicted on every rank" in out and ": OK" in out


def test_tutorial_reports_one_reduce_scatter(tmp_path):
    code, out, err, _, _ = run(tmp_path, "configs/ffn.yaml", "--device-num", "8")
    assert code == 0, err
    assert "dense2.matmul:0 -> dense2.bias_add[0]: ReduceScatter (forward) sent 6144, predicted 6144" in out


FAULTS = [
    ("raise", "job failed: rank 2: RuntimeError: injected failure at instruction"),
    ("kill", "job failed: rank 2 (pid"),
    ("hang", "job failed: rank 2: no progress for"),
    ("loop", "job failed: rank 2: no progress for"),
]


@pytest.mark.slow
@pytest.mark.parametrize("kind,message", FAULTS, ids=[kind for kind, _ in FAULTS])
def test_a_failing_rank_ends_the_job(tmp_path, kind, message):
    # How long the job takes depends on the machine's load (a bound of 30 s failed at load
    # average 20), so the global limit is only a generous outer bound: the job must end by the
    # failing rank's doing, which the message and an exit status other than the limit's (124) show.
    code, out, err, run_dir, _ = run(
        tmp_path, "configs/ffn.yaml", "--device-num", "4", "--inject-fault", f"2:{kind}", "--stall-timeout", "3",
        "--timeout", "300", timeout=400,
    )
    assert code not in (0, 124), err
    assert message in err, err
    assert_nothing_left(run_dir, 4)


def test_the_global_timeout_kills_everything(tmp_path):
    # A stall limit longer than the job's time limit: only the launcher can end this job.
    code, _, err, run_dir, seconds = run(
        tmp_path, "configs/ffn.yaml", "--inject-fault", "1:loop", "--stall-timeout", "100", "--timeout", "6"
    )
    assert code == 124
    assert "the job did not finish within 6 s and was killed" in err
    assert seconds < 30
    assert_nothing_left(run_dir, 8)


def test_too_few_ranks_fail_before_any_collective(tmp_path):
    from autostrat.frontend.run import RunOptions, prepare_run
    from autostrat.runtime.job_file import save_job

    job, _, _ = prepare_run(ROOT / "configs/ffn.yaml", RunOptions(steps=1))
    digest = save_job(job, tmp_path)
    result = launcher.launch(tmp_path, 4, timeout=60, digest=digest)
    assert result.returncode != 0
    assert "is for device_num 8 but 4 ranks are running" in result.message


def test_rank_table_hosts_run_the_job(tmp_path):
    table = {
        "version": "1.0", "server_count": "2", "status": "completed",
        "server_list": [
            {"server_id": host, "host_nic_ip": "reserve", "device": [
                {"device_id": str(i), "device_ip": f"192.1.27.{i}", "rank_id": str(4 * s + i)} for i in range(4)]}
            for s, host in enumerate(["localhost", "127.0.0.1"])
        ],
    }
    path = tmp_path / "rank_table.json"
    path.write_text(json.dumps(table))
    # Both "servers" are this machine, under two names: the ofi/TCP settings for several hosts apply.
    # The table's 2 servers x 4 make the MLP's gradient AllReduces and its AllGathers over all 8
    # ranks hierarchical (tests/test_collective_algorithms.py): run as such, with the predicted bytes.
    code, out, err, run_dir, _ = run(tmp_path, "configs/mlp.yaml", "--rank-table", str(path), "--steps", "1",
                                     "--phase", "train")
    assert code == 0, err
    assert (run_dir / "hostfile").read_text() == "localhost:4\n127.0.0.1:4\n"
    assert "mlp.yaml: MLP on 8 ranks (MPI)" in out
    assert "bytes: measured = predicted on every rank" in out and ": OK" in out
    assert "hierarchical:4" in "".join(p.read_text(errors="replace") for p in run_dir.glob("*") if p.is_file())


def test_missing_mpi_runtime_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    with pytest.raises(RuntimeBackendError, match="no MPI runtime: expected mpiexec at"):
        launcher.find_mpiexec()


def test_a_bad_rank_table_stops_before_any_process(tmp_path):
    path = tmp_path / "table.json"
    path.write_text(json.dumps({"version": "1.0", "server_count": "1", "status": "completed", "server_list": [
        {"server_id": "localhost", "device": [{"device_id": "0", "device_ip": "x", "rank_id": "1"}]}]}))
    code, _, err, run_dir, _ = run(tmp_path, "configs/ffn.yaml", "--rank-table", str(path))
    assert code == 2
    assert "server_list[0].device[0].rank_id: expected 0" in err
    assert not run_dir.exists()


@pytest.mark.parametrize("device_num", [4, 8])
def test_every_step_kind_agrees_with_the_simulation_under_mpi(device_num):
    from tests.test_runtime import LAYOUT_PAIRS

    command = [str(launcher.find_mpiexec()), "-n", str(device_num), sys.executable, "-m", "mpi4py", "tests/mpi_layout_pairs.py"]
    env = launcher.mpi_environment(device_num) | {"PYTHONPATH": str(ROOT), "MPIEXEC_TIMEOUT": "60"}
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=90, env=env)
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stdout.splitlines() if not line.startswith("ok algorithms")]
    assert len(lines) == sum(1 for pair in LAYOUT_PAIRS if np.prod(pair[0]) == device_num) and all(l.startswith("ok ") for l in lines)
    assert f"ok algorithms AllReduce/doubling over {device_num - 1} ranks" in done.stdout  # and the re-chosen pairs passed
    if device_num == 8:
        assert any("CollectivePermute" in line for line in lines)
        assert any("PartialCreate" in line for line in lines)


@pytest.mark.slow
def test_tutorial_trains_on_8_mpi_ranks_like_stand_alone():
    """`bash run.sh 8` (no config) trains the tutorial FFN on 8 ranks and checks it."""
    result = subprocess.run(["bash", "run.sh", "8"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "  20       " in result.stdout and "measured = predicted on every rank" in result.stdout
    assert "(limit 1e-05): OK" in result.stdout


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["megatron", "data_parallel"])
def test_gpt_trains_with_adam_on_8_mpi_ranks_like_stand_alone(mode):
    """The GPT sample, one process per rank: the loss curve and final parameters equal the
    stand-alone run and every rank's measured bytes equal the plan's."""
    sample = ROOT / "sample_code" / "gpt_training"
    command = [str(launcher.find_mpiexec()), "-n", "8", sys.executable, "-m", "mpi4py", "train.py", mode, "4"]
    result = subprocess.run(command, cwd=sample, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "step 4/4: loss" in result.stdout and "measured = predicted on every rank" in result.stdout
    assert "(limit 1e-05): OK" in result.stdout
    assert_peaks_within(result.stdout, 8)  # gathered by train_collective
    if mode == "data_parallel":
        assert "forward 0, backward 0, sync 822528" in result.stdout


@pytest.mark.slow
def test_a_training_config_trains_on_8_mpi_ranks(tmp_path):
    code, out, err, run_dir, _ = run(tmp_path, "configs/gpt_train.yaml", "--steps", "2", timeout=180)
    assert code == 0, err
    assert "2 training step(s)" in out and "bytes: measured = predicted on every rank" in out
    assert "(every step's outputs and the final parameters and optimiser state, each tensor on its own scale" in out
    assert ": OK" in out and "reference: JAX" in out
    assert_nothing_left(run_dir, 8)
    assert_peaks_within(out, 8)


@pytest.mark.slow
@pytest.mark.parametrize("config", ["llama_train", "moe_train"])
def test_a_llama_from_config_json_trains_on_8_mpi_ranks(tmp_path, config):
    """configs/llama_train.yaml: the tiny LLaMA of configs/models/llama-tiny.json (RMSNorm,
    rotary embeddings, 8 query heads over 4 kv heads, SwiGLU), TP 4 x DP 2, Adam;
    configs/moe_train.yaml: the tiny Mixtral of configs/models/mixtral-tiny.json, 8 experts
    split EP 4 x ETP 2, tokens dispatched by AllToAll from the split by sequence."""
    code, out, err, run_dir, _ = run(tmp_path, f"configs/{config}.yaml", "--steps", "2", timeout=180)
    assert code == 0, err
    assert "2 training step(s)" in out and "bytes: measured = predicted on every rank" in out
    assert ": OK" in out and "reference: JAX" in out
    assert_nothing_left(run_dir, 8)
    assert_peaks_within(out, 8)


@pytest.mark.slow
def test_the_tiny_mixtral_with_experts_split_8_ways_trains_on_8_mpi_ranks(tmp_path):
    """configs/moe_train.yaml with EP 8 and no ETP (`tests.test_moe.EP_ONLY`, the seeds the
    local-rank test gives it): one expert per rank, the tokens dispatched by one AllToAll over
    the 8 ranks; equal to the JAX reference, every message counted at its send as predicted."""
    import yaml

    from tests.test_moe import EP_ONLY

    config = yaml.safe_load((ROOT / "configs/moe_train.yaml").read_text())
    config["strategies"] |= EP_ONLY
    config["model"]["hf_config"] = str(ROOT / "configs/models/mixtral-tiny.json")
    path = tmp_path / "moe_ep8.yaml"
    path.write_text(yaml.safe_dump(config))
    code, out, err, run_dir, _ = run(tmp_path, str(path), "--steps", "2", timeout=180)
    assert code == 0, err
    assert "2 training step(s)" in out and "bytes: measured = predicted on every rank" in out
    assert ": OK" in out and "reference: JAX" in out
    assert "blocks.0.moe.dispatch:0 -> blocks.0.moe.expert_gate[0]: AllToAll (forward) sent 5376, predicted 5376" in out
    assert_nothing_left(run_dir, 8)
    assert_peaks_within(out, 8)


@pytest.mark.slow
def test_the_three_context_parallel_forms_train_on_8_mpi_ranks(tmp_path):
    """configs/cp/llama_cp_train.yaml: DP 2 x CP 4, one block's attention in each form (all-gather,
    Ulysses, ring) in one job: equal to the JAX reference, and every message counted at its send,
    the ring's inside the op among them, equal to the plan's prediction."""
    code, out, err, run_dir, _ = run(tmp_path, "configs/cp/llama_cp_train.yaml", "--steps", "2", timeout=180)
    assert code == 0, err
    assert "2 training step(s)" in out and "bytes: measured = predicted on every rank" in out
    assert ": OK" in out and "reference: JAX" in out
    assert "blocks.0.attention.value_heads:0 -> blocks.0.attention.attend[2]: AllGather" in out
    assert "blocks.1.attention.split_query:0 -> blocks.1.attention.query_heads[0]: AllToAll" in out
    assert "blocks.2.attention.attend (ring): Ring (forward) sent 3072, predicted 3072" in out
    assert_nothing_left(run_dir, 8)
    assert_peaks_within(out, 8)
