"""Per-strategy operator costs: compute, memory and the op's own communication, per device.

- Compute: ``Π(factor sizes) / Π(splits)`` iterations per device, doubled when the rule has a
  reduction factor (each iteration is a multiply-add, MatMul's ``2·m·k·n``). It is a model of
  relative work, not of a kernel's exact flops (a Softmax counts one flop per element). A fused
  op whose iterations hold several multiply-adds counts them (`FLOPS_PER_ITERATION`): fused
  attention ``b·n·s·t·d`` iterations are the two products of the unfused attention (QKᵀ and
  PV, 4 flops), its query gradient three (S again, dP, dQ) and its key and value gradient four
  (S again, dV, dP, dK). A causal op (`rules.Rule.causal`, FlashAttention's masked blocks
  skipped) works on the device holding the last rows' share: the iterations whose key is at
  most the row, of the last of its row factor's blocks (the devices holding earlier rows wait
  for it): about half the score matrix unsplit, ``(g - 1/2) / g`` of a block row over g.
- Memory: bytes of every input and output slice a device holds. Parameters are inputs, so they
  are counted there; activations kept for the backward pass are not modelled.
- Communication: 0, except for a ring strategy, whose op passes blocks around its ring itself
  (`cost.ring`). An op whose strategy splits a reduction factor leaves its output partial and
  the edge to its consumer resolves it (AllReduce, or ReduceScatter when the consumer wants the
  result split); counting it here as well would charge it twice.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from autostrat.cost.collective import dtype_size
from autostrat.cost.ring import ring_bytes
from autostrat.errors import LayoutError


FLOPS_PER_ITERATION = {"FlashAttentionScore": 4, "FlashAttentionScoreQueryGrad": 6, "FlashAttentionScoreKeyValueGrad": 8}
# FlashAttention's own count of its backward, per iteration: one kernel computing S again, dV, dP,
# dQ and dK (5 products, 2.5 forwards: Dao 2023, §4.1); autostrat's two gradient ops count 14, each
# computing S again. What its published rates measure (`cost.hardware.ATTENTION_OPS`).
FLASH_BACKWARD_FLOPS = 10


@dataclass(frozen=True)
class OpCost:
    """Costs of one strategy of one op, per device."""

    flops_per_device: int
    memory_bytes_per_device: int
    comm_bytes: int = 0


def op_cost(strategy, dtypes="float32") -> OpCost:
    """Compute, memory and communication of `strategy` (a `layout.Strategy`), per device.

    `dtypes` is one dtype for every operand, or one per input followed by one per output.

    Example (MatMul ``[256, 784] x [784, 64]`` with strategy ``((2, 1), (1, 4))`` on 8 devices):
        >>> from autostrat.layout import Strategy
        >>> from autostrat.rules import make_rule
        >>> rule = make_rule("MatMul", [(256, 784), (784, 64)])
        >>> cost = op_cost(Strategy.from_tuples(rule, ((2, 1), (1, 4)), 8))
        >>> cost.flops_per_device == 2 * 256 * 784 * 64 // 8, cost.memory_bytes_per_device
        (True, 459776)
    """
    layouts = strategy.input_layouts + strategy.output_layouts
    if isinstance(dtypes, (str, type)) or not hasattr(dtypes, "__len__"):
        dtypes = (dtypes,) * len(layouts)
    if len(dtypes) != len(layouts):
        raise LayoutError(
            f"{strategy.rule.op_type}: expected one dtype or {len(layouts)} (inputs then outputs), got {len(dtypes)}"
        )
    work = math.prod(strategy.rule.factor_sizes) // math.prod(strategy.splits)
    if strategy.rule.causal:
        work = causal_work(strategy)
    flops = work * FLOPS_PER_ITERATION.get(strategy.rule.op_type, 2 if strategy.rule.reduction else 1)
    memory = sum(math.prod(layout.slice_shape) * dtype_size(dtype) for layout, dtype in zip(layouts, dtypes))
    return OpCost(flops_per_device=flops, memory_bytes_per_device=memory, comm_bytes=ring_bytes(strategy, dtypes[1]) if strategy.ring else 0)


def causal_work(strategy) -> int:
    """Iterations of a causal op on its busiest device: those of the last block of row factor s
    whose key factor t is at most the row (``min(row + 1, t)`` keys per row), times the other
    factors' local sizes.

    Example (8 rows and keys: 36 of the 64 pairs on one device, 26 of the last 4 rows' 32 on two):
        >>> from autostrat.layout import Strategy
        >>> from autostrat.rules import make_rule
        >>> rule = make_rule("FlashAttentionScore", [(1, 1, 8, 1)] * 3, head_num=1, sparse_mode=2)
        >>> causal_work(Strategy(rule, (1,) * 5, 1)), causal_work(Strategy(rule, (1, 1, 2, 1, 1), 2))
        (36, 26)
    """
    rows, keys = strategy.rule.causal
    sizes = dict(zip(strategy.rule.factors, strategy.rule.factor_sizes))
    rest = math.prod(sizes[f] // strategy.split(f) for f in strategy.rule.factors if f not in (rows, keys))
    last, top = sizes[rows] - sizes[rows] // strategy.split(rows), sizes[rows]
    return rest * (_pairs(top, sizes[keys]) - _pairs(last, sizes[keys])) // strategy.split(keys)


def _pairs(rows: int, keys: int) -> int:
    """Visible (row, key) pairs of the first `rows` rows: ``Σ min(r + 1, keys)`` for r < rows."""
    triangle = min(rows, keys)
    return triangle * (triangle + 1) // 2 + (rows - triangle) * keys
