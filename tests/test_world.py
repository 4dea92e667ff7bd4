"""A plan runs only in a world of its own size, and every device count from 1 to 8 runs.

Each execution path (autostrat run, train, run_forward, Model under mpiexec, the samples)
compares the world with the plan's device_num before its first step.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from autostrat import nn, reset_auto_parallel_context, set_auto_parallel_context
from autostrat.errors import ConfigError
from autostrat.frontend.run import RunOptions, prepare_run, run_config
from autostrat.frontend.train import train
from autostrat.frontend.world import get_group_size, init
from autostrat.models import FFN
from autostrat.runtime.backend import check_world

ROOT = Path(__file__).resolve().parent.parent
MPIEXEC = Path(sys.executable).parent / "mpiexec"
CONFIGS = ("ffn", "gpt", "gpt_train", "mlp", "resnet")

# One script per execution path a user writes, planned for 8 devices.
SCRIPT = """
import sys
import numpy as np
from autostrat import LossMonitor, Model, nn, set_auto_parallel_context
from autostrat.models import FFN
from autostrat.frontend.run import run_forward
from autostrat.frontend.train import train

set_auto_parallel_context(parallel_mode="auto_parallel", device_num=8)
net = FFN(); net.dense1.matmul.shard(((2, 1), (1, 4)))
loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
optimizer = nn.Momentum(net.trainable_params(), 0.1, 0.9)
x, label = nn.Tensor(shape=(64, 64)), nn.Tensor(shape=(64,), dtype="int32")
if sys.argv[1] == "train":
    train(nn.TrainOneStepCell(nn.WithLossCell(net, loss), optimizer), (x, label), steps=3)
elif sys.argv[1] == "run_forward":
    print("result:", run_forward(net, x, steps=2))
elif sys.argv[1] == "model":
    data = [(np.ones((64, 64), np.float32), np.zeros(64, np.int32))]
    Model(net, loss, optimizer).train(1, data, callbacks=[LossMonitor()])
elif sys.argv[1] == "predict":
    print("result:", Model(net).predict(np.ones((64, 64), np.float32)).shape)
