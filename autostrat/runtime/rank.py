"""The rank entry point: ``mpiexec -n N python -m mpi4py -m autostrat.runtime.rank RUN_DIR --digest HEX``.

HEX is the job's digest (`job_file.save_job`'s return value): a rank checks the job's files
against it before it uses any of them, and a changed job fails like any other rank error.

Each rank writes everything it prints to ``RUN_DIR/rank_<i>/log`` (like MindSpore's
``device<i>/train.log<i>``) and its process id to ``rank_<i>/pid``; only rank 0's report and
one line per failing rank go to the terminal. A rank that raises prints ``rank i: <error>``
and aborts the whole job; a rank that stops making progress is ended by its `Watchdog`. A rank
that ends on its own terms (done, or aborting the job) writes its status to ``rank_<i>/exit``.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import traceback
from pathlib import Path

from autostrat.errors import RuntimeBackendError
from autostrat.io import write_atomically
from autostrat.runtime.job import run_steps
from autostrat.runtime.job_file import load_job
from autostrat.runtime.program import Communicate
from autostrat.runtime.report import MEASURED, format_report
from autostrat.runtime.watchdog import Watchdog, say


def record_pid(run_dir: Path, rank: int) -> Path:
    """Write this process's id to ``rank_<rank>/pid`` and its host to ``rank_<rank>/host`` (the
    launcher's sign that the rank started, and how it finds the process: a pid means nothing on
    another host); returns the rank's folder."""
    folder = run_dir / f"rank_{rank}"
    folder.mkdir(parents=True, exist_ok=True)
    write_atomically(folder / "host", f"{socket.gethostname()}\n", private=True)
    write_atomically(folder / "pid", f"{os.getpid()}\n", private=True)
    return folder


def redirect_output(run_dir: Path, rank: int) -> tuple[int, int]:
    """Send this process's stdout and stderr to ``rank_<rank>/log``; return copies of the
    original descriptors (the terminal, through mpiexec) for the lines meant for the user."""
    folder = record_pid(run_dir, rank)
    terminal_out, terminal_err = os.dup(1), os.dup(2)
    log = os.open(folder / "log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    sys.stdout.flush(), sys.stderr.flush()
    os.dup2(log, 1), os.dup2(log, 2)
    os.close(log)
    return terminal_out, terminal_err


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
    def on_instruction(index: int, instruction) -> None:
        collective = isinstance(instruction, Communicate) and instruction.kind != "Slice"
        name = getattr(instruction, "edge", None) or getattr(instruction, "op", None) or getattr(instruction, "tensor", "")
        watchdog.progress(f"instruction {index} ({type(instruction).__name__} {getattr(instruction, 'kind', '')} {name})", collective)
        if fault is not None and fault.rank == program.rank and fault.at == index:
            watchdog.progress(f"instruction {index} (injected {fault.kind})", fault.kind == "hang")
            inject(fault, backend)
    return on_instruction


def run_rank(run_dir: Path, digest: str, backend, watchdog: Watchdog, terminal_out: int) -> bool:
    """Run every step of the job on this rank (once its files match `digest`); rank 0 prints
    and saves the report."""
    job = load_job(run_dir, digest)
    hook = _hook(job.programs[backend.rank], watchdog, job.fault, backend) if backend.device_num == job.device_num else None
    summaries = run_steps(job, backend, hook, lambda: watchdog.progress("gathering the report", collective=True), _log)
    if summaries is None:
        return True
    check = format_report(job, summaries, "MPI")
    write_atomically(run_dir / "report.txt", check.text + "\n")
    write_atomically(run_dir / MEASURED, json.dumps(check.measured) + "\n")
    print(check.text, flush=True)
    say(terminal_out, check.text, log_fd=None)
    return check.ok


def _log(line: str) -> None:
    print(line, flush=True)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    run_dir = Path(argv[0])
    # Ranks busy-wait inside collectives. One step below the launcher's priority, its watcher
    # still sees which rank died first when ranks outnumber cores (measured: with two CPU hogs
    # running, the killed rank was misnamed in 3 of 5 runs at equal priority).
    os.nice(5)
    if os.environ.get("PMI_RANK", "").isdigit():
        # Before MPI starts: MPI_Init waits for every host, and the launcher tells the hosts that
        # never started their ranks from those that did by these files.
        record_pid(run_dir, int(os.environ["PMI_RANK"]))
    from autostrat.runtime.mpi import MpiBackend

    backend = MpiBackend()
    terminal_out, terminal_err = redirect_output(run_dir, backend.rank)
    print(f"rank {backend.rank} of {backend.device_num}: pid {os.getpid()}", flush=True)
    watchdog = Watchdog(backend.rank, _stall_limit(run_dir), lambda: end_rank(run_dir, backend.rank, 3, backend),
                        fd=terminal_err)
    try:
        ok = run_rank(run_dir, digest_argument(argv), backend, watchdog, terminal_out)
    except BaseException as error:  # noqa: BLE001  (any failure must end the whole job)
        traceback.print_exc()
        say(terminal_err, f"rank {backend.rank}: {type(error).__name__}: {error}")
        sys.stdout.flush(), sys.stderr.flush()
        return end_rank(run_dir, backend.rank, 1, backend)
    watchdog.stop()
    return end_rank(run_dir, backend.rank, 0 if ok else 4)


def end_rank(run_dir: Path, rank: int, status: int, backend=None) -> int:
    """Record that this rank ends on its own terms (``rank_<rank>/exit`` holds `status`) and,
    given the `backend`, abort the whole job. The launcher takes a rank process that ends
    without this file for one that was killed or crashed, and ends the job itself."""
    write_atomically(run_dir / f"rank_{rank}" / "exit", f"{status}\n", private=True)
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
        return float((run_dir / "stall_timeout").read_text())
    except (OSError, ValueError):
        return 10.0


if __name__ == "__main__":
    sys.exit(main())
