"""The processes of a job, read from ``/proc``: alive or dying, stopped, and the whole tree.

mpiexec (hydra) puts each child it starts (a local ``hydra_pmi_proxy``, an ``ssh`` for a remote
host, each rank) in a session of its own, and exits without waiting for them when a launch
fails, so neither its process group nor its session finds them afterwards. The launcher
therefore becomes a child subreaper while a job runs: every orphan of the job is re-parented to
the launcher instead of PID 1, and the job's processes are exactly the launcher's descendants
that were not there before. Without ``/proc`` (not Linux) only the rank pids are known.

A launcher killed outright (SIGKILL) cannot clean up: mpiexec gets a parent-death signal
(`die_with_parent`), so do the ranks from their own parent, and every rank's watchdog ends its
rank once the launcher it names (`launcher_identity`: pid and start time) is gone.
"""

from __future__ import annotations

import ctypes
import os
import signal
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

_PF_EXITING = 0x4  # the kernel's per-process flag, set as soon as the process starts dying
_PR_SET_CHILD_SUBREAPER = 36  # prctl options (linux/prctl.h)
_PR_GET_CHILD_SUBREAPER = 37
_PR_SET_PDEATHSIG = 1
LAUNCHER_VARIABLE = "AUTOSTRAT_LAUNCHER"  # "PID:START": the launcher of this rank's job


class Terminated(KeyboardInterrupt):
    """SIGTERM (``kill``, ``timeout``, SLURM, systemd) ends a launcher the way Ctrl-C does: every
    ``finally`` runs and the job's processes are ended; `signum` names the signal."""

    signum = signal.SIGTERM


@dataclass(frozen=True)
class ProcessState:
    """One line of ``/proc/PID/stat``, the fields the launcher reads."""

    state: str  # R running, S sleeping, T stopped, t traced, Z zombie, X dead...
    parent: int
    flags: int
    started: int  # clock ticks after boot: with the pid, names one process for good

    @property
    def stopped(self) -> bool:
        return self.state in ("T", "t")

    @property
    def running(self) -> bool:
        return self.state not in ("Z", "X") and not self.flags & _PF_EXITING


def process_state(pid: int) -> ProcessState | None:
    """The state of process `pid`, or None when it is gone (or there is no ``/proc``).

    Example:
        >>> process_state(os.getpid()).running, process_state(os.getpid()).parent == os.getppid()
        (True, True)
    """
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()  # the command name may hold spaces
    except (OSError, IndexError):
        return None
    return ProcessState(fields[0], int(fields[1]), int(fields[6]), int(fields[19]))


def alive(pid: int) -> bool:
    """The process exists (a zombie included)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def running(pid: int) -> bool:
    """Alive and not dying: a killed process tears its memory down for some milliseconds
    before it becomes a zombie, and mpiexec may kill the others meanwhile; the exiting
    flag is set at once."""
    state = process_state(pid)
    if state is None:
        return alive(pid) if not Path("/proc/self").exists() else False
    return state.running


def parents() -> dict[int, int]:
    """Every process's parent, from ``/proc`` (empty without it)."""
    found = {}
    for entry in os.scandir("/proc") if Path("/proc/self").exists() else ():
        if entry.name.isdigit():
            state = process_state(int(entry.name))
            if state is not None:
                found[int(entry.name)] = state.parent
    return found


def descendants(pid: int, exclude=()) -> list[int]:
    """The processes under `pid`, parents before children, leaving out the subtrees of `exclude`.

    Example:
        >>> descendants(os.getpid(), exclude=descendants(os.getpid()))
        []
    """
    children: dict[int, list[int]] = {}
    for child, parent in parents().items():
        children.setdefault(parent, []).append(child)
    found, queue = [], [child for child in children.get(pid, []) if child not in exclude]
    while queue:
        found.append(queue.pop(0))
        queue += [child for child in children.get(found[-1], []) if child not in exclude]
    return found


def become_subreaper(on: bool = True) -> bool:
    """Make this process the reaper of its descendants' orphans (Linux); returns the old
    setting, so that a caller can restore it. False where prctl is unavailable."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        old = ctypes.c_int(0)
        libc.prctl(_PR_GET_CHILD_SUBREAPER, ctypes.byref(old), 0, 0, 0)
        libc.prctl(_PR_SET_CHILD_SUBREAPER, int(on), 0, 0, 0)
        return bool(old.value)
    except (OSError, AttributeError):
        return False


@contextmanager
def ending_on_sigterm():
    """Within this block SIGTERM raises `Terminated` in the main thread, as SIGINT raises
    KeyboardInterrupt; a second SIGTERM is ignored while the first one's clean-up runs. Nothing
    changes in another thread (Python runs signal handlers in the main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def terminate(signum, frame):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise Terminated()

    previous = signal.signal(signal.SIGTERM, terminate)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def die_with_parent(signum: int = signal.SIGKILL) -> None:
    """Have the kernel send `signum` to this process when the thread that started it ends
    (Linux; nothing elsewhere). For ``preexec_fn``, or a process's first lines."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(signum), 0, 0, 0)
    except (OSError, AttributeError):
        pass


def launcher_identity(pid: int | None = None) -> str:
    """``PID:START`` of process `pid` (default: this one), what `LAUNCHER_VARIABLE` holds.

    Example:
        >>> launcher_identity().startswith(f"{os.getpid()}:")
        True
    """
    pid = os.getpid() if pid is None else pid
    state = process_state(pid)
    return f"{pid}:{state.started if state else 0}"


def launcher_gone(identity: str | None) -> bool:
    """Whether the launcher `identity` names (``PID:START``) has ended: its pid is not running,
    or now belongs to another process. False when there is no identity to check."""
    pid, _, started = (identity or "").partition(":")
    if not pid.isdigit() or not started.isdigit():
        return False
    state = process_state(int(pid))
    if state is None:
        return not alive(int(pid))
    return not state.running or (int(started) != 0 and state.started != int(started))


def process_name(pid: int) -> str:
    """The command name of `pid` ("" when gone)."""
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def kill_tree(pid: int, exclude=(), rounds: int = 5) -> dict[int, str]:
    """SIGKILL every process under `pid` (but the subtrees of `exclude`) until none is left,
    reaping those that became our children; returns the names of the pids killed. Several
    rounds, because a process may fork while its siblings die."""
    killed: dict[int, str] = {}
    for _ in range(rounds):
        found = [child for child in descendants(pid, exclude) if running(child)]
        for child in found:
            name = process_name(child)
            try:
                os.kill(child, signal.SIGKILL)
            except ProcessLookupError:
                continue
            killed[child] = name
        reap_children(pid, exclude)
        if not found:
            break
        time.sleep(0.05)
    return killed


def reap_children(pid: int, exclude=(), wait: float = 1.0) -> None:
    """Collect the exit status of `pid`'s dead children (not `exclude`), waiting up to `wait`
    seconds for those still dying: an orphan nobody reaps stays a zombie for good."""
    if pid != os.getpid():
        return
    deadline = time.monotonic() + wait
    for child in [child for child, parent in parents().items() if parent == pid and child not in exclude]:
        while True:
            try:
                done, _ = os.waitpid(child, os.WNOHANG)
            except ChildProcessError:
                break
            if done or time.monotonic() > deadline:
                break
            time.sleep(0.01)
