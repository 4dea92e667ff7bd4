"""Per-strategy operator costs: compute, memory and the op's own communication, per device.

- Compute: ``Π(factor sizes) / Π(splits)`` iterations per device, doubled when the rule has a
  reduction factor (each iteration is a multiply-add, MatMul's ``2·m·k·n``). It is a model of
  relative work, not of a kernel's exact flops (a Softmax counts one flop per element). A fused
  op whose iterations hold several multiply-adds counts them (`FLOPS_PER_ITERATION`): fused
  attention ``b·n·s·t·d`` iterations are the two products of the unfused attention (QKᵀ and
  PV, 4 flops), its query gradient three (S again, dP, dQ) and its key and value gradient four
  (S again, dV, dP, dK); a causal mask saves nothing here, as it saves nothing unfused.
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
    flops = work * FLOPS_PER_ITERATION.get(strategy.rule.op_type, 2 if strategy.rule.reduction else 1)
    memory = sum(math.prod(layout.slice_shape) * dtype_size(dtype) for layout, dtype in zip(layouts, dtypes))
    return OpCost(flops_per_device=flops, memory_bytes_per_device=memory, comm_bytes=ring_bytes(strategy, dtypes[1]) if strategy.ring else 0)
