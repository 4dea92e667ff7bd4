"""A rank's watchdog: a thread that ends the whole job when its rank stops making progress.

No launcher notices a rank stuck inside a collective or in an endless loop: every rank runs a
deadline from its last progress. A rank inside a collective gets a few more seconds than a rank
computing, because it is usually waiting for the rank that is stuck, and the rank that is really
stuck should be the first to speak. On expiry the watchdog prints one line naming the rank and
what it was doing, gives the other ranks a moment to print theirs, and aborts the job.

A watchdog given its job's `launcher` (``PID:START``, `processes.launcher_identity`) also ends
its rank at once when that launcher is gone: killed outright, it could not end the job itself.
"""

from __future__ import annotations

import os
import threading
import time

from autostrat.runtime.processes import launcher_gone

COLLECTIVE_GRACE = 3.0  # extra seconds for a rank waiting inside a collective
# Seconds a rank may take to start (load and check its job) before its first instruction: all
# ranks load at once and share the cores with the rest of the machine. The stall limit alone
# ended a whole job of 8 ranks "in start-up" at load average ~15 (the suite's
# test_config_on_8_mpi_ranks[transformer_stack], 10 s): a busy machine is no stalled rank.
START_UP_LIMIT = 60.0
SPEAK_PAUSE = 1.5  # seconds between the stall line and the abort, for the other ranks' lines


def say(fd: int, line: str, log_fd: int | None = 2) -> None:
    """One line in one write to the terminal (`fd`), so lines of several ranks never
    interleave, and the same line to the rank's log (`log_fd`, its redirected stderr), if the
    log can still be written (a full disk must not keep the line from the terminal)."""
    data = (line.rstrip("\n") + "\n").encode()
    os.write(fd, data)
    if log_fd is not None and log_fd != fd:
        try:
            os.write(log_fd, data)
        except OSError:
            pass


class Watchdog:
    """Calls ``abort()`` when `progress` has not been called for `limit` seconds.

    Example:
        >>> ended = []
        >>> dog = Watchdog(3, 0.2, lambda: ended.append(True), fd=None, grace=0.0, pause=0.0)
        >>> dog.progress("MatMul"); time.sleep(0.6); dog.stop()
        >>> ended, dog.message
        ([True], 'rank 3: no progress for 0.2 s in MatMul')
    """

    def __init__(self, rank: int, limit: float, abort, fd: int | None = 2, grace: float = COLLECTIVE_GRACE, pause: float = SPEAK_PAUSE,
                 launcher: str | None = None, start_up: float = START_UP_LIMIT):
        self.rank, self.limit, self.abort, self.fd, self.launcher = rank, limit, abort, fd, launcher
        self.start_up = max(start_up, limit)  # the limit before the first `progress`
        self.grace, self.pause = grace, pause
        self.message = ""
        self._doing, self._collective, self._since = "start-up", False, time.monotonic()
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._watch, name=f"watchdog-{rank}", daemon=True)
        self._thread.start()

    def progress(self, doing: str, collective: bool = False) -> None:
        self._doing, self._collective, self._since = doing, collective, time.monotonic()

    def stop(self) -> None:
        self._stopped.set()
        self._thread.join()

    def _watch(self) -> None:
        while not self._stopped.wait(min(0.1, self.limit / 4)):
            if launcher_gone(self.launcher):
                self._orphaned()
            limit = self.start_up if self._doing == "start-up" else self.limit + (self.grace if self._collective else 0.0)
            if time.monotonic() - self._since < limit:
                continue
            where = "waiting inside" if self._collective else "in"
            self.message = f"rank {self.rank}: no progress for {limit:.1f} s {where} {self._doing}"
            if self.fd is not None:
                say(self.fd, self.message)
            time.sleep(self.pause)
            self.abort()
            return

    def _orphaned(self) -> None:
        """End this rank now, its launcher gone: no MPI_Abort, whose process manager may be gone
        too; the line goes to the rank's log (the terminal went with the launcher)."""
        try:
            say(2, f"rank {self.rank}: the job's launcher (pid {self.launcher.partition(':')[0]}) is gone; ending the rank",
                log_fd=None)
        except OSError:
            pass
        os._exit(5)
