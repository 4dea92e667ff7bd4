"""Start a job's ranks with the ``mpiexec`` of the `mpich` wheel, and make sure they all end.

The launcher runs ``mpiexec -n N python -P -m mpi4py -m autostrat.runtime.rank RUN_DIR --digest HEX``
(``-P`` and ``PYTHONSAFEPATH``: the current folder is on no rank's import path; ``python -m
mpi4py`` aborts the job when a rank dies of an unhandled exception; HEX is the job's digest,
which every rank checks the job's files against). It gives mpiexec a host file
made from the rank table, when there is one, after checking that every host name resolves, and
enforces two limits on top of the ranks' own watchdogs: a start-up limit for every rank to
record its pid (a host that cannot be reached never starts its ranks) and a global time limit.
Past either, mpiexec and every process it started are killed. A rank that ends on its own terms
records its exit status; one whose process ends without it was killed, and the launcher ends
the job itself (on one machine mpiexec leaves that to it), as it does at once when a rank says
it could not start (`rank.STARTUP_FAILED`). Afterwards `diagnosis.diagnose` names the failing
host or rank, and any process of the job still alive is killed: the launcher is the subreaper
of the job's orphans while it runs (see `processes`), and kills only its own descendants, never
a pid merely read from a file. The job succeeded only when rank 0 saved its result and every
rank recorded exit status 0. SIGTERM ends the job like Ctrl-C (`processes.Terminated`); a
launcher killed outright takes mpiexec with it (a parent-death signal) and the ranks end
themselves (`watchdog`). The run folder must be the user's alone (`run_folder`). On one machine
the ranks' MPI network layer listens on loopback only."""

from __future__ import annotations

import ipaddress
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from autostrat.errors import ConfigError, RuntimeBackendError
from autostrat.runtime.diagnosis import Observed, diagnose
from autostrat.runtime.processes import (LAUNCHER_VARIABLE, alive, become_subreaper, descendants, die_with_parent,
                                         ending_on_sigterm, kill_tree, launcher_identity, process_state, running)
from autostrat.runtime.rank import STARTUP_FAILED, TERMINAL_VARIABLE
from autostrat.runtime.report import MEASURED
from autostrat.runtime.run_folder import check_run_folder, create_file, exit_status, rank_pids, read_record
from autostrat.runtime.stale_shm import remove_stale_segments
from autostrat.runtime.threads import usable_cores

__all__ = ["LaunchResult", "alive", "end_leftovers", "find_mpiexec", "hostfile_text", "launch", "missing_results",
           "mpi_environment", "mpiexec_command", "rank_pids", "resolve_hosts", "running", "single_host"]

STARTUP_TIMEOUT = 20.0  # seconds for every rank to record its pid: ssh to a silent host waits minutes


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
    """The environment for mpiexec. Across hosts the ofi network layer over TCP (the wheel's default UCX
    layer fails to start over TCP). On one machine (`single_host`) the network layers use the
    loopback interface only (UCX would listen on every address of the machine). With more ranks
    than the cores this process may use (`threads.usable_cores`, as the ranks count them), ranks
    waiting in a collective yield their core (measured 2-5x faster collectives on an
    oversubscribed machine)."""
    env = dict(os.environ)
    if hosts and len(hosts) > 1:
        env.setdefault("MPIR_CVAR_CH4_NETMOD", "ofi")
        env.setdefault("FI_PROVIDER", "tcp")
    if single_host(hosts):
        env |= {"UCX_NET_DEVICES": "lo", "FI_TCP_IFACE": "lo"}
    if device_num > usable_cores():
        env.setdefault("MPIR_CVAR_ENABLE_HEAVY_YIELD", "1")
    return env


