"""The price of a ring strategy (`layout.Strategy.ring`): the bytes its op passes around the
ring and its time with those sends overlapped by its compute.

Per device, on a ring of g devices (the carrier's split), with K and V the device's key and
value blocks and every block priced in the key's dtype (the wire dtype of `runtime.ring`):

- FlashAttentionScore and its query gradient pass K and V on g-1 times;
- the key and value gradient passes K and V on 2(g-1) times (each row's softmax statistics,
  then the gradient pass) and its running dK and dV g times (the last one home to the owner).

One message per block passed on (α each). Time: the op's compute in g blocks, one per ring
step; the first block runs before anything arrives, the sends of each step overlap the compute
of the step before, so the op takes ``compute / g + max(compute - compute / g, sends)``: the
sends cost nothing more while the compute of the other blocks hides them (ring attention's
point), and beyond that they are what the op waits for.
"""

from __future__ import annotations

import math

from autostrat.cost.collective import dtype_size
from autostrat.cost.time_model import AlphaBeta, ceil_nanoseconds

# Per op type: (how many times g-1 the K and V blocks are passed on, how many times g the dK and dV blocks).
PASSES = {"FlashAttentionScore": (1, 0), "FlashAttentionScoreKeyValueGrad": (2, 1), "FlashAttentionScoreQueryGrad": (1, 0)}


def ring_size(strategy) -> int:
    """The devices of `strategy`'s ring (1: not a ring strategy)."""
    return strategy.split(strategy.rule.ring[1]) if strategy.ring else 1


def ring_messages(strategy) -> tuple[int, int]:
    """(messages, bytes) each device sends in `strategy`'s ring, per block of 1 byte per
    element: multiply the bytes by the wire dtype's size (`ring_bytes`)."""
    g = ring_size(strategy)
    if g == 1:
        return 0, 0
    blocks, gradients = PASSES[strategy.rule.op_type]
    key, value = (math.prod(layout.slice_shape) for layout in strategy.input_layouts[1:3])
    return 2 * (blocks * (g - 1) + gradients * g), (key + value) * (blocks * (g - 1) + gradients * g)


def ring_bytes(strategy, key_dtype) -> int:
    """Bytes each device sends in `strategy`'s ring, its blocks in `key_dtype` (0 without a ring).

    Example (ring attention over 4 devices, fp32 blocks of 2·2·4·4 elements: 3 steps of K and V):
        >>> from autostrat.layout import Strategy
        >>> from autostrat.rules import make_rule
        >>> rule = make_rule("FlashAttentionScore", [(2, 2, 16, 4)] * 3, head_num=2)
        >>> ring_bytes(Strategy.from_tuples(rule, ((1, 1, 4, 1),) * 3, 4), "float32") == 3 * 2 * (2 * 2 * 4 * 4) * 4
        True
    """
    return ring_messages(strategy)[1] * dtype_size(key_dtype)


def ring_nanoseconds(strategy, compute_ns: int, key_dtype, model: AlphaBeta | None) -> int:
    """The op's time on `model`'s links: `compute_ns` with its ring's sends overlapped (module
    docstring); `compute_ns` itself without a ring.

    Example (sends shorter than the compute they overlap cost nothing more; longer ones do):
        >>> from autostrat.layout import DeviceMatrix, Strategy
        >>> from autostrat.rules import make_rule
        >>> rule = make_rule("FlashAttentionScore", [(2, 2, 16, 4)] * 3, head_num=2)
        >>> ring = Strategy.from_tuples(rule, ((1, 1, 4, 1),) * 3, 4)
        >>> model = AlphaBeta(DeviceMatrix((4,)), latency=(1e-6,), bandwidth=(1e9,))
        >>> ring_nanoseconds(ring, 40_000, "float32", model), ring_nanoseconds(ring, 4_000, "float32", model)
        (40000, 8536)
    """
    g = ring_size(strategy)
    if g == 1 or model is None:
        return compute_ns
    messages, elements = ring_messages(strategy)
    alpha, beta = model.link(strategy.device_matrix, strategy.factor_axes(strategy.rule.ring[1]))
    sends = messages * round(alpha * 1e9) + ceil_nanoseconds(elements * dtype_size(key_dtype), beta)
    first = compute_ns // g
    return first + max(compute_ns - first, sends)
