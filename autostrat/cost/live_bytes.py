"""The memory rule by which the plan predicts a rank's buffers (`search.buffers`, and a pipeline
stage's, `search.stage_buffers`): a buffer lives from the instruction writing it to the last one
touching it (unless kept), and an instruction's results may take the place of an input read for
the last time there (an update over its parameter) or of the buffer they overwrite. A run is
measured apart, from its arrays (`runtime.held_memory`), never through this module."""

from __future__ import annotations


def release_after(touched, kept) -> tuple[tuple[str, ...], ...]:
    """Per instruction (the keys each touches, in order), the keys no later one touches and not
    in `kept`: dropped once it has run.

    Example:
        >>> release_after([("x",), ("x", "y"), ("y", "z")], kept={"z"})
        ((), ('x',), ('y',))
    """
    touched = [tuple(keys) for keys in touched]
    last = {key: index for index, keys in enumerate(touched) for key in keys}
    schedule: list[list[str]] = [[] for _ in touched]
    for key, index in last.items():
        if key not in kept:
            schedule[index].append(key)
    return tuple(tuple(keys) for keys in schedule)


def last_touches(touched, keys) -> tuple[tuple[str, ...], ...]:
    """Per instruction (the keys each touches, in order), the keys of `keys` no later one
    touches, sorted: where a micro-batch's gradient is added into the step's sum (in place, as
    Megatron adds each parameter's gradient into its main gradient once it is computed).

    Example:
        >>> last_touches([("g", "x"), ("x", "h"), ("g",)], keys={"g", "h"})
        ((), ('h',), ('g',))
    """
    touched = [tuple(found) for found in touched]
    last = {key: index for index, found in enumerate(touched) for key in found if key in keys}
    schedule: list[list[str]] = [[] for _ in touched]
    for key, index in sorted(last.items()):
        schedule[index].append(key)
    return tuple(tuple(found) for found in schedule)


class LiveBytes:
    """The counted bytes of every buffer a rank holds, their sum and its peak.

    Example (an update written over its parameter, read for the last time: no new room):
        >>> live = LiveBytes()
        >>> live.write({"w": 100})
        >>> live.write({"w_new": 100}, over=(("w", "w_new"),), released=("w",))
        >>> live.release(("w",)); live.peak, live.live
        (100, 100)
    """

    def __init__(self, keep_peak: bool = False, counted=None):
        self.sizes: dict[str, int] = {}
        self.live = self.peak = 0
        self.high = 0  # the most held during the last write
        # With `keep_peak`, the (key, bytes) pairs held at the peak; with `counted` (a test of a
        # key), the most bytes of such keys held at once (`counted_peak`): `autostrat
        # estimate`'s breakdown. Both off in the search, which only needs the peak.
        self.keep_peak, self.at_peak = keep_peak, ()
        self.counted, self.counted_live, self.counted_peak = counted, 0, 0
        self.since = self.counted_since = 0  # the most held, and counted, since the last `mark`

    def mark(self) -> None:
        """Start watching the most held from now (`since`, `counted_since`): a replay's summary
        of a run of instructions (`search.stage_buffers`)."""
        self.since, self.counted_since = self.live, self.counted_live

    def write(self, written: dict[str, int], over=(), released=()) -> None:
        """Count an instruction's results; `over` are (input, result) pairs whose buffer the
        result may take: when the input is read for the last time here (`released`), or is
        the result itself (the next step of a redistribution writing its target again)."""
        in_place = dict.fromkeys(read for read, result in over if read in released or read == result)
        # Any other buffer being overwritten is the instruction's input: live until the result is written.
        reused = sum(self.sizes[key] for key in in_place)
        self.high = self.live + sum(written.values()) - reused
        if self.keep_peak and self.high > self.peak:
            held = [(key, size) for key, size in self.sizes.items() if key not in in_place]
            self.at_peak = tuple(held + list(written.items()))
        self.peak, self.since = max(self.peak, self.high), max(self.since, self.high)
        if self.counted is not None:
            high = self.counted_live + sum(size for key, size in written.items() if self.counted(key))
            high -= sum(self.sizes[key] for key in in_place if self.counted(key))
            self.counted_peak, self.counted_since = max(self.counted_peak, high), max(self.counted_since, high)
        for key, size in written.items():
            if self.counted is not None and self.counted(key):
                self.counted_live += size - self.sizes.get(key, 0)
            self.live += size - self.sizes.get(key, 0)
            self.sizes[key] = size

    def release(self, keys) -> None:
        for key in keys:
            size = self.sizes.pop(key)
            self.live -= size
            if self.counted is not None and self.counted(key):
                self.counted_live -= size