def single_host(hosts) -> bool:
    """Whether every rank runs on this machine: no rank table hosts, or only loopback ones.

    Example:
        >>> single_host(None), single_host([("localhost", 4), ("127.0.0.1", 4)]), single_host([("node1.invalid", 8)])
        (True, True, False)
    """
    for host, _ in hosts or ():
        try:
            addresses = {info[4][0] for info in socket.getaddrinfo(host, None)}
        except (socket.gaierror, UnicodeError):
            return False
        if not all(ipaddress.ip_address(address.split("%")[0]).is_loopback for address in addresses):
            return False
    return True


def mpiexec_command(mpiexec: Path, device_num: int, run_dir: Path, hostfile: Path | None = None, entry=None,
                    digest: str | None = None) -> list[str]:
    """The command line that starts every rank of the job in `run_dir`; `entry` replaces what
    each rank runs after ``python -m mpi4py`` (default: ``-m autostrat.runtime.rank RUN_DIR``,
    followed by ``--digest HEX`` when the job's `digest` is given, under ``python -P``).
    On this machine alone the job runner's ranks start under the wheel's ``mpiexec.gforker``
    (beside `mpiexec`), which forks them and listens on no port (hydra's mpiexec listens on
    every address of the machine, and no option binds it to loopback). Neither it nor hydra's
    mpiexec (``-disable-auto-cleanup``, where gforker is missing) kills the other ranks at once
    when one dies (the ranks ignore gforker's SIGINT): the launcher sees every rank, tells a
    killed rank from one that ended on its own terms (``rank_<i>/exit``) and ends the job
    itself, so the dead rank is seen first even on a loaded machine. Across hosts, ranks
    elsewhere are out of its sight."""
    runner = ("-P", "-m", "mpi4py", "-m", "autostrat.runtime.rank", str(run_dir), *(("--digest", digest) if digest else ()))
    forker = Path(mpiexec).parent / "mpiexec.gforker"
    if hostfile is None and entry is None and forker.exists():
        return [str(forker), "-n", str(device_num), sys.executable, *runner]
    hosts = ["-f", str(hostfile)] if hostfile else []
    cleanup = ["-disable-auto-cleanup"] if hostfile is None and entry is None else []
    # Another rank program is a script whose own folder belongs on its path (mpi4py puts it
    # first in place of sys.path[0], the first PYTHONPATH entry under -P).
    rank = [sys.executable, *(("-m", "mpi4py", *entry) if entry else runner)]
    return [str(mpiexec), *cleanup, *hosts, "-n", str(device_num), *rank]


def resolve_hosts(hosts) -> None:
    """Check that every host of the rank table has an address before anything starts: mpiexec
    would only report a name that does not resolve through ssh, after starting the other hosts.

    Example:
        >>> resolve_hosts([("127.0.0.1", 4), ("localhost", 4)])
    """
    for index, (host, _) in enumerate(hosts or ()):
        try:
            socket.getaddrinfo(host, None)
        except (socket.gaierror, UnicodeError) as error:
            reason = getattr(error, "strerror", None) or str(error)
            raise ConfigError(
                f"rank table: server_list[{index}].server_id: expected a host name or address this machine "
                f"can resolve, got {host!r} ({reason})"
            ) from None


