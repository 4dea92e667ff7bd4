"""The optional α–β time model: per device-matrix axis, a latency (α, seconds per message) and a
bandwidth (β, bytes per second), so that axes crossing servers cost more than axes inside one.

Bytes stay the default objective; a planner given an `AlphaBeta` minimises time instead. The
model is declared on the cluster's device matrix, but plans run on refined device matrices, so
an axis of any other matrix with the same `device_num` is matched by its rank stride: it pays the
slowest (largest α, smallest β) model axis its stride range overlaps.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from autostrat.errors import LayoutError
from autostrat.layout import DeviceMatrix

# Ring messages per device for a group of g devices (Slice and Reshape send none).
_MESSAGES = {"AllGather": 1, "AllToAll": 1, "ReduceScatter": 1, "AllReduce": 2}


def _stride_ranges(matrix: DeviceMatrix) -> list[tuple[int, int]]:
    """Per axis counted from the right, the half-open rank-stride range ``[stride, stride·size)``."""
    ranges, stride = [], 1
    for size in reversed(matrix.shape):
        ranges.append((stride, stride * size))
        stride *= size
    return ranges


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

    def __post_init__(self) -> None:
        ndim = self.device_matrix.ndim
        object.__setattr__(self, "latency", tuple(float(v) for v in self.latency))
        object.__setattr__(self, "bandwidth", tuple(float(v) for v in self.bandwidth))
        if len(self.latency) != ndim or len(self.bandwidth) != ndim:
            raise LayoutError(
                f"an α–β model of device matrix {self.device_matrix} needs {ndim} latencies and bandwidths, "
                f"got {len(self.latency)} and {len(self.bandwidth)}"
            )
        if min(self.latency) < 0 or min(self.bandwidth) <= 0:
            raise LayoutError(f"latencies must be >= 0 and bandwidths > 0, got {self.latency} and {self.bandwidth}")

    def link(self, matrix: DeviceMatrix, axes) -> tuple[float, float]:
        """The (latency, bandwidth) of the slowest model axis that `axes` of `matrix` span."""
        if matrix.device_num != self.device_matrix.device_num:
            raise LayoutError(f"device matrix {matrix} does not have the {self.device_matrix.device_num} devices of {self.device_matrix}")
        model_ranges = _stride_ranges(self.device_matrix)
        touched = set()
        for low, high in (_stride_ranges(matrix)[axis] for axis in axes):
            touched |= {i for i, (start, stop) in enumerate(model_ranges) if start < high and low < stop}
        touched = sorted(i for i in touched if self.device_matrix.axis_size(i) > 1) or [0]
        return max(self.latency[i] for i in touched), min(self.bandwidth[i] for i in touched)

    def step_time(self, kind: str, matrix: DeviceMatrix, axes, sent_bytes: int) -> float:
        """Seconds of one step: ring messages times α plus the bytes each device sends over β."""
        if kind in ("Slice", "Reshape") or not axes:
            return 0.0
        alpha, beta = self.link(matrix, axes)
        group = math.prod(matrix.axis_size(axis) for axis in axes)
        messages = 1 if kind == "CollectivePermute" else _MESSAGES[kind] * (group - 1)
        return messages * alpha + sent_bytes / beta
