"""The rank entry point: ``mpiexec -n N python -m mpi4py -m autostrat.runtime.rank RUN_DIR --digest HEX``.

HEX is the job's digest (`job_file.save_job`'s return value): a rank checks the job's files
against it before it uses any of them, and a changed job fails like any other rank error.

Each rank writes everything it prints to ``RUN_DIR/rank_<i>/log`` (like MindSpore's
``device<i>/train.log<i>``) and its process id to ``rank_<i>/pid``; only rank 0's report and
one line per failing rank go to the terminal (on one machine through the launcher's own pipes,
`TERMINAL_VARIABLE`: gforker would mix the lines of several ranks). A rank that raises prints ``rank i: <error>``
and aborts the whole job; a rank that stops making progress is ended by its `Watchdog`. A rank
that ends on its own terms (done, or aborting the job) writes its status to ``rank_<i>/exit``.

The launcher starts ranks with ``python -P`` (``PYTHONSAFEPATH``): the folder ``autostrat run``
was started from is on no rank's import path, so a ``numpy.py`` there runs nowhere. Every file a
rank writes in the run folder is new (`run_folder.create_file`, `run_folder.open_new`). A rank
that cannot start (its folder or files cannot be written: a full disk) prints ``rank i: could
not start: <cause>`` and exits at once, which the launcher takes for the end of the job. Rank 0
prints the job's result before it writes it, so that a full disk loses no result: the failure
then names the file that could not be written. A rank dies with its parent (mpiexec.gforker,
or hydra's proxy), and its watchdog ends it once the job's launcher is gone.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import traceback
from pathlib import Path

# Only light modules here: a rank records its pid before it imports the job's machinery (numpy
# and the runtime: seconds when eight ranks share two cores), so the launcher sees it start.
from autostrat.errors import AutostratError, RuntimeBackendError
from autostrat.runtime.processes import LAUNCHER_VARIABLE, die_with_parent
from autostrat.runtime.run_folder import create_file, open_new, read_record
from autostrat.runtime.watchdog import Watchdog, say

STARTUP_FAILED = "could not start"  # rank i: could not start: <cause>; the launcher ends the job on it
TERMINAL_VARIABLE = "AUTOSTRAT_TERMINAL"  # "OUT,ERR": the launcher's pipes for the lines meant for the user
REPORT = "report.txt"


def record_pid(run_dir: Path, rank: int) -> Path:
    """Create ``rank_<rank>/`` (0700, new) with this process's host in ``host`` and its id in
    ``pid`` (the launcher's sign that the rank started, and how it finds the process: a pid
    means nothing on another host); returns the rank's folder."""
    folder = run_dir / f"rank_{rank}"
    try:
        folder.mkdir(mode=0o700)
    except OSError as error:
        raise RuntimeBackendError(f"cannot create {folder}: {error.strerror or error}") from None
    create_file(folder / "host", f"{socket.gethostname()}\n")
    create_file(folder / "pid", f"{os.getpid()}\n")
    return folder


def redirect_output(run_dir: Path, rank: int, record: bool = True, terminal: tuple[int, int] | None = None) -> tuple[int, int]:
    """Send this process's stdout and stderr to a new ``rank_<rank>/log`` (after recording the
    pid, unless `record` is False: done already); return the descriptors for the lines meant
    for the user: `terminal`, or copies of the original stdout and stderr (through mpiexec)."""
    folder = record_pid(run_dir, rank) if record else run_dir / f"rank_{rank}"
    try:
        log = open_new(folder / "log")
    except OSError as error:
        raise RuntimeBackendError(f"cannot write {folder / 'log'}: {error.strerror or error}") from None
    terminal_out, terminal_err = terminal or (os.dup(1), os.dup(2))
    sys.stdout.flush(), sys.stderr.flush()
    os.dup2(log, 1), os.dup2(log, 2)
    os.close(log)
    return terminal_out, terminal_err