def launch(run_dir, device_num: int, hosts=None, timeout: float = 300.0, stall_timeout: float = 10.0, entry=None,
           startup_timeout: float = STARTUP_TIMEOUT, digest: str | None = None) -> LaunchResult:
    """Run the job saved in `run_dir` on `device_num` MPI ranks; never hangs past `timeout`, nor,
    on a rank table's `hosts`, past `startup_timeout` before every rank recorded its pid, and
    leaves no process of the job behind. Another rank program (`entry`, see `mpiexec_command`)
    is watched the same way if each rank records its process id with `rank.redirect_output`.
    `digest` is the job's (what `job_file.save_job` returned); the ranks refuse a job whose files
    do not match it.

    Example (a job whose second host has no address ends before anything starts):
        >>> launch("run", 8, [("127.0.0.1", 4), ("node1.invalid", 4)], digest="0" * 64)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        autostrat.errors.ConfigError: rank table: server_list[1].server_id: expected ... got 'node1.invalid' (...)
    """
    if entry is None and digest is None:
        raise RuntimeBackendError("launch: expected the job's digest (the value save_job returned), got none")
    resolve_hosts(hosts)
    run_dir = Path(run_dir).resolve()
    check_run_folder(run_dir)
    command = _prepare(run_dir, device_num, hosts, stall_timeout, entry, digest)
    env = mpi_environment(device_num, hosts) | {"MPIEXEC_TIMEOUT": str(int(timeout) + 5), LAUNCHER_VARIABLE: launcher_identity()}
    if entry is None:  # the job runner imports nothing from the current folder (python -P, for its children too)
        env["PYTHONSAFEPATH"] = "1"
    if single_host(hosts):
        remove_stale_segments()  # a dead job's segment under this job's name breaks MPI_Init
    started = time.monotonic()
    marked = entry is None and not hosts  # the launcher sees every rank, and each records how it ends
    was_reaper, before = become_subreaper(), set(descendants(os.getpid()))
    with ending_on_sigterm():
        terminal, ends = _rank_terminal(env) if Path(command[0]).name == "mpiexec.gforker" else ([], ())
        # mpiexec ends its job when this thread ends, even by SIGKILL: SIGTERM lets it end its proxies.
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True, pass_fds=ends,
                                   start_new_session=True, preexec_fn=lambda: die_with_parent(signal.SIGTERM))
        for end in ends:
            os.close(end)
        try:
            # On one machine nothing can be unreachable: only the global limit applies.
            seen = _supervise(process, terminal, run_dir, device_num, (timeout, startup_timeout if hosts else timeout), marked)
            leftovers = end_leftovers(run_dir, device_num, exclude=before)
            orphans = {pid: name for pid, name in kill_tree(os.getpid(), exclude=before).items() if pid not in leftovers}
        finally:
            if process.poll() is None:  # interrupted (Ctrl-C, SIGTERM): the job must not outlive the launcher
                _end(process)
                kill_tree(os.getpid(), exclude=before)
            become_subreaper(was_reaper)
    lines = seen.pop("lines") + _log_lines(run_dir, device_num)
    observed = Observed(lines, run_dir, device_num, process.returncode, rank_pids(run_dir, device_num, anywhere=True),
                        hosts=hosts, marked=marked, **seen)
    message = diagnose(observed) or (missing_results(run_dir, device_num) if entry is None else "")
    message += _leftovers_note(leftovers, orphans)
    code = {"timeout": 124, "startup": 1, "failed": 1}.get(seen["ended"], process.returncode)
    return LaunchResult(code or (1 if message else 0), message, run_dir, time.monotonic() - started)


def missing_results(run_dir: Path, device_num: int) -> str:
    """"" when rank 0 saved its result and every rank recorded exit status 0; else the
    failure line saying what is missing (mpiexec's status 0 alone proves nothing: a rank
    program replaced by a planted module exits 0 too).

    Example:
        >>> missing_results(Path("nowhere"), 2)
        'job failed: mpiexec exited with status 0, but rank 0 saved no result (nowhere/measured.json) and ranks 0-1 recorded no exit status 0 (rank_<i>/exit)'
    """
    missing = [] if read_record(run_dir / MEASURED) is not None else [f"rank 0 saved no result ({run_dir / MEASURED})"]
    failed = [rank for rank in range(device_num) if exit_status(run_dir, rank) != 0]
    if failed:
        ranks = f"rank {failed[0]}" if len(failed) == 1 else \
            f"ranks {failed[0]}-{failed[-1]}" if failed == list(range(failed[0], failed[-1] + 1)) else \
            f"ranks {', '.join(map(str, failed))}"
        missing.append(f"{ranks} recorded no exit status 0 (rank_<i>/exit)")
    return f"job failed: mpiexec exited with status 0, but {' and '.join(missing)}" if missing else ""


