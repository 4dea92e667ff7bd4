"""Faults of the cluster rather than of a rank's program: a rank table naming a host that has no
address or cannot be reached, a frozen rank (SIGSTOP), a killed rank on a loaded machine, ranks
on other hosts, and the sample's relative rank table.

No test sends anything off this machine: hosts that must not resolve are under ``.invalid``,
and a host that resolves but cannot be reached is a loopback address reached through a fake
``ssh`` (hydra's ``HYDRA_LAUNCHER_EXEC``) that fails or hangs the way ssh does.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from autostrat.runtime.diagnosis import Observed, diagnose
from autostrat.runtime.launcher import alive, killed, mpiexec_command, rank_pids
from tests.test_mpi import ROOT, assert_nothing_left, run

SAMPLE = ROOT / "sample_code" / "sharding_propagation"


def rank_table(path: Path, hosts: list[str], device_num: int = 8) -> Path:
    """A rank table spreading `device_num` devices evenly over `hosts`."""
    per_host = device_num // len(hosts)
    path.write_text(json.dumps({
        "version": "1.0", "server_count": str(len(hosts)), "status": "completed",
        "server_list": [
            {"server_id": host, "host_nic_ip": "reserve", "device": [
                {"device_id": str(d), "device_ip": f"192.1.27.{d}", "rank_id": str(per_host * s + d)} for d in range(per_host)]}
            for s, host in enumerate(hosts)
        ],
    }))
    return path


def fake_ssh(tmp_path: Path, body: str) -> dict[str, str]:
    """The environment making hydra start remote proxies with a script instead of ssh; the
    script appends its pid (and its children's) to ``ssh_pids``."""
    script = tmp_path / "ssh"
    script.write_text(f"#!/bin/sh\necho $$ >> {tmp_path}/ssh_pids\n{body}\n")
    script.chmod(0o755)
    return {"HYDRA_LAUNCHER_EXEC": str(script)}


def assert_no_process_left(tmp_path: Path, run_dir: Path, device_num: int) -> None:
    """No rank, no (fake) ssh nor its child, nor any process naming the run, is still alive
    (a zombie counts: nobody would ever reap it)."""
    pids = list(rank_pids(run_dir, device_num).values())
    ssh_pids = tmp_path / "ssh_pids"
    pids += [int(pid) for pid in ssh_pids.read_text().split()] if ssh_pids.exists() else []
    assert not [pid for pid in pids if alive(pid)], f"processes of the job still alive: {pids}"
    leftover = subprocess.run(["pgrep", "-f", str(tmp_path)], capture_output=True, text=True).stdout.split()
    assert not leftover, f"processes of the run still alive: {leftover}"


@pytest.mark.parametrize("hosts,entry", [(["127.0.0.1", "node1.invalid"], 1), (["node0.invalid", "node1.invalid"], 0)],
                         ids=["second", "all"])
def test_a_host_without_address_stops_the_run_before_any_process(tmp_path, hosts, entry):
    table = rank_table(tmp_path / "table.json", hosts)
    code, _, err, run_dir, seconds = run(tmp_path, "configs/ffn.yaml", "--rank-table", str(table), "--steps", "1")
    assert code == 2, err
    assert (f"autostrat: error: rank table: server_list[{entry}].server_id: expected a host name or address this "
            f"machine can resolve, got '{hosts[entry]}'") in err
    assert seconds < 30
    assert not list(run_dir.glob("rank_*")) and not (run_dir / "command").exists()


REFUSED = "ssh: connect to host {host} port 22: Connection refused"


@pytest.mark.parametrize("hosts", [["127.0.0.1", "127.0.0.2"], ["127.0.0.2", "127.0.0.3"]], ids=["second", "all"])
def test_a_host_refusing_ssh_is_named(tmp_path, hosts):
    env = fake_ssh(tmp_path, f'host=$2\necho "{REFUSED.format(host="$host")}" >&2\nexit 255')
    table = rank_table(tmp_path / "table.json", hosts)
    code, _, err, run_dir, seconds = run(tmp_path, "configs/ffn.yaml", "--rank-table", str(table), "--steps", "1", env=env)
    assert code != 0
    # With every host remote, the first whose launch fails ends the job; the others never start.
    # mpiexec may end before it relays ssh's own line: the host is named all the same.
    expected = [f"job failed: host {host} (ranks {4 * s}-{4 * s + 3}): {why}" for s, host in enumerate(hosts)
                if host != "127.0.0.1" for why in (REFUSED.format(host=host), "mpiexec could not start its ranks")]
    assert any(line.startswith(tuple(expected)) for line in err.splitlines()), err
    assert "host 127.0.0.1" not in err
    assert seconds < 30
    assert_no_process_left(tmp_path, run_dir, 8)


@pytest.mark.slow
def test_a_host_that_never_answers_is_named_within_the_startup_timeout(tmp_path):
    # Like ssh to an address that drops every packet: it hangs, here with a child of its own.
    env = fake_ssh(tmp_path, f"sleep 1000 &\necho $! >> {tmp_path}/ssh_pids\nwait")
    table = rank_table(tmp_path / "table.json", ["127.0.0.1", "127.0.0.2"])
    code, _, err, run_dir, seconds = run(tmp_path, "configs/ffn.yaml", "--rank-table", str(table), "--steps", "1",
                                         "--startup-timeout", "5", env=env)
    assert code != 0
    assert "job failed: host 127.0.0.2 (ranks 4-7): its ranks did not start within 5 s" in err, err
    assert seconds < 15
    assert len((tmp_path / "ssh_pids").read_text().split()) == 2
    assert_no_process_left(tmp_path, run_dir, 8)


STOPPED = "stopped making progress: its process is stopped (state T: SIGSTOP"


@pytest.mark.slow
def test_a_rank_that_stops_itself_is_blamed(tmp_path):
    code, _, err, run_dir, seconds = run(
        tmp_path, "configs/ffn.yaml", "--device-num", "4", "--inject-fault", "3:stop", "--stall-timeout", "3", "--timeout", "60")
    assert code != 0
    assert f"job failed: rank 3 (pid {rank_pids(run_dir, 4)[3]}) {STOPPED}" in err, err
    assert seconds < 30
    assert_nothing_left(run_dir, 4)


@pytest.mark.slow
def test_a_rank_stopped_from_outside_is_blamed(tmp_path):
    run_dir = tmp_path / "run"
    command = [sys.executable, "-m", "autostrat", "run", "configs/ffn.yaml", "--device-num", "4", "--steps", "1000",
               "--stall-timeout", "3", "--timeout", "60", "--run-dir", str(run_dir)]
    job = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        log = run_dir / "rank_3" / "log"
        while job.poll() is None and not (log.exists() and "rank 3 of 4: pid" in log.read_text()):
            time.sleep(0.05)  # past MPI's start-up: every rank's watchdog runs
        pid = rank_pids(run_dir, 4)[3]
        os.kill(pid, signal.SIGSTOP)
        _, err = job.communicate(timeout=60)
    finally:
        job.kill()
    assert job.returncode != 0
    assert f"job failed: rank 3 (pid {pid}) {STOPPED}" in err, err
    assert_nothing_left(run_dir, 4)


@pytest.mark.slow
def test_the_sample_reads_a_rank_table_relative_to_the_caller(tmp_path):
    rank_table(tmp_path / "table.json", ["127.0.0.1"])
    env = dict(os.environ, RANK_TABLE_FILE="table.json")
    done = subprocess.run(["bash", str(SAMPLE / "run.sh"), "8"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert (SAMPLE / "hostfile").read_text() == "127.0.0.1:8\n"
    assert "(limit 1e-05): OK" in done.stdout


def test_the_sample_names_a_missing_rank_table_in_one_line(tmp_path):
    env = dict(os.environ, RANK_TABLE_FILE="missing.json")
    done = subprocess.run(["bash", str(SAMPLE / "run.sh"), "8"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 2
    assert done.stderr == (f"run.sh: RANK_TABLE_FILE: expected a rank table file, got 'missing.json' "
                           f"(no such file from {tmp_path})\n")


def test_on_one_machine_mpiexec_leaves_a_dead_ranks_peers_to_the_launcher(tmp_path):
    mpiexec = tmp_path / "mpiexec"
    assert mpiexec_command(mpiexec, 4, tmp_path)[1] == "-disable-auto-cleanup"  # hydra's, without gforker beside it
    (tmp_path / "mpiexec.gforker").touch()  # gforker leaves them anyway (the ranks ignore its SIGINT)
    assert mpiexec_command(mpiexec, 4, tmp_path)[:3] == [str(tmp_path / "mpiexec.gforker"), "-n", "4"]
    # Across hosts, or with another rank program that records no exit status, mpiexec cleans up.
    assert "-disable-auto-cleanup" not in mpiexec_command(mpiexec, 8, tmp_path, tmp_path / "hostfile")
    assert "-disable-auto-cleanup" not in mpiexec_command(mpiexec, 4, tmp_path, entry=("train.py",))


def test_a_rank_ending_without_exit_status_was_killed_unless_another_aborts(tmp_path):
    for rank in range(3):
        (tmp_path / f"rank_{rank}").mkdir()
    (tmp_path / "rank_0" / "exit").write_text("0\n")
    assert not killed(tmp_path, 3, 0)  # done
    assert killed(tmp_path, 3, 1)
    (tmp_path / "rank_2" / "exit").write_text("3\n")  # rank 2's watchdog aborts the job
    assert not killed(tmp_path, 3, 1)


def test_the_first_killed_rank_is_blamed_whatever_mpiexec_reports(tmp_path):
    report = ["=   PID 101 RUNNING AT vm", "=   EXIT CODE: 9", "YOUR APPLICATION TERMINATED WITH THE EXIT STRING: Killed (signal 9)"]
    seen = Observed(report, tmp_path, 4, 9, {0: 101, 1: 102, 2: 103, 3: 104}, ended="died", deaths=[2, 0], marked=True)
    assert diagnose(seen) == ("job failed: rank 2 (pid 103) died first: its process ended without recording an exit "
                              "status (killed, or crashed); the launcher then ended the other ranks")


def test_a_rank_on_another_host_is_neither_watched_nor_killed_here(tmp_path):
    # The run directory is shared across hosts: a pid recorded elsewhere is no process of ours.
    for rank, host in enumerate([socket.gethostname(), "node1.invalid"]):
        (tmp_path / f"rank_{rank}").mkdir()
        (tmp_path / f"rank_{rank}" / "host").write_text(f"{host}\n")
        (tmp_path / f"rank_{rank}" / "pid").write_text(f"{os.getpid()}\n")
    assert rank_pids(tmp_path, 2) == {0: os.getpid()}
    assert rank_pids(tmp_path, 2, anywhere=True) == {0: os.getpid(), 1: os.getpid()}
