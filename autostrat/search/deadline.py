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

import gc
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

    def __init__(self, limit: float, end: float | None = None, *, parent: Deadline | None = None, keep=None):
        self.limit = float(limit)
        self.start = time.perf_counter()
        self._end = self.start + self.limit if end is None else min(end, self.start + self.limit)
        # A deadline made from another ends no later than it, however that one's end moves;
        # `keep()` is seconds kept before the end, looked at again on every look at the clock.
        self._parent, self._keep = parent, keep
        self.ran_out = ""  # the first phase that found the deadline passed

    @property
    def end(self) -> float:
        """When the deadline passes (`time.perf_counter`'s clock); earlier as what it keeps grows."""
        end = self._end if self._parent is None else min(self._end, self._parent.end)
        return end - self._keep() if self._keep is not None else end

    def reserving(self, seconds: float, growing=None) -> Deadline:
        """This deadline `seconds` earlier, and `growing()` seconds more (looked at on every
        check), counted from the same start: the time kept for work that must follow it
        (building the plan of what the refinement found, the collection the search's end
        sets off: `CollectorReserve`).

        Example:
            >>> deadline = Deadline(60.0)
            >>> round(deadline.end - deadline.reserving(2.5).end, 6), deadline.reserving(2.5).start == deadline.start
            (2.5, True)
            >>> kept = [1.0]
            >>> earlier = deadline.reserving(2.5, lambda: kept[0])
            >>> round(deadline.end - earlier.end, 6), kept.append(kept.pop() + 3), round(deadline.end - earlier.end, 6)
            (3.5, None, 6.5)
        """
        earlier = Deadline(self.limit, parent=self, keep=(lambda: seconds + growing()) if growing else (lambda: seconds))
        earlier.start, earlier.ran_out = self.start, self.ran_out  # if this one has passed, so has the earlier
        earlier._end = self.start + self.limit
        return earlier

    def within(self, share: float) -> Deadline:
        """A deadline `share` of the limit from now, never later than this one."""
        return Deadline(self.limit * share, parent=self)

    def elapsed(self) -> float:
        """Seconds since the deadline was set."""
        return time.perf_counter() - self.start

    def left(self, share: float = 1.0) -> float:
        """Seconds until the deadline, at most `share` of the whole limit (never negative)."""
        end = self.end  # first: what it keeps may take a collection (`CollectorReserve`)
        return max(min(self.limit * share, end - time.perf_counter()), 0.0)

    def passed(self) -> bool:
        """Whether the deadline has passed (a limit of 0 has passed at once)."""
        end = self.end  # first: what it keeps may take a collection (`CollectorReserve`)
        return time.perf_counter() >= end

    def check(self, phase: str) -> None:
        """Raise `TimeRanOut` if the deadline has passed, naming the first phase that found it
        passed (a later phase that checks again is not where the time went)."""
        if self.passed():
            self.ran_out = self.ran_out or phase
            raise TimeRanOut(self.ran_out)


class CollectorReserve:
    """Seconds Python's collector will take when the search's end resumes it: the objects
    allocated since its last collection (`gc.get_count`) times the seconds per object of one
    whole collection this reserve runs itself, once that count first passes `PROBE_ABOVE`
    (`gc.collect()`: the same objects' share of the end's work, done while the clock runs).

    The search pauses the collector (`redistribution.collector_paused`), so every object it
    keeps (memoised moves, plans, cost-table entries) waits in the youngest generation, and the
    first collections after the pause walk them all: 4.5 million objects in 9.3 s after a
    refinement of the 7B step on 64 devices (load 4), past its 40 s limit. Seconds per object
    follow the machine's load as the search's own work does; measuring them on that search's
    own objects makes the reserve follow both. A whole collection, not a young one: it leaves
    every generation's count at zero, so the end's collection walks only what came after (a
    young one could leave the middle generation's count at its threshold, and the end's would
    then walk that generation too). Its seconds are divided by the young objects alone, so
    the rate errs high (older objects were walked too), and the reserve towards stopping early.
    Below `PROBE_ABOVE` objects nothing is kept: small searches (every test's) never pay a
    collection, and what they leave takes the end well under a second.

    Example:
        >>> reserve = CollectorReserve()
        >>> reserve()  # few objects allocated: nothing measured, nothing kept
        0.0
    """

    PROBE_ABOVE = 500_000  # young objects before the rate is measured (~0.5-1 s to collect)

    def __init__(self):
        self.per_object: float | None = None

    def __call__(self) -> float:
        count = gc.get_count()[0]
        if self.per_object is not None:
            return count * self.per_object
        if count < self.PROBE_ABOVE:
            return 0.0
        started = time.perf_counter()
        gc.collect()
        self.per_object = (time.perf_counter() - started) / count
        return gc.get_count()[0] * self.per_object