def _leftovers_note(leftovers: list[int], orphans: dict[int, str]) -> str:
    names = [f"rank process {pid}" for pid in leftovers] + [f"{name} {pid}" for pid, name in orphans.items()]
    return f"\nkilled {len(names)} process(es) of the job still running after mpiexec ended: {', '.join(names)}" if names else ""


def _prepare(run_dir: Path, device_num: int, hosts, stall_timeout: float, entry, digest: str | None) -> list[str]:
    """Write the stall limit, the host file and the command into new files of `run_dir`; the command."""
    mpiexec = find_mpiexec()
    create_file(run_dir / "stall_timeout", f"{stall_timeout}\n")
    hostfile = None
    if hosts:
        hostfile = run_dir / "hostfile"
        create_file(hostfile, hostfile_text(hosts))
    command = mpiexec_command(mpiexec, device_num, run_dir, hostfile, entry, digest)
    create_file(run_dir / "command", " ".join(command) + "\n")
    return command


def _rank_terminal(env: dict) -> tuple[list, tuple[int, int]]:
    """Pipes for the lines the ranks mean for the user, past the process manager (gforker
    relays the ranks' output in pieces that mix the lines of several ranks); their write ends go
    to the ranks through `env` (`rank.TERMINAL_VARIABLE`). Returns the read ends, as text
    streams for stdout and stderr, and the write ends."""
    out_read, out_write = os.pipe()
    err_read, err_write = os.pipe()
    env[TERMINAL_VARIABLE] = f"{out_write},{err_write}"
    return [open(out_read, errors="replace"), open(err_read, errors="replace")], (out_write, err_write)


def _supervise(process: subprocess.Popen, terminal: list, run_dir: Path, device_num: int, limits: tuple[float, float],
               marked: bool) -> dict:
    """Relay mpiexec's output and the ranks' `terminal` lines (stdout, stderr) and watch the ranks until it ends, ending it past the time limits
    (global, start-up), once a rank says it could not start, or, when the ranks mark how they
    end (`marked`), once one was killed. Returns the `Observed` fields seen: lines, ended,
    limit, deaths, stopped."""
    lines: list[str] = []
    unstarted: list[str] = []
    readers = [threading.Thread(target=_relay, args=(stream, out, lines, unstarted), daemon=True)
               for stream, out in zip((process.stdout, process.stderr, *terminal), (sys.stdout, sys.stderr) * 2)]
    deaths: list[int] = []
    stopped: dict[int, str] = {}
    monitor = threading.Thread(target=_watch_ranks, args=(process, run_dir, device_num, deaths, stopped, marked), daemon=True)
    for thread in (*readers, monitor):
        thread.start()
    ended, limit = _wait(process, run_dir, device_num, limits, deaths if marked else [], unstarted)
    monitor.join(timeout=1)
    for reader in readers:
        reader.join(timeout=5)
    if not any(reader.is_alive() for reader in readers):
        for stream in terminal:
            stream.close()
    return {"lines": lines, "ended": ended, "limit": limit, "deaths": deaths, "stopped": stopped}


def _relay(stream, out, lines: list[str], unstarted: list[str]) -> None:
    """Copy one of mpiexec's output streams to ours, keeping the lines for the diagnosis, and
    those of ranks that could not start in `unstarted`."""
    for line in stream:
        lines.append(line.rstrip("\n"))
        if f": {STARTUP_FAILED}: " in line and line.startswith("rank "):
            unstarted.append(lines[-1])
        out.write(line)
        out.flush()


def _log_lines(run_dir: Path, device_num: int) -> list[str]:
    """The ranks' failure lines from their logs: mpiexec may kill a rank before its line on
    the terminal got through, never before the line reached its own log file."""
    found = []
    for rank in range(device_num):
        text = read_record(run_dir / f"rank_{rank}" / "log")
        if text is None:
            continue
        found += [line for line in text.splitlines() if line.startswith(f"rank {rank}: ") and " step(s), sent " not in line]
    return found


