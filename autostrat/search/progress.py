"""What a long search tells the person waiting for it.

A search reports, as it goes, what it is doing (`SearchProgress.step`: "propagating", 1 200 of
2 880 ops) and each better plan CP-SAT finds (`SearchProgress.solution`). `StatusLine` shows
both as one line on stderr, with an estimate of the time left; searches of a second or less
show nothing.
"""

from __future__ import annotations

import sys
import time
from typing import Protocol


class SearchProgress(Protocol):
    def step(self, what: str, done: int, total: int) -> None:
        """`done` of `total` items of the phase `what` are finished."""

    def solution(self, objective: int, bound: int, seconds: float) -> None:
        """CP-SAT found a plan of `objective` bytes per device; none is below `bound`."""


class StatusLine:
    """A `SearchProgress` writing one line to `stream`: rewritten in place on a terminal at most
    every `interval` seconds, otherwise a new line at most every `log_interval` seconds; nothing
    during the first `quiet` seconds. `end()` finishes the line, if one was written.

    Example:
        >>> import io
        >>> stream = io.StringIO()
        >>> line = StatusLine(stream, quiet=0, log_interval=0)
        >>> line.step("propagating", 10, 40)
        >>> line.end()
        >>> stream.getvalue().startswith("autostrat: propagating 10 of 40 ops, ")
        True
    """

    def __init__(self, stream=sys.stderr, quiet: float = 1.0, interval: float = 0.2, log_interval: float = 10.0):
        self.stream, self.quiet = stream, quiet
        self.terminal = stream.isatty()
        self.interval = interval if self.terminal else log_interval
        self.started = time.perf_counter()
        self.phase_started: dict[str, float] = {}
        self.shown, self.written = -float("inf"), False

    def step(self, what: str, done: int, total: int) -> None:
        now = time.perf_counter()
        began = self.phase_started.setdefault(what, now)
        if not self._due(now) or total <= 0:
            return
        text = f"{what} {done:,} of {total:,} ops, {now - self.started:.1f} s"
        if 0 < done < total:
            text += f", about {(now - began) / done * (total - done):.0f} s left in this phase"
        self._show(text, now)

    def solution(self, objective: int, bound: int, seconds: float) -> None:
        now = time.perf_counter()
        if self._due(now):
            self._show(f"CP-SAT: best {objective:,} bytes per device, bound {bound:,}, {seconds:.1f} s", now)

    def end(self) -> None:
        if self.written and self.terminal:
            self.stream.write("\n")
            self.stream.flush()

    def _due(self, now: float) -> bool:
        return now - self.started >= self.quiet and now - self.shown >= self.interval

    def _show(self, text: str, now: float) -> None:
        self.shown, self.written = now, True
        if self.terminal:
            self.stream.write(f"\r\x1b[Kautostrat: {text}")
        else:
            self.stream.write(f"autostrat: {text}\n")
        self.stream.flush()
