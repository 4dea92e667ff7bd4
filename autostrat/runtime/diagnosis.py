"""Why a job failed, in one message that names the failing host or rank first.

The causes, most specific first:

1. a host whose ranks never started: mpiexec could not launch its proxy there (``ssh`` names
   the host in its own error line) or the launcher's start-up limit passed without every rank
   recording its pid; the rank table maps the missing ranks to their hosts;
2. a rank whose process was found stopped (``kill -STOP``): it cannot speak, and the ranks
   waiting for it in a collective time out and would otherwise be blamed;
3. the first rank process seen to die without recording an exit status (the launcher then
   ended the job), or, across hosts, the one of mpiexec's "BAD TERMINATION" report;
4. the ranks' own one-line messages (``rank i: could not start: <cause>`` among them): raised
   errors first, then the stalled ranks stuck where the fewest ranks are;
5. the launcher's global time limit.
"""

from __future__ import annotations

import re
import socket
from dataclasses import dataclass, field
from pathlib import Path

_RANK_LINE = re.compile(r"^rank (\d+): (.*)$")
_DEAD_PID = re.compile(r"PID (\d+) RUNNING AT")
_EXIT = re.compile(r"(EXIT CODE: \d+|KILLED BY SIGNAL: [^\n=]*)")
_HYDRA_LINE = re.compile(r"^\[mpiexec@[^]]*\] [^:]*\([^)]*\): (.*)$")
_LAUNCH_FAILED = "Launch proxy failed"
_LOCAL_NAMES = ("127.0.0.1", "localhost", socket.gethostname())
_STOPPED = {"T": "its process is stopped (state T: SIGSTOP, or SIGTSTP from a terminal)",
            "t": "its process is stopped by a debugger (state t)"}


@dataclass(frozen=True)
class Observed:
    """What the launcher saw of a job: mpiexec's and the ranks' lines, how mpiexec ended, why the
    launcher ended it (`ended`: "timeout", "startup", "died", "failed" (a rank could not start) or ""), after `limit` seconds, the ranks
    (on this machine) in the order their processes died, the ranks found stopped with their
    process state, and the rank table's ``(host, slots)`` (None: this machine only)."""

    lines: list[str]
    run_dir: Path
    device_num: int
    returncode: int
    pids: dict[int, int]
    ended: str = ""
    limit: float = 0.0
    deaths: list[int] = field(default_factory=list)
    stopped: dict[int, str] = field(default_factory=dict)
    hosts: list[tuple[str, int]] | None = None
    marked: bool = False  # the ranks record how they end, and `deaths` holds only those killed


def diagnose(seen: Observed) -> str:
    """One message naming the failing host(s) or rank(s), or "" when the job succeeded.

    Example:
        >>> diagnose(Observed(["rank 1: ValueError: bad"], Path("run"), 2, 1, {}))
        'job failed: rank 1: ValueError: bad'
    """
    if seen.returncode == 0 and not seen.ended:
        return ""
    errors = {}
    for line in seen.lines:
        match = _RANK_LINE.match(line.strip())
        if match:
            errors.setdefault(int(match.group(1)), match.group(2))
    blamed = [*_unstarted_hosts(seen), *_stopped_ranks(seen)]
    died = _dead_rank(seen)
    # A rank that never started or was stopped explains the others' stalls: those go below.
    blamed += ([died] if died else []) + ([] if blamed else _blame(errors))
    if seen.ended == "timeout":
        blamed += _never_started(seen)
        blamed.append(f"the job did not finish within {seen.limit:g} s and was killed")
    if not blamed:
        blamed.append(f"mpiexec exited with status {seen.returncode}; see the rank logs in {seen.run_dir}")
    said = " ".join(blamed)
    others = [f"rank {rank}: {text}" for rank, text in sorted(errors.items()) if f"rank {rank}: {text}" not in said]
    return "\n".join([f"job failed: {blamed[0]}", *blamed[1:], *(["other ranks:"] + others if others else [])])


def host_ranks(hosts) -> list[tuple[str, range]]:
    """Each host of the rank table with its ranks (mpiexec fills a host's slots in order).

    Example:
        >>> host_ranks([("127.0.0.1", 4), ("node1.invalid", 4)])
        [('127.0.0.1', range(0, 4)), ('node1.invalid', range(4, 8))]
    """
    spans, first = [], 0
    for host, slots in hosts:
        spans.append((host, range(first, first + slots)))
        first += slots
    return spans


def _ranks_text(ranks: range) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {ranks[0]}-{ranks[-1]}"