def terminal_descriptors() -> tuple[int, int] | None:
    """The launcher's pipes for this rank's lines meant for the user (`TERMINAL_VARIABLE`),
    None when it gave none (then the process manager relays stdout and stderr)."""
    out, _, err = os.environ.get(TERMINAL_VARIABLE, "").partition(",")
    return (int(out), int(err)) if out.isdigit() and err.isdigit() else None


def start_step(step, rank: int, fd: int):
    """`step()`'s value; if it fails (a full disk, a folder that exists already), say so in
    one line and end this process at once: the launcher ends the job on that line, while the
    other ranks would wait for this one in MPI's start-up until the job's time limit."""
    try:
        return step()
    except (OSError, AutostratError) as error:
        say(fd, f"rank {rank}: {STARTUP_FAILED}: {getattr(error, 'strerror', None) or error}", log_fd=None)
        os._exit(1)


def inject(fault, backend) -> None:
    """Fail the way the fault tests ask for."""
    if fault.kind == "raise":
        raise RuntimeError(f"injected failure at instruction {fault.at}")
    if fault.kind == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if fault.kind == "stop":  # frozen: even its watchdog cannot speak
        os.kill(os.getpid(), signal.SIGSTOP)
    if fault.kind == "hang":
        backend.barrier_on_copy()  # alone in a collective: the others never join
    while fault.kind == "loop":
        pass


def _hook(program, watchdog: Watchdog, fault, backend):
    from autostrat.runtime.instructions import LOCAL_KINDS, Communicate, Recv, RingCompute

    def on_instruction(index: int, instruction) -> None:  # a Recv waits on another stage as a collective on its group
        collective = isinstance(instruction, (Recv, RingCompute)) or isinstance(instruction, Communicate) and instruction.kind not in LOCAL_KINDS
        name = getattr(instruction, "edge", None) or getattr(instruction, "op", None) or getattr(instruction, "tensor", "")
        watchdog.progress(f"instruction {index} ({type(instruction).__name__} {getattr(instruction, 'kind', '')} {name})", collective)
        if fault is not None and fault.rank == program.rank and fault.at == index:
            watchdog.progress(f"instruction {index} (injected {fault.kind})", fault.kind == "hang")
            inject(fault, backend)
    return on_instruction


def run_rank(run_dir: Path, digest: str, backend, watchdog: Watchdog, terminal_out: int) -> bool:
    """Run every step of the job on this rank (once its files match `digest`); rank 0 prints
    the report, then saves it (`save_result`)."""
    from autostrat.runtime.job import run_steps
    from autostrat.runtime.job_file import load_job
    from autostrat.runtime.report import format_report

    job = load_job(run_dir, digest, backend.rank)
    # Start-up, this rank's own work, is over: the communicators are made by every rank together,
    # so a rank missing from them is a stalled collective (the stall limit), not a slow start.
    watchdog.progress("setting up the communicators", collective=True)
    hook = _hook(job.programs[backend.rank], watchdog, job.fault, backend) if backend.device_num == job.device_num else None
    summaries = run_steps(job, backend, hook, lambda: watchdog.progress("gathering the report", collective=True), _log)
    if summaries is None:
        return True
    check = format_report(job, summaries, "MPI")
    say(terminal_out, check.text, log_fd=None)  # the result reaches the user before any file is written
    save_result(run_dir, check)
    print(check.text, flush=True)
    return check.ok


def save_result(run_dir: Path, check) -> None:
    """Write rank 0's report and measured figures to new files in `run_dir`; a failure names
    the file the result (printed already) could not be written to."""
    from autostrat.runtime.report import MEASURED

    try:
        create_file(run_dir / REPORT, check.text + "\n")
        create_file(run_dir / MEASURED, json.dumps(check.measured) + "\n")
    except RuntimeBackendError as error:
        raise RuntimeBackendError(f"the result printed above was not saved: {error}") from None