def _wait(process: subprocess.Popen, run_dir: Path, device_num: int, limits: tuple[float, float], deaths: list[int],
          unstarted: list[str]) -> tuple[str, float]:
    """Wait for mpiexec; end it past the global limit, past the start-up limit while a rank has
    not recorded its pid (a host that never answers keeps mpiexec waiting for as long as ssh
    does), as soon as a rank is in `deaths`, or in `unstarted` (the others would wait for it in
    MPI's start-up). Returns why the launcher ended it ("timeout", "startup", "died", "failed"
    or "") and after which limit."""
    (timeout, startup_timeout), started = limits, time.monotonic()
    while True:
        try:
            process.wait(timeout=0.25)
            return "", 0.0
        except subprocess.TimeoutExpired:
            pass
        elapsed = time.monotonic() - started
        if unstarted:
            _end(process)
            return "failed", 0.0
        if deaths:
            _end(process)
            return "died", 0.0
        if elapsed > timeout:
            _end(process)
            return "timeout", timeout
        if elapsed > startup_timeout and len(rank_pids(run_dir, device_num, anywhere=True)) < device_num:
            _end(process)
            return "startup", startup_timeout


def _end(process: subprocess.Popen) -> None:
    """End mpiexec and everything it started. SIGTERM first: mpiexec then tells the proxies of
    other hosts to end their ranks; past a grace period SIGKILL the whole tree, which mpiexec
    spread over sessions of their own."""
    try:
        process.terminate()
        process.wait(timeout=2.0)
    except subprocess.TimeoutExpired:
        pass
    kill_tree(process.pid)
    process.kill()
    process.wait()


def _watch_ranks(process: subprocess.Popen, run_dir: Path, device_num: int, deaths: list[int], stopped: dict[int, str],
                 marked: bool) -> None:
    """While mpiexec runs, note the ranks (on this host) whose process ends, in order, and those
    found stopped (``kill -STOP``: such a rank cannot speak for itself). When the ranks mark how
    they end (`marked`), only those killed count as deaths (`killed`); otherwise every end does
    (mpiexec kills the others when one dies, and only the order tells who went first)."""
    pids: dict[int, int] = {}
    ended: set[int] = set()
    while process.poll() is None:
        if len(pids) < device_num:
            pids = rank_pids(run_dir, device_num)
        for rank, pid in sorted(pids.items()):
            state = process_state(pid)
            if state is not None and state.stopped:
                stopped.setdefault(rank, state.state)
            if rank in ended or (state.running if state else running(pid)):
                continue
            ended.add(rank)
            if not marked or killed(run_dir, device_num, rank):
                deaths.append(rank)
        time.sleep(0.005)


def killed(run_dir: Path, device_num: int, rank: int) -> bool:
    """Whether `rank`, whose process ended, was killed (or crashed): it recorded no exit status,
    and no rank is aborting the job (whose other ranks mpiexec kills)."""
    if exit_status(run_dir, rank) is not None:
        return False
    return not any(exit_status(run_dir, other) not in (None, 0) for other in range(device_num))


def end_leftovers(run_dir: Path, device_num: int, grace: float = 3.0, exclude=()) -> list[int]:
    """Kill rank processes that outlive mpiexec (after `grace` seconds); returns their pids.
    Only the recorded pids that are processes this launcher started count: its descendants
    (it is their subreaper) but the subtrees of `exclude`, never a pid merely read from a file.
    A zombie is not alive here: its parent (the launcher itself, once mpiexec's proxy is gone)
    has yet to reap it."""
    deadline = time.monotonic() + grace
    ours = set(descendants(os.getpid(), exclude))
    pids = [pid for pid in rank_pids(run_dir, device_num).values() if pid in ours]
    while any(running(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    killed = [pid for pid in pids if running(pid)]
    for pid in killed:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return killed
