"""The cluster's hardware profiles, and the step-time model built on them (integer nanoseconds).

A `Hardware` profile holds the nominal peaks of one device and its server, and up to three
efficiency factors, the fractions of those peaks the model charges (1.0, the nominal peak, by
default: then a prediction is exactly what it was before the factors existed):

- `matmul_efficiency` scales the FLOP rate (every op's flops; the matrix products dominate),
- `memory_efficiency` scales the HBM bandwidth (an op's bytes read and written),
- `network_efficiency` scales both link bandwidths (inside and across servers; not the latencies).

Two more, unset (None) unless a profile gives them, when fused attention runs at
`matmul_efficiency` as before: the fractions of the nominal FLOP rate FlashAttention's kernels
reach (`ATTENTION_OPS`), which run further below the peak than the matrix products do:

- `attention_efficiency`, of the forward (`FlashAttentionScore`, recomputed ones and ring
  attention's blocks too),
- `attention_backward_efficiency`, of the backward (both gradient ops), whose flops are counted
  as FlashAttention counts them (10 per score, where autostrat's two ops count 14: each computes
  the scores again, `cost.op_cost.FLASH_BACKWARD_FLOPS`), so the pair takes what the one
  published kernel takes.

A profile measured on a machine (`benchmarks/time_model.py` calibrates this one's MPI ranks) may
also give host fields, absent (0, none) in the named profiles, where they change nothing:

- `kernel_latency`, seconds each op's kernel takes beyond its flops and bytes (a launch; on a
  CPU runtime, the executor's work per instruction; a step also loads each graph input,
  parameter and state once, an instruction each: `search.prediction.load_ns`),
- `collective_latency`, seconds each collective step takes beyond its messages (the runtime's
  work per collective instruction: its pieces cut and joined, its exchanges driven;
  `AlphaBeta.step_latency`),
- `collective_wait`, the fraction of a rank's compute since its last collective that its next
  collective waits beyond its messages where ranks share cores (`shared`: each reaches it at
  its turn on a core; `search.prediction.crowded_waits`), at most `collective_wait_most` seconds,
- `kernel_passes`, per op type the times its kernel moves its bytes (1 when unlisted: numpy's
  GeLU evaluates a series for erf, hundreds of passes),
- `kernel_rates`, per op type how many times the profile's FLOP rate its kernel computes at
  (1 when unlisted: numpy's Conv2D, one large product, runs faster than the MatMul of 128 x
  128 the rate was measured on),
- `cores_per_server`, the cores the devices of a server share (`shared`: ranks on one machine),
- `crowded`, per crowding measured (ranks per core, above 1) a ring message's latency and
  bandwidth, how many times longer a kernel takes there, a collective's fixed latency and its
  wait with the wait's most (`shared`): on 2 cores a collective of 8 ranks waits for each partner's turn on a core,
  tens of times the latency of 2 ranks, not the 4 times their share of the cores would give.

Named profiles (`PROFILES`), each constant from the vendor's datasheet or NCCL's tuning model:

``h100-sxm-80gb`` (the default): one NVIDIA HGX/DGX H100 server (8 × H100 SXM5 80GB), NVIDIA H100
Tensor Core GPU datasheet and NCCL ``src/graph/tuning.cc``:

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
- `intra_server_latency` 2 µs and `inter_server_latency` 4 µs per ring message: NCCL's ``hwLat``
  table charges a ring step 1.9 µs over NVLink and 4.0 µs over the network (LL128 protocol).
- `devices_per_server` 8.
- `device_memory` 80 GiB (85,899,345,920 bytes): the "80GB" of HBM3 the datasheet gives, five
  16 GiB stacks; what `autostrat search` fits a plan into when no `max_device_memory` is given.
- No attention efficiencies, though published ones exist: its matrix products run at the
  nominal peak (`matmul_efficiency` 1.0: no published H100 run fitted), and the search and the
  benchmarks compare plans by ratios, which test the quotient of the two rates. Given alone, the
  attention's published rate charged attention 2.9 times the matrix products' time per flop,
  where torchtitan's measured CP rows imply about 1.3, and moved that table (``--rings``) from
  -12.3 / +12.5 / +14.7 % to -29.8 / -20.0 / -23.3 % (`benchmarks/context_parallel.py`). They
  join this profile with a published H100 GEMM rate. A profile file may give them now
  (``attention_efficiency: 0.3386``, ``attention_backward_efficiency: 0.3254``):
  335/989.4 and 322/989.4, FlashAttention-2 on H100 SXM5 80GB, head dim 128, 16-bit,
  sequence 16k (16k tokens a batch, hidden 2048), as Shah et al. 2024, "FlashAttention-3" (arXiv 2407.08608) measured it
  beside their kernel: 335 TFLOP/s forward with the causal mask (Figure 5, causal, head dim 128),
  322 TFLOP/s backward (Figure 6, head dim 128: the paper's only backward figures, without the
  mask), each the longest sequence measured, where the rate has levelled off (333 and 318 at 8k).
  FlashAttention-2, not 3 or cuDNN (616 and 539 TFLOP/s forward there): PyTorch's
  scaled_dot_product_attention runs its flash backend first, FlashAttention-2's kernel, and
  torchtitan's context parallelism allows only it and the memory-efficient one
  (``sdpa_kernel([FLASH_ATTENTION, EFFICIENT_ATTENTION])``). The paper counts flops as
  autostrat's forward does (4 per score, half the scores under the mask) and a backward as 2.5
  forwards.

``a100-80gb``: one NVIDIA DGX/HGX A100 server (8 × A100 SXM4 80GB), NVIDIA A100 Tensor Core GPU
datasheet and the same NCCL table (its ``hwLat`` is per link type, not per GPU generation):

- `device_flops` 312e12 FLOP/s: dense FP16/BF16 tensor-core rate (624 with sparsity). Its dense
  TF32 rate, 156 TFLOP/s, is again half, so the float32 rule above holds for both profiles and
  no separate float32 field is needed.
- `device_memory_bandwidth` 2.039e12 B/s: HBM2e of the 80GB SXM4 part.
- `intra_server_bandwidth` 300e9 B/s: NVLink 3 through NVSwitch, 600 GB/s per GPU both ways.
- `inter_server_bandwidth` 25e9 B/s: one 200 Gb/s HDR InfiniBand (ConnectX-6) port per GPU.
- `intra_server_latency` 2 µs, `inter_server_latency` 4 µs, `devices_per_server` 8: as above.
- `device_memory` 80 GiB: the datasheet's "80GB HBM2e" (nvidia-smi reports 81,920 MiB).
- No attention efficiencies: no published FlashAttention-2 rate on A100 at head dim 128 was
  found to cite, so its fused attention runs at the fitted `matmul_efficiency` (its fit's runs,
  Korthikanti et al.'s GPT, compute attention unfused: the factor never saw a fused kernel).

All are nominal peaks; what a kernel or NCCL achieves is lower, which the efficiency factors say
once they are fitted to published runs. The search compares plans, and for that the ratios
between compute, memory and links matter more than the absolute speed.

Fitted factors: ``a100-80gb``'s `matmul_efficiency` 0.7977 is the fit printed by
``benchmarks/published.py`` (once for the profile, never per run: least squares of the log
ratio over every step time of Korthikanti et al. 2022 the estimate can express, 22B and 1T, full
recompute and SP + selective, with 16-bit plans priced in 16 bits, `search.precision`). At the
nominal peak those four were predicted 0.849, 0.849, 0.858 and 0.858 of the published times; at
the fit 0.959, 0.957, 1.028 and 1.031, leave-one-out errors -4.9 %, -5.1 %, +4.3 % and +4.9 %.
Refitted with the step-time model of issue #37 (collective algorithms, buckets, interleaved
schedules) over all eight step times, 175B and 530B now expressible, the fit gives 0.8084: the
mean absolute relative error over the eight moves from 4.46 % at 0.7977 to 4.41 % (leave-one-out
5.01 %), every entry within ±15 % at both, so the factor stays as fitted (``published.py``'s
fit table prints both columns).
Its other factors, and the three of ``h100-sxm-80gb`` (no published run here), stay 1.0.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace
from fractions import Fraction

import numpy as np

from autostrat.cost.op_cost import FLASH_BACKWARD_FLOPS, FLOPS_PER_ITERATION, OpCost
from autostrat.cost.time_model import AlphaBeta, ceil_nanoseconds
from autostrat.errors import ConfigError
from autostrat.layout import DeviceMatrix

DEVICES_PER_SERVER = 8  # an Ascend or DGX/HGX server; also the inner axis of the "auto" mesh
DEVICE_MEMORY = 80 * 2**30  # bytes: both shipped profiles are 80 GiB parts (module docstring)


EFFICIENCIES = ("matmul_efficiency", "network_efficiency", "memory_efficiency")
# Fields a profile may leave out: the efficiencies (1.0), and two a calibrated machine gives
# (`benchmarks/time_model.py`): 0 leaves every prediction as it was without them.
HOST_FIELDS = ("kernel_latency", "collective_latency", "collective_wait", "collective_wait_most", "cores_per_server",
               "kernel_passes", "kernel_rates", "crowded")
# The fused attention kernels' own rates (None: `matmul_efficiency`'s, as before they existed).
ATTENTION_EFFICIENCIES = ("attention_efficiency", "attention_backward_efficiency")
OPTIONAL_FIELDS = (*EFFICIENCIES, *HOST_FIELDS, "device_memory", *ATTENTION_EFFICIENCIES)
# Per fused attention op type, the field its flop rate takes and the flops that rate counts per
# flop `op_cost` counts (the forward as autostrat does; the backward's two ops as one kernel).
_BACKWARD_COUNTED = Fraction(FLASH_BACKWARD_FLOPS, FLOPS_PER_ITERATION["FlashAttentionScoreQueryGrad"]
                             + FLOPS_PER_ITERATION["FlashAttentionScoreKeyValueGrad"])
ATTENTION_OPS = {"FlashAttentionScore": ("attention_efficiency", 1),
                 "FlashAttentionScoreQueryGrad": ("attention_backward_efficiency", _BACKWARD_COUNTED),
                 "FlashAttentionScoreKeyValueGrad": ("attention_backward_efficiency", _BACKWARD_COUNTED)}
INTEGER_FIELDS = ("devices_per_server", "cores_per_server", "device_memory")  # a profile keeps these as ints


@dataclass(frozen=True)
class Hardware:
    """A hardware profile: compute, memory and link speeds of one device and its server, the
    efficiency factors applied to them, and the profile's name (defaults: ``h100-sxm-80gb`` with
    no name, see the module docstring).

    Example (8 devices are one server; 16 are two, and their outer axis crosses the network):
        >>> hardware = Hardware()
        >>> hardware.alpha_beta(8).device_matrix, hardware.alpha_beta(16).bandwidth
        (DeviceMatrix(shape=(8,)), (450000000000.0, 50000000000.0))

    An op of 989.4 MFLOP reading and writing 3.35 MB takes 1 µs of compute (2 µs in float32)
    and 1 µs of memory traffic; at half the matmul efficiency its compute takes twice as long:
        >>> cost = OpCost(flops_per_device=989_400_000, memory_bytes_per_device=3_350_000)
        >>> hardware.compute_nanoseconds(cost, ("float16",)), hardware.compute_nanoseconds(cost, ("float32",))
        (2000, 3000)
        >>> Hardware(matmul_efficiency=0.5).compute_nanoseconds(cost, ("float16",))
        3000
    """

    device_flops: float = 989.4e12
    device_memory_bandwidth: float = 3.35e12
    intra_server_bandwidth: float = 450e9
    inter_server_bandwidth: float = 50e9
    intra_server_latency: float = 2e-6
    inter_server_latency: float = 4e-6
    devices_per_server: int = DEVICES_PER_SERVER
    device_memory: int = DEVICE_MEMORY  # bytes of one device's memory: the default budget of a search
    matmul_efficiency: float = 1.0
    network_efficiency: float = 1.0
    memory_efficiency: float = 1.0
    kernel_latency: float = 0.0  # seconds each op's kernel takes beyond its flops and bytes (a launch)
    collective_latency: float = 0.0  # seconds each collective step takes beyond its messages
    collective_wait: float = 0.0  # fraction of the compute since the last collective the next one waits
    collective_wait_most: float = math.inf  # seconds such a wait takes at most
    cores_per_server: int = 0  # cores the devices of one server share (0: each device computes alone)
    # Per op type, how many times its kernel moves the bytes it reads and writes (unlisted: 1).
    kernel_passes: tuple[tuple[str, float], ...] = ()
    # Per op type, how many times the FLOP rate its kernel runs at (unlisted: 1).
    kernel_rates: tuple[tuple[str, float], ...] = ()
    # Per crowding (ranks per core, > 1): (crowding, message latency s, message bandwidth B/s, kernel slowdown,
    # collective latency s, collective wait, its most s).
    crowded: tuple[tuple[float, ...], ...] = ()
    name: str = ""  # the profile's name, or the file it was read from ("": given field by field)
    attention_efficiency: float | None = None  # fused attention's forward rate (None: matmul_efficiency's)
    attention_backward_efficiency: float | None = None  # and its backward's, per FlashAttention's flops

    def __post_init__(self) -> None:
        if not isinstance(self.name, str):
            raise ConfigError(f"a hardware profile's name must be a string, got {self.name!r}")
        object.__setattr__(self, "kernel_passes", _checked_passes(self.kernel_passes))
        object.__setattr__(self, "kernel_rates", _checked_passes(self.kernel_rates, "kernel_rates", "FLOP rates"))
        object.__setattr__(self, "crowded", _checked_crowded(self.crowded))
        for field in fields(self):
            if field.name not in ("name", "kernel_passes", "kernel_rates", "crowded"):
                object.__setattr__(self, field.name, _checked(field.name, getattr(self, field.name)))

    def link(self, across_servers: bool) -> tuple[float, float]:
        """Latency (s) and achieved bandwidth (B/s, the nominal one times `network_efficiency`)
        of a link inside a server or across servers.

        Example:
            >>> Hardware(network_efficiency=0.5).link(across_servers=True)
            (4e-06, 25000000000.0)
        """
        if across_servers:
            return self.inter_server_latency, self.inter_server_bandwidth * self.network_efficiency
        return self.intra_server_latency, self.intra_server_bandwidth * self.network_efficiency

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
        intra, inter = self.link(across_servers=False), self.link(across_servers=True)
        if matrix.ndim == 1:
            latency, bandwidth = inter if device_num > self.devices_per_server else intra
            return AlphaBeta(matrix, (latency,), (bandwidth,), self.collective_latency)
        return AlphaBeta(matrix, (intra[0], inter[0]), (intra[1], inter[1]), self.collective_latency)

    def compute_nanoseconds(self, cost: OpCost, dtypes, op_type: str = "") -> int:
        """Nanoseconds of one op on one device: its flops at ``device_flops · matmul_efficiency
        · 2 / itemsize`` (the widest floating-point operand of `dtypes`; 16-bit or no float: the
        full rate), plus the bytes it reads and writes (`OpCost.memory_bytes_per_device`) over
        ``device_memory_bandwidth · memory_efficiency``, each rounded up, the bytes times the
        `kernel_passes` of `op_type` (1 unless listed) and the rate times its `kernel_rates`
        (1 unless listed), plus `kernel_latency`. The sum, not the
        larger of the two: an op is charged for both, which keeps the model additive (and is
        the issue's model). A fused attention op of a profile with its attention efficiency
        runs at that instead of `matmul_efficiency`, on the flops FlashAttention counts
        (`flop_rate`).

        Example (a key/value gradient's 14 autostrat flops are 10 of FlashAttention's):
            >>> grad = OpCost(flops_per_device=14 * 98_940_000, memory_bytes_per_device=0)
            >>> Hardware(attention_backward_efficiency=0.5).compute_nanoseconds(grad, ("float16",), "FlashAttentionScoreKeyValueGrad")
            2000
        """
        itemsize = max(2, max((np.dtype(d).itemsize for d in dtypes if np.dtype(d).kind == "f"), default=2))
        efficiency, counted = self.flop_rate(op_type)
        if self.kernel_rates:
            efficiency *= dict(self.kernel_rates).get(op_type, 1.0)
        compute = ceil_nanoseconds(cost.flops_per_device * itemsize * counted, self.device_flops * efficiency * 2)
        bandwidth, passes = self.device_memory_bandwidth * self.memory_efficiency, dict(self.kernel_passes).get(op_type, 1.0)
        if passes == 1:
            memory = ceil_nanoseconds(cost.memory_bytes_per_device, bandwidth)
        else:  # exactly, as `ceil_nanoseconds`: floats are binary fractions
            memory = math.ceil(Fraction(cost.memory_bytes_per_device) * Fraction(passes) * 10**9 / Fraction(bandwidth))
        return round(self.kernel_latency * 1e9) + compute + memory

    def flop_rate(self, op_type: str) -> tuple[float, int | Fraction]:
        """(The fraction of `device_flops` an op of `op_type` runs at, the flops that rate counts
        per flop `op_cost` counts): a fused attention op's own efficiency when the profile
        gives it (`ATTENTION_OPS`), else `matmul_efficiency` on the flops as counted (an int 1,
        which keeps the hot path's arithmetic in ints).

        Example:
            >>> Hardware(attention_backward_efficiency=0.25).flop_rate("FlashAttentionScoreQueryGrad")
            (0.25, Fraction(5, 7))
            >>> Hardware(matmul_efficiency=0.5).flop_rate("FlashAttentionScore")
            (0.5, 1)
        """
        field, counted = ATTENTION_OPS.get(op_type, (None, 1))
        if field is None or getattr(self, field) is None:
            return self.matmul_efficiency, 1
        return getattr(self, field), counted

    def shared(self, device_num: int) -> "Hardware":
        """The profile as each of `device_num` devices sees it when the devices of a server
        share its `cores_per_server` cores (ranks on a machine's CPU cores): with k devices on a
        server and k > cores, each computes on ``cores / k`` of a core, so every rate is
        divided by the crowding ``k / cores`` and the host latencies multiplied by it, and so are
        a message's latency and time per byte; the profile itself when each device has its own
        (0) or enough cores. Where the profile measured a crowding (`crowded`), that row's
        factors replace the crowding: its kernel slowdown for the compute, its message latency,
        bandwidth and collective latency over the profile's own for the links and collectives,
        and its collective wait and longest wait (`crowding_factors`). The shared
        profile has ``cores_per_server`` 0: its share is taken once.

        Example (8 ranks on 2 cores take 4 times as long for everything):
            >>> crowded = Hardware(cores_per_server=2, kernel_latency=5e-6).shared(8)
            >>> crowded.device_flops / 1e12, crowded.intra_server_latency, crowded.kernel_latency
            (247.35, 8e-06, 2e-05)
            >>> Hardware(cores_per_server=2).shared(2) == Hardware(cores_per_server=2)
            True
        """
        crowding = min(device_num, self.devices_per_server) / self.cores_per_server if self.cores_per_server else 1
        if crowding <= 1:
            return self
        compute, latency, per_byte, collective, wait, most = self.crowding_factors(crowding)
        rates = ("device_flops", "device_memory_bandwidth")
        links = {"intra_server_latency": self.intra_server_latency * latency, "inter_server_latency": self.inter_server_latency * latency,
                 "intra_server_bandwidth": self.intra_server_bandwidth / per_byte, "inter_server_bandwidth": self.inter_server_bandwidth / per_byte}
        return replace(self, **{f: getattr(self, f) / compute for f in rates}, **links, kernel_latency=self.kernel_latency * compute,
                       collective_latency=self.collective_latency * collective, collective_wait=wait, collective_wait_most=most,
                       cores_per_server=0, crowded=())  # its share taken: sharing it again changes nothing

    def crowding_factors(self, crowding: float) -> tuple[float, ...]:
        """(kernel slowdown, message latency factor, message time-per-byte factor, collective
        latency factor, collective wait, its most) of ranks `crowding` to a core: each factor
        the crowding itself and the waits the profile's unless `crowded` measured them; between
        two measured crowdings (or 1, where every factor is 1 and the waits the profile's, the
        first row's most where the profile has none, and the first) interpolated linearly,
        beyond the last that row's scaled by ``crowding / its crowding``.

        Example (a row measured at 4 ranks per core: latency 10 times the profile's):
            >>> hardware = Hardware(intra_server_latency=1e-6, intra_server_bandwidth=1e9, collective_latency=1e-6,
            ...                     collective_wait_most=0.0, crowded={4: [1e-5, 2.5e8, 5.0, 3e-6, 0.3, 0.002]})
            >>> [tuple(round(f, 9) for f in hardware.crowding_factors(c)) for c in (4, 2.5, 8)]
            [(5.0, 10.0, 4.0, 3.0, 0.3, 0.002), (3.0, 5.5, 2.5, 2.0, 0.15, 0.001), (10.0, 20.0, 8.0, 6.0, 0.6, 0.004)]
        """
        def ratio(measured: float, own: float, c: float) -> float:
            return measured / own if own else c

        own_most = self.collective_wait_most if self.collective_wait_most < math.inf or not self.crowded else self.crowded[0][6]
        points = [(1.0, 1.0, 1.0, 1.0, 1.0, self.collective_wait, own_most)] + [
            (c, slowdown, ratio(latency, self.intra_server_latency, c), self.intra_server_bandwidth / bandwidth,
             ratio(collective, self.collective_latency, c), wait, most)
            for c, latency, bandwidth, slowdown, collective, wait, most in self.crowded]
        if len(points) == 1:
            return (crowding,) * 4 + (self.collective_wait, self.collective_wait_most)
        for (low, *below), (high, *above) in zip(points, points[1:]):
            if crowding <= high:
                share = (crowding - low) / (high - low)
                return tuple(a + share * (b - a) for a, b in zip(below, above))
        last, *factors = points[-1]
        return tuple(f * crowding / last for f in factors)

    def describe(self) -> str:
        """One line of the hardware a prediction assumes.

        Example:
            >>> Hardware().describe()
            '989.4 TFLOP/s (16-bit), memory 3350 GB/s, 8 devices per server linked at 450 GB/s and 2 us, servers at 50 GB/s and 4 us'
            >>> PROFILES["a100-80gb"].describe()
            'a100-80gb: 312 TFLOP/s (16-bit), memory 2039 GB/s, 8 devices per server linked at 300 GB/s and 2 us, servers at 25 GB/s and 4 us; matmul_efficiency 0.7977'
        """
        efficiencies = ", ".join([f"{field} {getattr(self, field):g}" for field in EFFICIENCIES if getattr(self, field) != 1]
                                 + [f"{field} {getattr(self, field):g}" for field in ATTENTION_EFFICIENCIES
                                    if getattr(self, field) is not None])  # 1.0 there is no default
        return (f"{self.name + ': ' if self.name else ''}"
                f"{self.device_flops / 1e12:g} TFLOP/s (16-bit), memory {self.device_memory_bandwidth / 1e9:g} GB/s, "
                f"{self.devices_per_server} devices per server linked at {self.intra_server_bandwidth / 1e9:g} GB/s "
                f"and {self.intra_server_latency * 1e6:g} us, servers at {self.inter_server_bandwidth / 1e9:g} GB/s "
                f"and {self.inter_server_latency * 1e6:g} us" + (f"; {efficiencies}" if efficiencies else "")
                + (f"; {self.kernel_latency * 1e6:g} us per kernel" if self.kernel_latency else "")
                + (f"; {self.collective_latency * 1e6:g} us per collective" if self.collective_latency else "")
                + (f"; {self.cores_per_server} cores per server shared" if self.cores_per_server else ""))


def _checked_passes(value, field: str = "kernel_passes", what: str = "passes") -> tuple[tuple[str, float], ...]:
    """`kernel_passes` (or `kernel_rates`, `field`) as the profile keeps it: (op type, number
    > 0) pairs sorted by op type, from pairs or a mapping; anything else is a `ConfigError`."""
    pairs = list(value.items()) if isinstance(value, dict) else value
    try:
        checked = tuple(sorted((str(op_type), float(passes)) for op_type, passes in pairs))
    except (TypeError, ValueError):
        raise ConfigError(f"{field} must map op types to numbers of {what}, got {value!r}") from None
    bad = [pair for pair in checked if not 0 < pair[1] < math.inf]
    if bad:
        raise ConfigError(f"{field} of {bad[0][0]} must be a finite number > 0, got {bad[0][1]!r}")
    return checked


def _checked_crowded(value) -> tuple[tuple[float, ...], ...]:
    """`crowded` as the profile keeps it: (crowding > 1, message latency >= 0, bandwidth > 0,
    kernel slowdown > 0, collective latency >= 0, collective wait >= 0, its most >= 0 s) rows
    sorted by crowding, from rows or a mapping of crowding to the other six; anything else is
    a `ConfigError`."""
    expected = ("crowded must map ranks per core to [message latency s, message bandwidth B/s, kernel slowdown, "
                "collective latency s, collective wait, its most s]")
    try:
        rows = [(crowding, *rest) for crowding, rest in value.items()] if isinstance(value, dict) else value
        checked = tuple(sorted(tuple(float(x) for x in row) for row in rows))
    except (TypeError, ValueError):
        raise ConfigError(f"{expected}, got {value!r}") from None
    if any(len(row) != 7 for row in checked):
        raise ConfigError(f"{expected}, got {value!r}")
    bad = [row for row in checked if not (1 < row[0] < math.inf and 0 <= row[1] < math.inf and 0 < row[2] < math.inf
                                          and 0 < row[3] < math.inf and 0 <= row[4] < math.inf and 0 <= row[5] < math.inf
                                          and 0 <= row[6] < math.inf)]
    if bad:
        raise ConfigError(f"crowded at {bad[0][0]:g} ranks per core needs a crowding > 1, a latency >= 0, a bandwidth > 0, "
                          f"a slowdown > 0, a collective latency >= 0 and waits >= 0, got {list(bad[0][1:])!r}")
    return checked


def _checked(field: str, value):
    """`value` of `field` as the profile keeps it (a float, or the devices per server as an
    int); anything else is a `ConfigError` saying what the field takes."""
    if field in INTEGER_FIELDS:
        lowest = int(field != "cores_per_server")
        if isinstance(value, bool) or not isinstance(value, int) or value < lowest:
            unit = " (bytes)" if field == "device_memory" else ""
            raise ConfigError(f"{field} must be {'a positive' if lowest else 'a non-negative'} integer{unit}, got {value!r}")
        return value
    number = not isinstance(value, bool) and isinstance(value, (int, float))
    if field in ATTENTION_EFFICIENCIES and value is None:  # unset: the matrix products' rate
        return None
    if field in EFFICIENCIES or field in ATTENTION_EFFICIENCIES:
        if not (number and 0 < value <= 1):  # NaN too
            raise ConfigError(f"{field} must be a number in (0, 1] (a fraction of the nominal peak), got {value!r}")
        return float(value)
    lowest = 0.0 if field.endswith(("latency", "wait", "wait_most")) else math.ulp(0.0)  # kernel_latency too
    if field == "collective_wait_most" and value == math.inf:  # unset: no most
        return value
    if not (number and lowest <= value < math.inf):
        units = {"device_flops": "FLOP/s", "collective_wait": "a fraction of the compute before a collective",
                 "collective_wait_most": "seconds"}
        unit = "seconds" if field.endswith("latency") else units.get(field, "bytes/s")
        raise ConfigError(f"{field} must be a finite number {'>= 0' if lowest == 0 else '> 0'} ({unit}), got {value!r}")
    return float(value)


# The named profiles (`hardware:` in a config), their constants cited in the module docstring.
PROFILES = {
    "a100-80gb": Hardware(device_flops=312e12, device_memory_bandwidth=2.039e12, intra_server_bandwidth=300e9,
                          inter_server_bandwidth=25e9, intra_server_latency=2e-6, inter_server_latency=4e-6,
                          devices_per_server=8, device_memory=DEVICE_MEMORY, matmul_efficiency=0.7977,  # benchmarks/published.py's fit (docstring)
                          name="a100-80gb"),
    "h100-sxm-80gb": Hardware(device_flops=989.4e12, device_memory_bandwidth=3.35e12, intra_server_bandwidth=450e9,
                              inter_server_bandwidth=50e9, intra_server_latency=2e-6, inter_server_latency=4e-6,
                              devices_per_server=8, device_memory=DEVICE_MEMORY, name="h100-sxm-80gb"),
}
DEFAULT_PROFILE = "h100-sxm-80gb"
