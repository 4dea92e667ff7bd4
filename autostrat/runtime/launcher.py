"""Start a job's ranks with the ``mpiexec`` of the `mpich` wheel, and make sure they all end.

The launcher runs ``mpiexec -n N python -m mpi4py -m autostrat.runtime.rank RUN_DIR --digest HEX``
(``python -m mpi4py`` aborts the job when a rank dies of an unhandled exception; HEX is the
job's digest, which every rank checks the job's files against). It gives
mpiexec a host file made from the rank table, when there is one, and enforces a global time
limit on top of the ranks' own watchdogs: past it, the whole process group and every recorded
rank process are killed. Afterwards it names the failing rank from the ranks' one-line
messages or mpiexec's report of a dead process, and kills any rank process still alive.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from autostrat.errors import RuntimeBackendError
from autostrat.io import write_atomically

_RANK_LINE = re.compile(r"^rank (\d+): (.*)$")
_DEAD_PID = re.compile(r"PID (\d+) RUNNING AT")
_EXIT = re.compile(r"(EXIT CODE: \d+|KILLED BY SIGNAL: [^\n=]*)")


@dataclass(frozen=True)
class LaunchResult:
    returncode: int
    message: str
    run_dir: Path
    seconds: float


def find_mpiexec() -> Path:
    """The mpiexec installed beside this Python (the `mpich` wheel), never one on PATH."""
    mpiexec = Path(sys.executable).parent / "mpiexec"
    if not mpiexec.exists():
        raise RuntimeBackendError(
            f"no MPI runtime: expected mpiexec at {mpiexec} (pip install mpich into this environment)"
        )
    try:
        import mpi4py  # noqa: F401  (only checked here; the ranks import mpi4py.MPI)
    except ImportError:
        raise RuntimeBackendError(f"no MPI runtime: mpi4py is not installed for {sys.executable} (pip install mpi4py)") from None
    return mpiexec


def hostfile_text(hosts) -> str:
    """mpiexec's host file: one ``host:slots`` line per server of the rank table."""
    return "".join(f"{host}:{slots}\n" for host, slots in hosts)


def mpi_environment(device_num: int, hosts=None) -> dict[str, str]:
    """The environment for mpiexec. Across hosts the ofi network layer over TCP (the wheel's
    default UCX layer fails to start over TCP). With more ranks than cores, ranks waiting in a
    collective yield their core (measured 2-5x faster collectives on an oversubscribed machine)."""
    env = dict(os.environ)
    if hosts and len(hosts) > 1:
        env.setdefault("MPIR_CVAR_CH4_NETMOD", "ofi")
        env.setdefault("FI_PROVIDER", "tcp")
    if device_num > (os.cpu_count() or 1):
        env.setdefault("MPIR_CVAR_ENABLE_HEAVY_YIELD", "1")
    return env


def mpiexec_command(mpiexec: Path, device_num: int, run_dir: Path, hostfile: Path | None = None, entry=None,
                    digest: str | None = None) -> list[str]:
    """The command line that starts every rank of the job in `run_dir`; `entry` replaces what
    each rank runs after ``python -m mpi4py`` (default: ``-m autostrat.runtime.rank RUN_DIR``,
    followed by ``--digest HEX`` when the job's `digest` is given)."""
    hosts = ["-f", str(hostfile)] if hostfile else []
    runner = ("-m", "autostrat.runtime.rank", str(run_dir), *(("--digest", digest) if digest else ()))
    rank = [sys.executable, "-m", "mpi4py", *(entry or runner)]
    return [str(mpiexec), *hosts, "-n", str(device_num), *rank]


