"""The cluster's hardware, and the step-time model built on it (integer nanoseconds).

Defaults: one current 8-accelerator server, an NVIDIA HGX/DGX H100 (8 × H100 SXM5), from NVIDIA's
H100 datasheet and NCCL's tuning model (``src/graph/tuning.cc``):

- `device_flops` 989.4e12 FLOP/s: dense FP16/BF16 tensor-core rate (1978.9 TFLOP/s is with 2:4
  sparsity, which no op here uses). An op whose widest floating-point operand is 32-bit runs at
  half that rate, H100's dense TF32 tensor-core rate (494.7 TFLOP/s): frameworks run float32
  matrix products as TF32, and the plain FP32 pipes (66.9 TFLOP/s) are no closer for the GEMMs
  that dominate a step. In general the rate is ``device_flops · 2 / itemsize`` (float64 a
  quarter; H100 is slower still there, but no autostrat model uses it).
- `device_memory_bandwidth` 3.35e12 B/s: HBM3 of the SXM5 part.
- `intra_server_bandwidth` 450e9 B/s: NVLink 4 through NVSwitch, 900 GB/s per GPU both ways,
  450 GB/s each way (a device's sends are what the ring formulas count).
- `inter_server_bandwidth` 50e9 B/s: one 400 Gb/s NDR InfiniBand (ConnectX-7) port per GPU.
- `intra_server_latency` 2 µs and `inter_server_latency` 4 µs per ring message: NCCL charges a
  ring step about 1.9 µs over NVLink and 4.0 µs over the network (LL128 protocol).
- `devices_per_server` 8.

All are nominal peaks; what a kernel or NCCL achieves is lower, but the search compares plans,
and for that the ratios between compute, memory and links matter more than the absolute speed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

import numpy as np

from autostrat.cost.op_cost import OpCost
from autostrat.cost.time_model import AlphaBeta, ceil_nanoseconds
from autostrat.errors import ConfigError
from autostrat.layout import DeviceMatrix

DEVICES_PER_SERVER = 8  # an Ascend or DGX/HGX server; also the inner axis of the "auto" mesh


@dataclass(frozen=True)
class Hardware:
    """Compute, memory and link speeds of one device and its server (defaults: the module docstring).

    Example (8 devices are one server; 16 are two, and their outer axis crosses the network):
        >>> hardware = Hardware()
        >>> hardware.alpha_beta(8).device_matrix, hardware.alpha_beta(16).bandwidth
        (DeviceMatrix(shape=(8,)), (450000000000.0, 50000000000.0))

    An op of 989.4 MFLOP reading and writing 3.35 MB takes 1 µs of compute (2 µs in float32)
    and 1 µs of memory traffic:
        >>> cost = OpCost(flops_per_device=989_400_000, memory_bytes_per_device=3_350_000)
        >>> hardware.compute_nanoseconds(cost, ("float16",)), hardware.compute_nanoseconds(cost, ("float32",))
        (2000, 3000)
    """

    device_flops: float = 989.4e12
    device_memory_bandwidth: float = 3.35e12
    intra_server_bandwidth: float = 450e9
    inter_server_bandwidth: float = 50e9
    intra_server_latency: float = 2e-6
    inter_server_latency: float = 4e-6
    devices_per_server: int = DEVICES_PER_SERVER

    def __post_init__(self) -> None:
        for field in fields(self):
            value = getattr(self, field.name)
            if field.name == "devices_per_server":
                if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                    raise ConfigError(f"devices_per_server must be a positive integer, got {value!r}")
                continue
            lowest = 0.0 if field.name.endswith("latency") else math.ulp(0.0)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not lowest <= value < math.inf:
                unit = "seconds" if field.name.endswith("latency") else ("FLOP/s" if field.name == "device_flops" else "bytes/s")
                bound = ">= 0" if lowest == 0 else "> 0"
                raise ConfigError(f"{field.name} must be a finite number {bound} ({unit}), got {value!r}")
            object.__setattr__(self, field.name, float(value))

    def server_matrix(self, device_num: int) -> DeviceMatrix:
        """``[servers, devices per server]`` of `device_num` devices; one axis when they fit in
        one server. A count that is no multiple of `devices_per_server` is split as the "auto"
        mesh splits it (`strategies.mesh_axes`): servers of ``gcd(devices_per_server, device_num)``."""
        if device_num <= self.devices_per_server:
            return DeviceMatrix((device_num,))
        inner = math.gcd(self.devices_per_server, device_num)
        return DeviceMatrix((device_num // inner, inner)) if inner > 1 else DeviceMatrix((device_num,))

    def alpha_beta(self, device_num: int) -> AlphaBeta:
        """The α–β model of `device_num` devices: inside a server on the inner axis, across
        servers on the outer one (a single axis of one device per server is all network)."""
        matrix = self.server_matrix(device_num)
        intra = (self.intra_server_latency, self.intra_server_bandwidth)
        inter = (self.inter_server_latency, self.inter_server_bandwidth)
        if matrix.ndim == 1:
            latency, bandwidth = inter if device_num > self.devices_per_server else intra
            return AlphaBeta(matrix, (latency,), (bandwidth,))
        return AlphaBeta(matrix, (intra[0], inter[0]), (intra[1], inter[1]))

    def compute_nanoseconds(self, cost: OpCost, dtypes) -> int:
        """Nanoseconds of one op on one device: its flops at ``device_flops · 2 / itemsize``
        (the widest floating-point operand of `dtypes`; 16-bit or no float: the full rate), plus
        the bytes it reads and writes (`OpCost.memory_bytes_per_device`) over
        `device_memory_bandwidth`, each rounded up. The sum, not the larger of the two: an op is
        charged for both, which keeps the model additive (and is the issue's model)."""
        itemsize = max(2, max((np.dtype(d).itemsize for d in dtypes if np.dtype(d).kind == "f"), default=2))
        compute = ceil_nanoseconds(cost.flops_per_device * itemsize, self.device_flops * 2)
        return compute + ceil_nanoseconds(cost.memory_bytes_per_device, self.device_memory_bandwidth)
