"""A job's safety on the machine that runs it: what the ranks import, the run folder, the
addresses MPI listens on, the launcher ended by SIGTERM or SIGKILL, and ranks that cannot
write (a full disk, simulated with RLIMIT_FSIZE: writes past it fail with EFBIG, as a full disk
fails them with ENOSPC, without mounting anything)."""

from __future__ import annotations

import ipaddress
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from autostrat.errors import ConfigError, RuntimeBackendError
from autostrat.frontend.run import RunOptions, prepare_run
from autostrat.runtime import launcher
from autostrat.runtime.job_file import save_job
from autostrat.runtime.launcher import end_leftovers, missing_results
from autostrat.runtime.processes import descendants, running
from autostrat.runtime.run_folder import check_run_folder, create_file, make_run_folder, open_new
from tests.test_mpi import ROOT

PLANTED = ("mpi4py", "numpy", "yaml")


def autostrat_run(cwd: Path, run_dir: Path, *args, env=None, **popen) -> subprocess.Popen:
    """`autostrat run configs/ffn.yaml` started from `cwd` the way the installed command starts
    (no current folder on its own import path: ``-P``)."""
    command = [sys.executable, "-P", "-m", "autostrat", "run", str(ROOT / "configs" / "ffn.yaml"), "--run-dir", str(run_dir), *args]
    environment = os.environ | {"PYTHONPATH": str(ROOT)} | (env or {})
    return subprocess.Popen(command, cwd=cwd, env=environment, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen)