def launch(run_dir, device_num: int, hosts=None, timeout: float = 300.0, stall_timeout: float = 10.0, entry=None,
           digest: str | None = None) -> LaunchResult:
    """Run the job saved in `run_dir` on `device_num` MPI ranks; never hangs past `timeout`.
    `digest` is the job's (what `job_file.save_job` returned); the ranks refuse a job whose files
    do not match it. Another rank program (`entry`, see `mpiexec_command`) is watched the same
    way if each rank records its process id with `rank.redirect_output`."""
    if entry is None and digest is None:
        raise RuntimeBackendError("launch: expected the job's digest (the value save_job returned), got none")
    run_dir = Path(run_dir).resolve()
    mpiexec = find_mpiexec()
    write_atomically(run_dir / "stall_timeout", f"{stall_timeout}\n")
    hostfile = None
    if hosts:
        hostfile = run_dir / "hostfile"
        write_atomically(hostfile, hostfile_text(hosts))
    command = mpiexec_command(mpiexec, device_num, run_dir, hostfile, entry, digest)
    write_atomically(run_dir / "command", " ".join(command) + "\n")
    env = mpi_environment(device_num, hosts) | {"MPIEXEC_TIMEOUT": str(int(timeout) + 5)}
    started = time.monotonic()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                               start_new_session=True, text=True)
    lines: list[str] = []
    readers = [threading.Thread(target=_relay, args=(stream, out, lines), daemon=True)
               for stream, out in ((process.stdout, sys.stdout), (process.stderr, sys.stderr))]
    for reader in readers:
        reader.start()
    deaths: list[int] = []
    monitor = threading.Thread(target=_watch_deaths, args=(process, run_dir, device_num, deaths), daemon=True)
    monitor.start()
    timed_out = _wait(process, timeout)
    monitor.join(timeout=1)
    for reader in readers:
        reader.join(timeout=5)
    lines += _log_lines(run_dir, device_num)
    leftovers = end_leftovers(run_dir, device_num)
    seconds = time.monotonic() - started
    message = diagnose(lines, run_dir, device_num, process.returncode, timed_out, timeout, deaths)
    if leftovers:
        message += f"\nkilled {len(leftovers)} rank process(es) still running after mpiexec ended: {leftovers}"
    code = process.returncode if process.returncode and not timed_out else (124 if timed_out else 0)
    return LaunchResult(code or (1 if message else 0), message, run_dir, seconds)


def _relay(stream, out, lines: list[str]) -> None:
    """Copy one of mpiexec's output streams to ours, keeping the lines for the diagnosis."""
    for line in stream:
        lines.append(line.rstrip("\n"))
        out.write(line)
        out.flush()


def _log_lines(run_dir: Path, device_num: int) -> list[str]:
    """The ranks' failure lines from their logs: mpiexec may kill a rank before its line on
    the terminal got through, never before the line reached its own log file."""
    found = []
    for rank in range(device_num):
        try:
            text = (run_dir / f"rank_{rank}" / "log").read_text(errors="replace")
        except OSError:
            continue
        found += [line for line in text.splitlines() if line.startswith(f"rank {rank}: ") and " step(s), sent " not in line]
    return found


