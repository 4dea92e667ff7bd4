"""The α–β time model: per device-matrix axis, a latency (α, seconds per message) and a
bandwidth (β, bytes per second), so that axes crossing servers cost more than axes inside one.

A planner given an `AlphaBeta` minimises time instead of bytes (`cost.hardware.Hardware` builds
one for a cluster). The model is declared on the cluster's device matrix, but plans run on
refined device matrices, so an axis of any other matrix with the same `device_num` is matched by
its rank stride: it pays the slowest (largest α, smallest β) model axis its stride range overlaps.

`step_time` and `step_nanoseconds` time a step run as a ring; `cost.algorithms` times the
other algorithms a step can run as, on the same links, and chooses among them.

A profile measured on a CPU runtime also charges each collective step a fixed `step_latency`
(the runtime's own work per collective instruction, beside its messages: `Hardware.collective_latency`);
0 otherwise, when a step is its messages and bytes alone.

Searches add times up, so they use `step_nanoseconds`: whole nanoseconds, the latency rounded to
the nearest and the transfer rounded up, computed exactly (no float sums whose last bit depends
on the order of the terms), so the same plan has the same time on every run and in every solver.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

from autostrat.errors import LayoutError
from autostrat.layout import DeviceMatrix

# Ring messages per device for a group of g devices (Slice, Reshape and PartialCreate send none;
# the model prices no local work, so their time is 0: a PartialCreate's memset is not priced).
LOCAL_KINDS = ("PartialCreate", "Reshape", "Slice")
_MESSAGES = {"AllGather": 1, "AllToAll": 1, "ReduceScatter": 1, "AllReduce": 2}


def ceil_nanoseconds(amount: int, rate: float) -> int:
    """Whole nanoseconds, rounded up, of `amount` units (an int or a `Fraction`) at `rate` units
    per second, exactly.

    Example:
        >>> ceil_nanoseconds(3000, 1e11), ceil_nanoseconds(1, 3.0), ceil_nanoseconds(0, 3.0)
        (30, 333333334, 0)
    """
    numerator, denominator = float(rate).as_integer_ratio()  # a float is an exact binary fraction
    return -(-amount * 10**9 * denominator // numerator)


@lru_cache(maxsize=4096)
def _stride_ranges(matrix: DeviceMatrix) -> tuple[tuple[int, int], ...]:
    """Per axis counted from the right, the half-open rank-stride range ``[stride, stride·size)``."""
    ranges, stride = [], 1
    for size in reversed(matrix.shape):
        ranges.append((stride, stride * size))
        stride *= size
    return tuple(ranges)


@dataclass(frozen=True)
class AlphaBeta:
    """Latency and bandwidth per axis (counted from the right) of `device_matrix`.

    Example (2 servers of 4 devices; the 2-axis crosses servers):
        >>> model = AlphaBeta(DeviceMatrix((2, 4)), latency=(1e-6, 1e-5), bandwidth=(1e11, 1e10))
        >>> inside = model.step_time("AllGather", DeviceMatrix((2, 4)), (0,), 3000)
        >>> across = model.step_time("AllGather", DeviceMatrix((8,)), (0,), 7000)
        >>> round(inside * 1e6, 3), round(across * 1e6, 3)
        (3.03, 70.7)
    """

    device_matrix: DeviceMatrix
    latency: tuple[float, ...]
    bandwidth: tuple[float, ...]
    step_latency: float = 0.0  # seconds each collective step takes beside its messages (a host's work)

    def __post_init__(self) -> None:
        ndim = self.device_matrix.ndim
        object.__setattr__(self, "step_latency", float(self.step_latency))
        object.__setattr__(self, "latency", tuple(float(v) for v in self.latency))
        object.__setattr__(self, "bandwidth", tuple(float(v) for v in self.bandwidth))
        if len(self.latency) != ndim or len(self.bandwidth) != ndim:
            raise LayoutError(
                f"an α–β model of device matrix {self.device_matrix} needs {ndim} latencies and bandwidths, "
                f"got {len(self.latency)} and {len(self.bandwidth)}"
            )
        if min(self.latency) < 0 or min(self.bandwidth) <= 0 or not 0 <= self.step_latency < math.inf:
            raise LayoutError(f"latencies must be >= 0 and bandwidths > 0, got {self.latency} and {self.bandwidth} "
                              f"(step latency {self.step_latency})")

    def __hash__(self) -> int:
        # Every memo of a timed search is keyed by its model: hash the fields once, not on each lookup.
        found = self.__dict__.get("_hash")
        if found is None:
            found = hash((self.device_matrix, self.latency, self.bandwidth, self.step_latency))
            object.__setattr__(self, "_hash", found)
        return found

    def link(self, matrix: DeviceMatrix, axes) -> tuple[float, float]:
        """The (latency, bandwidth) of the slowest model axis that `axes` of `matrix` span
        (memoised: a search times the same steps over and over)."""
        return _link(self, matrix, tuple(axes))

    def _slowest(self, matrix: DeviceMatrix, axes: tuple[int, ...]) -> tuple[float, float]:
        if matrix.device_num != self.device_matrix.device_num:
            raise LayoutError(f"device matrix {matrix} does not have the {self.device_matrix.device_num} devices of {self.device_matrix}")
        model_ranges = _stride_ranges(self.device_matrix)
        touched = set()
        for low, high in (_stride_ranges(matrix)[axis] for axis in axes):
            touched |= {i for i, (start, stop) in enumerate(model_ranges) if start < high and low < stop}
        touched = sorted(i for i in touched if self.device_matrix.axis_size(i) > 1) or [0]
        return max(self.latency[i] for i in touched), min(self.bandwidth[i] for i in touched)

    def step_time(self, kind: str, matrix: DeviceMatrix, axes, sent_bytes: int) -> float:
        """Seconds of one step: ring messages times α plus the bytes each device sends over β
        (plus `step_latency`)."""
        if kind in LOCAL_KINDS or not axes:
            return 0.0
        messages, (alpha, beta) = _messages(kind, matrix, axes), self.link(matrix, axes)
        return self.step_latency + messages * alpha + sent_bytes / beta

    def step_nanoseconds(self, kind: str, matrix: DeviceMatrix, axes, sent_bytes: int) -> int:
        """`step_time` in whole nanoseconds: messages times α (rounded to the nearest
        nanosecond) plus the bytes over β (rounded up), plus `step_latency` (rounded to the nearest).

        Example (a ring AllReduce of 4 devices: 6 messages of 2 µs, 3000 bytes at 450 GB/s):
            >>> model = AlphaBeta(DeviceMatrix((4,)), latency=(2e-6,), bandwidth=(450e9,))
            >>> model.step_nanoseconds("AllReduce", DeviceMatrix((4,)), (0,), 3000)
            12007
        """
        if kind in LOCAL_KINDS or not axes:
            return 0
        messages, (alpha, beta) = _messages(kind, matrix, axes), self.link(matrix, axes)
        return self.fixed_nanoseconds() + messages * round(alpha * 1e9) + ceil_nanoseconds(sent_bytes, beta)

    def fixed_nanoseconds(self) -> int:
        """`step_latency` in whole nanoseconds (rounded to the nearest): what every collective
        step costs beside its messages, whatever algorithm runs it (`cost.algorithms`)."""
        return round(self.step_latency * 1e9)


@lru_cache(maxsize=1 << 14)
def _link(model: AlphaBeta, matrix: DeviceMatrix, axes: tuple[int, ...]) -> tuple[float, float]:
    return model._slowest(matrix, axes)


def _messages(kind: str, matrix: DeviceMatrix, axes) -> int:
    """Ring messages per device of a step over `axes` (a permute sends one)."""
    group = math.prod(matrix.axis_size(axis) for axis in axes)
    return 1 if kind == "CollectivePermute" else _MESSAGES[kind] * (group - 1)
