"""What the search benchmarks share to time a plan phase by phase.

`PhaseClock` times named phases and, when given a stream, writes a line as each phase starts
and ends, so a parent process that kills a slow run still knows the phase it was in.
`timed_calls` times the functions another module calls by the names it imports them under, so
a benchmark can measure `autostrat.search.search` itself, phase by phase, instead of a copy.
`counted_pairs` counts the redistribution pairs a run priced unreachable or left to the
planner's constructive fallback (issue #32: both should be none where a plan exists).

Used by `search_scale.py`, `scale.py`, `quality.py` and `redistribution.py`, both run as ``python benchmarks/<name>.py`` so this
folder is on ``sys.path``.
"""

from __future__ import annotations

import contextlib
import functools
import resource
import time


def peak_rss_mb() -> float:
    """The peak resident memory of this process so far, in MB (Linux reports KiB).

    Example:
        >>> peak_rss_mb() > 0
        True
    """
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class PhaseClock:
    """Seconds per named phase, summed over the times a phase is entered.

    Example:
        >>> import io
        >>> stream = io.StringIO()
        >>> clock = PhaseClock(stream)
        >>> with clock.phase("trace"):
        ...     pass
        >>> stream.getvalue().split()[:2], sorted(clock.seconds)
        (['start', 'trace'], ['trace'])
    """

    def __init__(self, stream=None):
        self.stream = stream
        self.seconds: dict[str, float] = {}
        self.results: dict[str, object] = {}  # what each function `timed_calls` wraps last returned

    def _note(self, *words) -> None:
        if self.stream is not None:
            # Flushed at once: the reader may kill this process before it writes anything else.
            print(*words, f"{peak_rss_mb():.0f}", file=self.stream, flush=True)

    @contextlib.contextmanager
    def phase(self, name: str):
        """Time the body as phase `name`; the stream gets ``start <name> <MB>`` and ``end <name> <s> <MB>``."""
        self._note("start", name)
        start = time.perf_counter()
        try:
            yield
        finally:
            seconds = time.perf_counter() - start
            self.seconds[name] = self.seconds.get(name, 0.0) + seconds
            self._note("end", name, f"{seconds:.3f}")

    def total(self) -> float:
        return sum(self.seconds.values())


@contextlib.contextmanager
def timed_calls(clock: PhaseClock, module, phases: dict[str, str]):
    """While the body runs, each function `name` that `module` looks up as a global is timed
    as phase ``phases[name]`` (its last result is kept in ``clock.results[name]``).

    Example:
        >>> import types
        >>> module = types.SimpleNamespace(double=lambda x: 2 * x)
        >>> clock = PhaseClock()
        >>> with timed_calls(clock, module, {"double": "compute"}):
        ...     module.double(21)
        42
        >>> list(clock.seconds), clock.results["double"], module.double(1)
        (['compute'], 42, 2)
    """
    originals = {name: getattr(module, name) for name in phases}

    def timed(name, function):
        @functools.wraps(function)
        def call(*args, **kwargs):
            with clock.phase(phases[name]):
                clock.results[name] = function(*args, **kwargs)
            return clock.results[name]
        return call

    for name, function in originals.items():
        setattr(module, name, timed(name, function))
    try:
        yield clock
    finally:
        for name, function in originals.items():
            setattr(module, name, function)


class PairCounts:
    """Redistribution pairs a run priced unreachable or answered with the constructive fallback
    (past the search's state limit, not proven optimal), and timed searches stopped at the
    planner's budget (`search.TIMED_BUDGET`: their pairs take the faster of the path reached and
    the link plan, not proven optimal either), counted by `counted_pairs`."""

    def __init__(self) -> None:
        self.fallbacks = 0
        self.cut = 0
        self.before = _priced_unreachable()

    def unreachable(self) -> int:
        """Entries of the process's cost memo priced ``inf`` since counting began."""
        return _priced_unreachable() - self.before

    def __str__(self) -> str:
        return (f"{self.unreachable()} pairs priced unreachable, {self.fallbacks} answered by the constructive fallback, "
                f"{self.cut} timed searches stopped at their budget")


def _priced_unreachable() -> int:
    from autostrat.redistribution import table

    return sum(1 for value in table._COSTS.values() if value == float("inf"))


@contextlib.contextmanager
def counted_pairs():
    """While the body runs, count the planner's constructive fallbacks (each call of
    `solving.constructive_path`, which the planner calls only past a search's state limit) and
    the timed searches stopped at their budget (each call of `solving._cut`; a search's memo
    answers its class's later pairs).

    Example:
        >>> with counted_pairs() as counts:
        ...     pass
        >>> counts.fallbacks, counts.cut
        (0, 0)
    """
    from autostrat.redistribution import solving

    counts, originals = PairCounts(), (solving.constructive_path, solving._cut)

    def counting(original, field: str):
        @functools.wraps(original)
        def counted(*args, **kwargs):
            setattr(counts, field, getattr(counts, field) + 1)
            return original(*args, **kwargs)
        return counted

    solving.constructive_path, solving._cut = counting(originals[0], "fallbacks"), counting(originals[1], "cut")
    try:
        yield counts
    finally:
        solving.constructive_path, solving._cut = originals