def test_a_module_in_the_current_folder_runs_in_no_rank(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    for name in PLANTED:  # each would leave a marker if any process imported it
        (work / f"{name}.py").write_text(f"open({str(tmp_path / name)!r} + '.imported', 'w').close()\n")
    job = autostrat_run(work, tmp_path / "run", "--steps", "1")
    out, err = job.communicate(timeout=120)
    assert job.returncode == 0, err
    assert "bytes: measured = predicted on every rank" in out and ": OK" in out
    assert not list(tmp_path.glob("*.imported"))


def test_ranks_that_exit_0_without_a_result_fail_the_job(tmp_path):
    # A module earlier on the import path replaces the rank program: every rank exits 0 at once.
    planted = tmp_path / "planted" / "mpi4py"
    planted.mkdir(parents=True)
    (planted / "__init__.py").write_text("")
    (planted / "__main__.py").write_text("")
    job = autostrat_run(tmp_path, tmp_path / "run", "--steps", "1", "--device-num", "2",
                        env={"PYTHONPATH": f"{planted.parent}{os.pathsep}{ROOT}"})
    _, err = job.communicate(timeout=120)
    assert job.returncode == 1, err
    assert (f"job failed: mpiexec exited with status 0, but rank 0 saved no result ({tmp_path / 'run' / 'measured.json'}) "
            f"and ranks 0-1 recorded no exit status 0 (rank_<i>/exit)") in err


def test_every_rank_must_record_exit_status_0(tmp_path):
    create_file(tmp_path / "measured.json", "{}\n")
    for rank, status in enumerate(["4", "0", None]):
        (tmp_path / f"rank_{rank}").mkdir()
        if status is not None:
            create_file(tmp_path / f"rank_{rank}" / "exit", status + "\n")
    assert missing_results(tmp_path, 3) == ("job failed: mpiexec exited with status 0, but ranks 0, 2 recorded no exit "
                                            "status 0 (rank_<i>/exit)")
    assert missing_results(tmp_path, 1) == "job failed: mpiexec exited with status 0, but rank 0 recorded no exit status 0 (rank_<i>/exit)"


def test_a_world_writable_run_dir_is_refused(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    job = autostrat_run(tmp_path, shared, "--steps", "1")
    _, err = job.communicate(timeout=120)
    assert job.returncode == 2
    assert err == (f"autostrat: error: run folder {shared}: expected a folder only you can write to, got mode 0o777 "
                   f"(writable by its group and others)\n")
    assert not list(shared.iterdir())


def test_a_run_dir_of_another_user_is_refused(tmp_path, monkeypatch):
    folder = tmp_path / "theirs"
    folder.mkdir(mode=0o700)
    monkeypatch.setattr(os, "geteuid", lambda: folder.stat().st_uid + 1)
    with pytest.raises(ConfigError, match=rf"^run folder {folder}: expected a folder owned by you \(uid {folder.stat().st_uid + 1}\), "
                                          rf"got owner uid {folder.stat().st_uid}, mode 0o700$"):
        check_run_folder(folder)


def test_a_used_run_dir_is_refused(tmp_path):
    used = tmp_path / "used"
    (used / "rank_0").mkdir(parents=True, mode=0o700)
    used.chmod(0o700)
    with pytest.raises(ConfigError, match=rf"^run folder {used}: expected a new or empty folder, got one holding rank_0; give a new --run-dir$"):
        make_run_folder(used)
    (tmp_path / "link").symlink_to(used)
    with pytest.raises(ConfigError, match=rf"^run folder {tmp_path / 'link'}: expected a folder, got a symlink$"):
        make_run_folder(tmp_path / "link")


def test_a_new_run_dir_is_the_owners_alone(tmp_path):
    assert make_run_folder(tmp_path / "a" / "run").stat().st_mode & 0o777 == 0o700
    empty = tmp_path / "empty"
    empty.mkdir(mode=0o700)
    assert make_run_folder(empty) == empty


def test_files_in_the_run_folder_are_new_and_never_followed(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("theirs\n")
    (tmp_path / "log").symlink_to(victim)
    with pytest.raises(FileExistsError):
        open_new(tmp_path / "log")
    with pytest.raises(RuntimeBackendError, match=rf"^cannot write {tmp_path / 'log'}: File exists$"):
        create_file(tmp_path / "log", "mine\n")
    assert victim.read_text() == "theirs\n"
    assert sorted(path.name for path in tmp_path.iterdir()) == ["log", "victim"]  # no temporary left


@pytest.fixture
def saved(tmp_path):
    """The tutorial FFN's job (one step) saved in a new run folder; (run folder, digest)."""
    job, _, _ = prepare_run(ROOT / "configs/ffn.yaml", RunOptions(steps=1))
    run_dir = make_run_folder(tmp_path / "run")
    return run_dir, save_job(job, run_dir)


def test_a_planted_rank_log_stops_its_rank_at_once(saved, tmp_path):
    run_dir, digest = saved
    victim = tmp_path / "victim"
    victim.write_text("theirs\n")
    (run_dir / "rank_0").mkdir(mode=0o700)
    (run_dir / "rank_0" / "log").symlink_to(victim)
    result = launcher.launch(run_dir, 8, timeout=60, digest=digest)
    assert result.returncode == 1
    assert result.message.startswith(f"job failed: rank 0: could not start: cannot create {run_dir / 'rank_0'}: File exists")
    assert result.seconds < 30
    assert victim.read_text() == "theirs\n"


def test_a_recorded_pid_that_is_no_process_of_the_job_is_never_killed(tmp_path):
    # A process this test did not start as its own descendant (its shell parent exits at once).
    stranger = int(subprocess.run(["sh", "-c", "sleep 60 >/dev/null 2>&1 & echo $!"], capture_output=True, text=True).stdout)
    try:
        (tmp_path / "rank_0").mkdir()
        create_file(tmp_path / "rank_0" / "pid", f"{stranger}\n")
        assert end_leftovers(tmp_path, 1, grace=0.0) == []
        assert running(stranger)
    finally:
        os.kill(stranger, signal.SIGKILL)


def started_job(tmp_path: Path, device_num: int = 4) -> tuple[subprocess.Popen, list[int]]:
    """A job that runs until it is ended (rank 1 loops), once every rank is past MPI's start;
    with the processes of the job: the launcher's descendants (it is their subreaper)."""
    run_dir = tmp_path / "run"
    job = autostrat_run(tmp_path, run_dir, "--device-num", str(device_num), "--steps", "1", "--inject-fault", "1:loop",
                        "--stall-timeout", "100", "--timeout", "100")
    deadline = time.monotonic() + 60
    logs = [run_dir / f"rank_{rank}" / "log" for rank in range(device_num)]
    while not all(log.exists() and " of " in log.read_text() for log in logs):
        assert job.poll() is None and time.monotonic() < deadline, job.communicate()
        time.sleep(0.05)
    pids = descendants(job.pid)
    assert len(pids) >= device_num + 1, pids  # mpiexec and the ranks at least
    return job, pids


def assert_gone(pids: list[int], within: float = 5.0) -> None:
    deadline = time.monotonic() + within
    while [pid for pid in pids if running(pid)] and time.monotonic() < deadline:
        time.sleep(0.1)
    left = subprocess.run(["ps", "-o", "pid,ppid,sid,stat,comm", "-p", ",".join(map(str, pids))], capture_output=True, text=True)
    assert not [pid for pid in pids if running(pid)], left.stdout


@pytest.mark.slow
def test_sigterm_ends_the_whole_job(tmp_path):
    job, pids = started_job(tmp_path)
    job.send_signal(signal.SIGTERM)
    _, err = job.communicate(timeout=30)
    assert job.returncode == 143
    assert err.endswith("autostrat: terminated by SIGTERM, the job ended, nothing written\n"), err
    assert_gone(pids)


@pytest.mark.slow
def test_sigterm_during_a_search_ends_it_in_one_line_and_writes_nothing(tmp_path):
    command = [sys.executable, "-P", "-m", "autostrat", "search", str(ROOT / "configs" / "transformer_stack.yaml"),
               "--device-num", "512", "--refine", "cpsat", "--out", str(tmp_path / "plan.json")]
    search = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=os.environ | {"PYTHONPATH": str(ROOT)})
    first = search.stderr.readline()  # a search of over a second says what it does: it is under way
    assert first.startswith("autostrat: propagating"), first
    search.send_signal(signal.SIGTERM)
    out, err = search.communicate(timeout=60)
    assert search.returncode == 143 and out == "", (search.returncode, err[-2000:])
    assert err.endswith("autostrat: terminated by SIGTERM, nothing written\n") and "Traceback" not in err, err[-2000:]
    assert not (tmp_path / "plan.json").exists()


@pytest.mark.slow
def test_sigkill_of_the_launcher_leaves_no_process_of_the_job(tmp_path):
    job, pids = started_job(tmp_path)
    job.kill()
    job.wait()
    assert_gone(pids)


def listening_addresses(pid: int) -> list[str]:
    """The local addresses of the TCP sockets `pid` listens on (its descriptors' socket
    inodes, found in /proc/net/tcp and tcp6 with state 0A, LISTEN)."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    found = []
    for table, family in (("tcp", socket.AF_INET), ("tcp6", socket.AF_INET6)):
        for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            if fields[9] in inodes and fields[3] == "0A":
                address = bytes.fromhex(fields[1].split(":")[0])
                # The kernel prints each 32-bit word in host (little-endian) order.
                words = b"".join(address[i:i + 4][::-1] for i in range(0, len(address), 4))
                found.append(socket.inet_ntop(family, words))
    return found


@pytest.mark.slow
def test_a_job_on_this_machine_listens_on_loopback_only(tmp_path):
    job, pids = started_job(tmp_path)
    try:
        addresses = {pid: listening_addresses(pid) for pid in pids if running(pid)}
    finally:
        job.send_signal(signal.SIGTERM)
        job.communicate(timeout=30)
    assert any(addresses.values()), addresses  # the ranks do listen (on loopback)
    assert all(ipaddress.ip_address(address).is_loopback for found in addresses.values() for address in found), addresses


def limit_file_size(monkeypatch, tmp_path: Path, kilobytes: int) -> None:
    """The launcher's process manager (on one machine, ``mpiexec.gforker``) runs with
    RLIMIT_FSIZE at `kilobytes` (bash's ``ulimit -f`` counts KiB): every rank's write past it fails."""
    forker = launcher.find_mpiexec().parent / "mpiexec.gforker"
    wrapper = tmp_path / forker.name
    wrapper.write_text(f"#!/bin/bash\nulimit -f {kilobytes}\nexec {forker} \"$@\"\n")
    wrapper.chmod(0o755)
    monkeypatch.setattr(launcher, "find_mpiexec", lambda: tmp_path / "mpiexec")


def test_a_rank_that_cannot_write_at_start_ends_the_job_at_once(saved, tmp_path, monkeypatch, capsys):
    run_dir, digest = saved
    limit_file_size(monkeypatch, tmp_path, 0)
    result = launcher.launch(run_dir, 8, timeout=120, digest=digest)
    assert result.returncode == 1
    first = result.message.splitlines()[0]
    assert first.startswith("job failed: rank ") and first.endswith("/host: File too large"), result.message
    rank = first.split()[3].rstrip(":")
    assert first == f"job failed: rank {rank}: could not start: cannot write {run_dir}/rank_{rank}/host: File too large"
    assert result.seconds < 30
    assert "Traceback" not in capsys.readouterr().err  # one line per rank, not eight tracebacks
    assert not subprocess.run(["pgrep", "-f", str(run_dir)], capture_output=True, text=True).stdout


def test_a_result_that_cannot_be_saved_is_printed_and_named(saved, capsys):
    run_dir, digest = saved
    # A name taken: the write fails as on a full disk, late in the run (MPI's own shared memory
    # needs more room than any file limit that would fail the report alone).
    (run_dir / "report.txt").write_text("")
    result = launcher.launch(run_dir, 8, timeout=120, digest=digest)
    assert result.returncode != 0
    assert result.message.startswith(f"job failed: rank 0: RuntimeBackendError: the result printed above was not saved: "
                                     f"cannot write {run_dir / 'report.txt'}: File exists"), result.message
    assert "limit 0.0003): OK" in capsys.readouterr().out
    assert (run_dir / "report.txt").read_text() == "" and not (run_dir / "measured.json").exists()
