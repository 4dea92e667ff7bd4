"""The refinement's clock: one deadline for every phase of it, each phase checking it.

`--time-limit` (`refine_time_limit`) bounds the whole search, not only CP-SAT's solves: at 32
devices a 20 s limit once ran 584 s, because the cost tables, the coarsening and the model were
built before any solve looked at the clock. A `Deadline` starts when the search starts (a user
who asks for a plan within 60 s counts from there); the problem and the propagation do not look
at it (their plan is what the refinement improves), and each phase of the refinement calls
`check` between its steps (an op's candidates pruned, an edge's pair variables added), which
raises `TimeRanOut` naming the phase once the time is up, and each solve gets what is `left`.
"""

from __future__ import annotations

import time


class TimeRanOut(Exception):
    """The deadline passed during `phase`; the refinement returns the best plan it knows.
    Internal: `refine` turns it into its result (or into a `SolverError` when no known plan
    fits the budget), so it never reaches a user."""

    def __init__(self, phase: str):
        super().__init__(f"the time limit ran out while {phase}")
        self.phase = phase


class Deadline:
    """`limit` seconds from now (`time.perf_counter`, which tests replace).

    Example:
        >>> deadline = Deadline(60.0)
        >>> 0 < deadline.left() <= 60.0, deadline.left(share=0.25) <= 15.0
        (True, True)
        >>> deadline.check("coarsening the model")  # in time: nothing happens
        >>> Deadline(0.0).check("coarsening the model")
        Traceback (most recent call last):
        ...
        autostrat.search.deadline.TimeRanOut: the time limit ran out while coarsening the model
    """

    def __init__(self, limit: float, end: float | None = None):
        self.limit = float(limit)
        self.start = time.perf_counter()
        self.end = self.start + self.limit if end is None else min(end, self.start + self.limit)
        self.ran_out = ""  # the first phase that found the deadline passed

    def reserving(self, seconds: float) -> Deadline:
        """This deadline `seconds` earlier, counted from the same start: the time kept for work
        that must follow it (building the plan of what the refinement found).

        Example:
            >>> deadline = Deadline(60.0)
            >>> round(deadline.end - deadline.reserving(2.5).end, 6), deadline.reserving(2.5).start == deadline.start
            (2.5, True)
        """
        earlier = Deadline(self.limit, self.end - seconds)
        earlier.start, earlier.ran_out = self.start, self.ran_out  # if this one has passed, so has the earlier
        return earlier

    def within(self, share: float) -> Deadline:
        """A deadline `share` of the limit from now, never later than this one."""
        return Deadline(self.limit * share, self.end)

    def elapsed(self) -> float:
        """Seconds since the deadline was set."""
        return time.perf_counter() - self.start

    def left(self, share: float = 1.0) -> float:
        """Seconds until the deadline, at most `share` of the whole limit (never negative)."""
        return max(min(self.limit * share, self.end - time.perf_counter()), 0.0)

    def passed(self) -> bool:
        """Whether the deadline has passed (a limit of 0 has passed at once)."""
        return time.perf_counter() >= self.end

    def check(self, phase: str) -> None:
        """Raise `TimeRanOut` if the deadline has passed, naming the first phase that found it
        passed (a later phase that checks again is not where the time went)."""
        if self.passed():
            self.ran_out = self.ran_out or phase
            raise TimeRanOut(self.ran_out)