def _log(line: str) -> None:
    print(line, flush=True)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    run_dir = Path(argv[0])
    die_with_parent()  # mpiexec's proxy: a rank outlives no part of its job
    # Ranks busy-wait inside collectives. One step below the launcher's priority, its watcher
    # still sees which rank died first when ranks outnumber cores (measured: with two CPU hogs
    # running, the killed rank was misnamed in 3 of 5 runs at equal priority).
    os.nice(5)
    # mpiexec.gforker interrupts every rank when one dies: the launcher ends the job itself, once
    # it saw which rank died first (a rank has no terminal to be interrupted from).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    terminal = terminal_descriptors()
    errors = terminal[1] if terminal else 2
    recorded = os.environ.get("PMI_RANK", "").isdigit()
    if recorded:
        # Before MPI starts: MPI_Init waits for every host, and the launcher tells the hosts that
        # never started their ranks from those that did by these files.
        rank = int(os.environ["PMI_RANK"])
        start_step(lambda: record_pid(run_dir, rank), rank, errors)
    # The job's machinery, once the pid is recorded and before the watchdog counts the start-up.
    from autostrat.runtime import job_file, report  # noqa: F401
    from autostrat.runtime.mpi import MpiBackend

    backend = MpiBackend()
    terminal_out, terminal_err = start_step(lambda: redirect_output(run_dir, backend.rank, not recorded, terminal),
                                            backend.rank, errors)
    print(f"rank {backend.rank} of {backend.device_num}: pid {os.getpid()}", flush=True)
    watchdog = Watchdog(backend.rank, _stall_limit(run_dir), lambda: end_rank(run_dir, backend.rank, 3, backend),
                        fd=terminal_err, launcher=os.environ.get(LAUNCHER_VARIABLE))
    try:
        ok = run_rank(run_dir, digest_argument(argv), backend, watchdog, terminal_out)
    except BaseException as error:  # noqa: BLE001  (any failure must end the whole job)
        _print_traceback()
        say(terminal_err, f"rank {backend.rank}: {type(error).__name__}: {error}")
        return end_rank(run_dir, backend.rank, 1, backend)
    watchdog.stop()
    return end_rank(run_dir, backend.rank, 0 if ok else 4)


def _print_traceback() -> None:
    """The traceback to the rank's log, unless the log cannot be written (a full disk): the
    one-line message still reaches the terminal."""
    try:
        traceback.print_exc()
        sys.stdout.flush(), sys.stderr.flush()
    except OSError:
        pass


def end_rank(run_dir: Path, rank: int, status: int, backend=None) -> int:
    """Record that this rank ends on its own terms (``rank_<rank>/exit`` holds `status`) and,
    given the `backend`, abort the whole job. The launcher takes a rank process that ends
    without this file for one that was killed or crashed, and ends the job itself."""
    try:
        create_file(run_dir / f"rank_{rank}" / "exit", f"{status}\n")
    except RuntimeBackendError:
        pass  # a full disk: the launcher takes the rank for killed, and its own line says why
    if backend is not None:
        backend.abort(status)
    return status


def digest_argument(argv: list[str]) -> str:
    """The job's digest from the arguments ``RUN_DIR --digest HEX``.

    Example:
        >>> digest_argument(["runs/x", "--digest", "ab" * 32]) == "ab" * 32
        True
    """
    if len(argv) != 3 or argv[1] != "--digest":
        raise RuntimeBackendError(f"expected the arguments RUN_DIR --digest HEX (the job's digest), got {' '.join(argv)}")
    return argv[2]


def _stall_limit(run_dir: Path) -> float:
    """The job's stall limit, read before the job itself so start-up is watched too."""
    try:
        return float(read_record(run_dir / "stall_timeout") or "")
    except ValueError:
        return 10.0


if __name__ == "__main__":
    sys.exit(main())