def _wait(process: subprocess.Popen, timeout: float) -> bool:
    """Wait for mpiexec; past `timeout` end its whole process group. True if it timed out."""
    try:
        process.wait(timeout=timeout)
        return False
    except subprocess.TimeoutExpired:
        for sig, grace in ((signal.SIGTERM, 3.0), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(process.pid, sig)
            except ProcessLookupError:
                break
            try:
                process.wait(timeout=grace)
                break
            except subprocess.TimeoutExpired:
                continue
        return True


def _watch_deaths(process: subprocess.Popen, run_dir: Path, device_num: int, deaths: list[int]) -> None:
    """While mpiexec runs, note the ranks (on this host) whose process ends, in order: when
    one rank is killed, mpiexec kills the others, and only the order tells who went first."""
    pids: dict[int, int] = {}
    while process.poll() is None:
        if len(pids) < device_num:
            pids = rank_pids(run_dir, device_num)
        deaths += [rank for rank, pid in sorted(pids.items()) if rank not in deaths and not running(pid)]
        time.sleep(0.005)


_PF_EXITING = 0x4  # the kernel's per-process flag, set as soon as the process starts dying


def running(pid: int) -> bool:
    """Alive and not dying: a killed process tears its memory down for some milliseconds
    before it becomes a zombie, and mpiexec may kill the others meanwhile; the exiting
    flag is set at once."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return alive(pid) if not Path("/proc/self").exists() else False
    return fields[0] not in ("Z", "X") and not int(fields[6]) & _PF_EXITING


def rank_pids(run_dir: Path, device_num: int) -> dict[int, int]:
    """The process id each rank recorded on this host (``rank_<i>/pid``)."""
    pids = {}
    for rank in range(device_num):
        try:
            pids[rank] = int((run_dir / f"rank_{rank}" / "pid").read_text())
        except (OSError, ValueError):
            continue
    return pids


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def end_leftovers(run_dir: Path, device_num: int, grace: float = 3.0) -> list[int]:
    """Kill rank processes that outlive mpiexec (after `grace` seconds); returns their pids."""
    deadline = time.monotonic() + grace
    pids = list(rank_pids(run_dir, device_num).values())
    while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    killed = [pid for pid in pids if alive(pid)]
    for pid in killed:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return killed


def diagnose(lines: list[str], run_dir: Path, device_num: int, returncode: int, timed_out: bool, timeout: float,
             deaths: list[int] = ()) -> str:
    """One message naming the failing rank(s), or "" when the job succeeded."""
    if returncode == 0 and not timed_out:
        return ""
    errors = {}
    for line in lines:
        match = _RANK_LINE.match(line.strip())
        if match:
            errors.setdefault(int(match.group(1)), match.group(2))
    blamed = _blame(errors)
    died = _dead_rank(lines, run_dir, device_num, deaths)
    if died:
        blamed.insert(0, died)
    if timed_out:
        blamed.append(f"the job did not finish within {timeout:g} s and was killed")
    if not blamed:
        blamed.append(f"mpiexec exited with status {returncode}; see the rank logs in {run_dir}")
    others = [f"rank {rank}: {text}" for rank, text in sorted(errors.items()) if f"rank {rank}:" not in " ".join(blamed)]
    return "\n".join([f"job failed: {blamed[0]}", *blamed[1:], *(["other ranks:"] + others if others else [])])


def _blame(errors: dict[int, str]) -> list[str]:
    """The rank messages that point at the cause: raised errors first; among stalls, the ranks
    stuck somewhere the fewest ranks are (the others are usually waiting for them)."""
    raised = [f"rank {r}: {text}" for r, text in sorted(errors.items()) if "no progress" not in text]
    if raised:
        return raised
    places: dict[str, list[int]] = {}
    for rank, text in errors.items():
        places.setdefault(text.split(" s ", 1)[-1], []).append(rank)
    if not places:
        return []
    ranks = min(places.values(), key=len) if len(places) > 1 else sorted(errors)
    return [f"rank {rank}: {errors[rank]}" for rank in sorted(ranks)]


def _dead_rank(lines: list[str], run_dir: Path, device_num: int, deaths) -> str:
    """mpiexec's report of a rank process that died; the rank is the first one seen to end
    (mpiexec names whichever pid it reaped first, often one it killed itself)."""
    text = "\n".join(lines)
    match = _DEAD_PID.search(text)
    if not match or "application called MPI_Abort" in text:
        return ""
    pids = rank_pids(run_dir, device_num)
    how = _EXIT.search(text)
    signal_text = re.search(r"EXIT STRING: ([^\n]*)", text)
    cause = signal_text.group(1).strip() if signal_text else how.group(1).strip() if how else "terminated"
    if deaths:
        return f"rank {deaths[0]} (pid {pids.get(deaths[0])}) died first: {cause}; mpiexec then ended the other ranks"
    pid = int(match.group(1))
    ranks = [rank for rank, recorded in pids.items() if recorded == pid]
    return f"{f'rank {ranks[0]}' if ranks else 'a rank'} (pid {pid}) died: {cause}"