"""


def mpirun(ranks: int, *command, cwd=ROOT, env=None, timeout=120) -> subprocess.CompletedProcess:
    return subprocess.run([str(MPIEXEC), "-n", str(ranks), *command], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env=env)


def test_check_world_names_both_numbers():
    check_world(4, type("Backend", (), {"device_num": 4})())
    with pytest.raises(ConfigError, match=r"the plan is for device_num 8 but 4 ranks are running .*mpiexec -n 8"):
        check_world(8, type("Backend", (), {"device_num": 4})())


@pytest.mark.parametrize("path", ["train", "run_forward", "model", "predict"])
def test_a_plan_for_8_refuses_4_mpi_ranks_before_its_first_step(tmp_path, path):
    script = tmp_path / "script.py"
    script.write_text(SCRIPT)
    done = mpirun(4, sys.executable, "-m", "mpi4py", str(script), path)
    output = done.stdout + done.stderr
    assert done.returncode != 0
    assert "is for device_num 8 but 4 ranks are running (the world size)" in output
    assert "step 1/" not in done.stdout and "epoch: 1 step" not in done.stdout and "result:" not in done.stdout


def test_group_size_is_the_mpi_world(tmp_path):
    # Each rank writes its own file: ranks printing to one shared stdout may interleave mid-line.
    script = tmp_path / "size.py"
    script.write_text("import sys\n"
                      "from autostrat.communication import init, get_group_size, get_rank\n"
                      "from autostrat import get_auto_parallel_context\n"
                      "init(); rank = get_rank()\n"
                      "open(f'{sys.argv[1]}/{rank}.txt', 'w').write("
                      "f\"{rank} {get_group_size()} {get_auto_parallel_context('device_num')}\")\n")
    done = mpirun(3, sys.executable, str(script), str(tmp_path))
    assert done.returncode == 0, done.stderr
    assert [(tmp_path / f"{rank}.txt").read_text() for rank in range(3)] == ["0 3 3", "1 3 3", "2 3 3"]


def test_group_size_alone_is_rank_size_or_the_context(monkeypatch):
    monkeypatch.delenv("RANK_SIZE", raising=False)
    set_auto_parallel_context(device_num=4)
    assert get_group_size() == 4
    monkeypatch.setenv("RANK_SIZE", "6")
    init()
    assert get_group_size() == 6
    reset_auto_parallel_context()
    monkeypatch.setenv("RANK_SIZE", "zero")
    with pytest.raises(ConfigError, match="environment variable RANK_SIZE must be a positive number of ranks, got 'zero'"):
        get_group_size()


def test_rank_size_that_disagrees_with_mpiexec_is_refused(tmp_path):
    script = tmp_path / "size.py"
    script.write_text("from autostrat.communication import get_group_size\nget_group_size()\n")
    done = mpirun(2, sys.executable, str(script), env=os.environ | {"RANK_SIZE": "8"})
    assert "RANK_SIZE is 8 but mpiexec started 2 ranks" in done.stderr


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("device_num", range(1, 9))
def test_every_config_runs_on_every_device_count_locally(config, device_num):
    code, text = run_config(ROOT / f"configs/{config}.yaml", RunOptions(device_num=device_num, backend="local", steps=1))
    assert code == 0, text
    assert "bytes: measured = predicted on every rank" in text
    assert ": OK" in text


@pytest.mark.slow
@pytest.mark.parametrize("config,device_num", [("ffn", 3), ("gpt_train", 5), ("gpt", 7)])
def test_odd_device_counts_on_mpi_ranks(tmp_path, config, device_num):
    command = [sys.executable, "-m", "autostrat", "run", f"configs/{config}.yaml", "--device-num", str(device_num),
               "--steps", "1", "--run-dir", str(tmp_path / "run")]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    assert "bytes: measured = predicted on every rank" in done.stdout and ": OK" in done.stdout


@pytest.mark.slow
@pytest.mark.parametrize("ranks", range(1, 9))
def test_the_tutorial_sample_trains_on_every_world(ranks):
    done = subprocess.run(["bash", "run.sh", str(ranks)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"TrainOneStepCell on {ranks} device" in done.stdout  # the plan, printed before training
    assert "dense1.matmul" in done.stdout.split("step 1/20")[0]
    assert "measured = predicted on every rank" in done.stdout
    assert "(limit 1e-05): OK" in done.stdout


@pytest.mark.parametrize("argument", ["0", "00", "-1", "two"])
def test_run_sh_needs_a_positive_rank_count(argument):
    done = subprocess.run(["bash", "run.sh", argument], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr.startswith("usage: bash run.sh test") and "N >= 1 ranks" in done.stderr


def _rank_table(path: Path, device_num: int) -> Path:
    path.write_text(json.dumps({"version": "1.0", "server_count": "1", "status": "completed", "server_list": [
        {"server_id": "127.0.0.1", "host_nic_ip": "reserve", "device": [
            {"device_id": str(i), "device_ip": f"192.0.2.{i}", "rank_id": str(i)} for i in range(device_num)]}]}))
    return path


def test_a_rank_table_of_another_size_than_the_config_is_refused(tmp_path):
    table = str(_rank_table(tmp_path / "table.json", 6))
    with pytest.raises(ConfigError, match=r"table.json lists 6 device\(s\) but configs/ffn.yaml has device_num 8; "
                                          r"pass --device-num 6"):
        prepare_run("configs/ffn.yaml", RunOptions(rank_table=table))
    job, found, notes = prepare_run("configs/ffn.yaml", RunOptions(rank_table=table, device_num=6))
    assert job.device_num == 6 and found.device_num == 6 and notes


def test_search_and_run_scale_seeds_by_one_rule(tmp_path, capsys):
    from autostrat.cli import main

    assert main(["search", "configs/ffn.yaml", "--device-num", "4", "--out", str(tmp_path / "plan.json")]) == 0
    out = capsys.readouterr().out
    note = "seed dense1.matmul: ((2, 1), (1, 4)) written for device_num 8 -> ((1, 1), (1, 4)) on 4 devices"
    assert note in out
    job, _, notes = prepare_run("configs/ffn.yaml", RunOptions(device_num=4))
    assert any(n.startswith(note) for n in notes)
    assert job.plan_table in out


@pytest.mark.parametrize("options,message", [
    (RunOptions(steps=0), "run option steps must be a positive integer, got 0"),
    (RunOptions(device_num=0), "run option device_num must be a positive integer, got 0"),
    (RunOptions(timeout=-1.0), "run option timeout must be a positive number of seconds, got -1.0"),
    (RunOptions(stall_timeout=0), "run option stall_timeout must be a positive number of seconds, got 0"),
    (RunOptions(backend="threads"), "run option backend must be 'local' or 'mpi', got 'threads'"),
])
def test_run_options_are_checked_before_anything_starts(options, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        prepare_run("configs/ffn.yaml", options)


def test_training_a_forward_only_cell_is_refused_up_front(tmp_path):
    set_auto_parallel_context(parallel_mode="auto_parallel", device_num=8)
    try:
        with pytest.raises(ConfigError, match="training needs a loss and an optimiser: pass TrainOneStepCell"):
            train(FFN(), (nn.Tensor(shape=(64, 64)),), steps=20, save_checkpoint=tmp_path / "ffn.npz", log=None)
        net = FFN()
        cell = nn.TrainOneStepCell(nn.WithLossCell(net, nn.MSELoss()), nn.SGD(net.trainable_params()))
        with pytest.raises(ConfigError, match="training needs a positive whole number of steps, got steps=0"):
            train(cell, (nn.Tensor(shape=(64, 64)), nn.Tensor(shape=(64, 64))), steps=0, log=None)
    finally:
        reset_auto_parallel_context()
    assert list(tmp_path.iterdir()) == []
