"""Gradient synchronisation overlapped with the backward: a schedule of a compute stream and a
communication stream on one device (issue #37; the runtime runs it: `runtime.stream`).

The compute stream runs the backward ops one after another; a gradient is ready when the op
producing it ends. Gradients go into buckets in the order they become ready, a bucket closing
when the next gradient would take it past `bucket_bytes` (MindSpore's ``comm_fusion`` by size,
PyTorch DDP's ``bucket_cap_mb``; a gradient larger than the size is a bucket alone:
`packed_buckets`). A bucket's
synchronisation starts on the communication stream once its last gradient is ready and the
bucket before it is done, and takes the time of its collectives (`bucket_ns`: the plan's fused
ones, one latency per fused collective, `search.fusion`; by default its gradients' own times
summed). The runtime keeps several collectives' messages in flight at once (`runtime.stream`),
whose latencies this schedule does not overlap. The backward with its synchronisation ends
when both streams are done.

Cases: no gradients (the backward alone); `bucket_bytes` 0, no overlap: the backward, then
every gradient's synchronisation one after another (what `search.prediction` charges without buckets).
"""

from __future__ import annotations

from dataclasses import dataclass

from autostrat.errors import ConfigError


@dataclass(frozen=True)
class Bucket:
    """One bucket on the communication stream: its gradients (indices), bytes, start and end (ns)."""

    gradients: tuple[int, ...]
    bytes: int
    start_ns: int
    end_ns: int


@dataclass(frozen=True)
class SyncTimeline:
    """The schedule: when the backward and its synchronisation end, and the buckets."""

    end_ns: int
    backward_ns: int
    buckets: tuple[Bucket, ...]

    @property
    def exposed_ns(self) -> int:
        """The synchronisation time not hidden behind the backward."""
        return self.end_ns - self.backward_ns


def sync_timeline(backward_ns, gradients, bucket_bytes: int, bucket_ns=None) -> SyncTimeline:
    """The schedule of the backward ops' times `backward_ns` (in order) and `gradients`, each
    ``(index of the op producing it, bytes, its synchronisation's ns)`` in the order they are
    produced; `bucket_bytes` 0: no overlap (module docstring). ``bucket_ns(members)`` times a
    bucket of those gradients' indices (default: their own times summed, nothing fused).

    Example (ops of 30, 20, 40 ns, a gradient of 100 bytes and 20 ns after each; buckets of 200
    bytes: the first two go at 50 ns and end at 90, the third at 90, ending at 110, against 150
    without overlap):
        >>> grads = [(0, 100, 20), (1, 100, 20), (2, 100, 20)]
        >>> [(b.gradients, b.start_ns, b.end_ns) for b in sync_timeline([30, 20, 40], grads, 200).buckets]
        [((0, 1), 50, 90), ((2,), 90, 110)]
        >>> sync_timeline([30, 20, 40], grads, 200).end_ns, sync_timeline([30, 20, 40], grads, 0).end_ns
        (110, 150)
    """
    ends, elapsed = [], 0
    for duration in backward_ns:
        elapsed += duration
        ends.append(elapsed)
    if not bucket_bytes:
        total = sum(ns for _, _, ns in gradients)
        return SyncTimeline(elapsed + total, elapsed, (Bucket(tuple(range(len(gradients))), sum(b for _, b, _ in gradients),
                                                              elapsed, elapsed + total),) if gradients else ())
    if bucket_ns is None:
        bucket_ns = lambda members: sum(gradients[i][2] for i in members)  # noqa: E731
    buckets, free = [], 0
    for members in packed_buckets([size for _, size, _ in gradients], bucket_bytes):
        ready = max(ends[gradients[i][0]] for i in members)
        start = max(ready, free)
        free = start + bucket_ns(members)
        buckets.append(Bucket(members, sum(gradients[i][1] for i in members), start, free))
    return SyncTimeline(max(elapsed, free), elapsed, tuple(buckets))


def packed_buckets(sizes, bucket_bytes: int) -> list[tuple[int, ...]]:
    """Indices of the gradients of `sizes` (bytes, in the order they become ready) in buckets of
    at most `bucket_bytes`, in order (a larger gradient alone).

    Example:
        >>> packed_buckets([100, 100, 300, 50], 200)
        [(0, 1), (2,), (3,)]
    """
    buckets, current, held = [], [], 0
    for index, size in enumerate(sizes):
        if current and held + size > bucket_bytes:
            buckets.append(tuple(current))
            current, held = [], 0
        current.append(index)
        held += size
    return buckets + [tuple(current)] if current else buckets


def check_bucket_bytes(value, key: str = "bucket_bytes") -> int:
    """`value` if it is a bucket size: a whole number of bytes, 0 for no buckets; else a
    `ConfigError` naming `key`.

    Example:
        >>> check_bucket_bytes(1 << 20)
        1048576
    """
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"{key} must be a whole number of bytes >= 0 (0: gradient synchronisation after the backward, "
                          f"no buckets), got {value!r}")
    return value


def comm_fusion_bytes(comm_fusion) -> int | None:
    """The bucket size MindSpore's ``comm_fusion`` asks for, or None when it asks for none
    autostrat builds: ``{"allreduce": {"mode": "size", "config": MB}}`` fuses the AllReduces
    of gradients into buckets of `MB` megabytes (MindSpore's unit); "auto" and "index" modes
    and the other collectives' fusion are not built.

    Example:
        >>> comm_fusion_bytes({"allreduce": {"mode": "size", "config": 32}}), comm_fusion_bytes({"allreduce": {"mode": "auto"}})
        (33554432, None)
    """
    fusion = comm_fusion.get("allreduce") if isinstance(comm_fusion, dict) else None
    if not isinstance(fusion, dict) or fusion.get("mode") != "size":
        return None
    size = fusion.get("config")
    if isinstance(size, bool) or not isinstance(size, (int, float)) or not size >= 0:
        raise ConfigError(f"comm_fusion: allreduce's config in mode 'size' is the bucket size in MB (a number >= 0), "
                          f"got {size!r}")
    return int(size * (1 << 20))