def _never_started(seen: Observed) -> list[str]:
    """This machine's ranks that recorded no pid before the job's time limit: a job that never
    got going says so, not only that it ran out of time (a rank table's hosts have
    `_unstarted_hosts` and their own start-up limit).

    Example:
        >>> _never_started(Observed([], Path("run"), 4, -9, {0: 11, 2: 13}, ended="timeout", limit=60.0))
        ['ranks 1, 3 never started on this machine (recorded no pid within 60 s)']
    """
    never = [rank for rank in range(seen.device_num) if rank not in seen.pids]
    if seen.hosts or not never:
        return []
    return [f"rank{'s' if len(never) > 1 else ''} {', '.join(map(str, never))} never started on this machine "
            f"(recorded no pid within {seen.limit:g} s)"]


def _unstarted_hosts(seen: Observed) -> list[str]:
    """The hosts whose ranks never started, when mpiexec could not launch a host or the
    start-up limit passed: those named in a launcher's (ssh's) error line, else those with a
    rank that never recorded its pid."""
    if seen.ended != "startup" and not any(_LAUNCH_FAILED in line for line in seen.lines):
        return []
    spans = host_ranks(seen.hosts or [("this machine", seen.device_num)])
    named = {host: line.strip() for host, _ in spans for line in seen.lines if _mentions(line, host)}
    missing = [(host, ranks) for host, ranks in spans if any(rank not in seen.pids for rank in ranks)]
    # A failed launch is a remote host's: mpiexec starts this machine's ranks without ssh, and
    # they may simply not have recorded their pids yet when the job ends within a second.
    missing = [(host, ranks) for host, ranks in missing if host not in _LOCAL_NAMES] or missing
    chosen = [(host, ranks) for host, ranks in spans if host in named] or missing or spans
    hydra = next((match.group(1) for match in map(_HYDRA_LINE.match, seen.lines) if match), "")
    if seen.ended == "startup":
        why = f"its ranks did not start within {seen.limit:g} s (host unreachable, or no password-less ssh to it?)"
    else:
        why = f"mpiexec could not start its ranks: {hydra or 'launch failed'}"
    return [f"host {host} ({_ranks_text(ranks)}): {named.get(host, why)}" for host, ranks in chosen]


def _mentions(line: str, host: str) -> bool:
    """A line of the launcher (ssh), not of mpiexec or a rank, naming `host` as a whole word."""
    if line.startswith("[mpiexec@") or _RANK_LINE.match(line.strip()):
        return False
    return re.search(rf"(?<![\w.-]){re.escape(host)}(?![\w-]|\.\w)", line) is not None


def _stopped_ranks(seen: Observed) -> list[str]:
    return [f"rank {rank} (pid {seen.pids.get(rank)}) stopped making progress: {_STOPPED.get(state, f'state {state}')}"
            for rank, state in sorted(seen.stopped.items())]


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


def _dead_rank(seen: Observed) -> str:
    """The rank whose process was killed: with ranks that mark how they end (`marked`), the first
    seen to end without an exit status; else mpiexec's report of a rank process that died, the
    rank being the first one seen to end (mpiexec names whichever pid it reaped first, often one
    it killed itself). None when a rank could not start: the launcher then ended the others."""
    if seen.ended == "failed":
        return ""
    if seen.marked and seen.deaths and seen.ended in ("", "died"):  # not the ranks a time limit ended
        # mpiexec's exit string is of whichever process it reaped first: no evidence of the cause.
        first, by = seen.deaths[0], "the launcher" if seen.ended == "died" else "mpiexec"
        return (f"rank {first} (pid {seen.pids.get(first)}) died first: its process ended without recording an "
                f"exit status (killed, or crashed); {by} then ended the other ranks")
    text = "\n".join(seen.lines)
    match = _DEAD_PID.search(text)
    if not match or "application called MPI_Abort" in text:
        return ""
    how = _EXIT.search(text)
    signal_text = re.search(r"EXIT STRING: ([^\n]*)", text)
    cause = signal_text.group(1).strip() if signal_text else how.group(1).strip() if how else "terminated"
    if seen.deaths:
        first = seen.deaths[0]
        return f"rank {first} (pid {seen.pids.get(first)}) died first: {cause}; mpiexec then ended the other ranks"
    pid = int(match.group(1))
    ranks = [rank for rank, recorded in seen.pids.items() if recorded == pid]
    return f"{f'rank {ranks[0]}' if ranks else 'a rank'} (pid {pid}) died: {cause}"
