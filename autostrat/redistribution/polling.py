"""A long redistribution search asks its caller, now and then, whether to go on.

Most pairs plan in microseconds, but a timed search between fully split layouts across servers
can settle tens of thousands of states (seconds each on 64 devices, more on a loaded machine).
A caller bounded by a time limit (the refinement pricing its cost tables) cannot wait for such a
search to end before looking at its clock: one block of 16 entries once ran 33 s past a 60 s
limit. So the search calls `poll` every `POLL_EVERY` settled states, and a caller that must stop
in time installs a check with `polled`, which raises its own exception (the refinement's
`TimeRanOut`) out of the search. Nothing is memoised from an interrupted search (its memos keep
only what completes), so its pair is priced afresh when asked again.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import contextmanager
from contextvars import ContextVar

POLL_EVERY = 256  # settled states between polls: a poll costs ~0.1 us, a state ~20-100 us

_CHECK: ContextVar[Callable[[], None] | None] = ContextVar("redistribution_check", default=None)


@contextmanager
def polled(check: Callable[[], None]):
    """Have every redistribution search started inside call `check` between its states.

    Example:
        >>> def stop():
        ...     raise TimeoutError("out of time")
        >>> with polled(stop):
        ...     poll()
        Traceback (most recent call last):
        ...
        TimeoutError: out of time
        >>> poll()  # outside: nothing to call
    """
    token = _CHECK.set(check)
    try:
        yield
    finally:
        _CHECK.reset(token)


def poll() -> None:
    """Call the check `polled` installed, if any (it may raise to stop the search)."""
    check = _CHECK.get()
    if check is not None:
        check()
