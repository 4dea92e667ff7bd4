"""What a device holds at its peak, by kind: parameters, gradients, optimiser state, activations
and communication buffers (`autostrat estimate`'s memory table).

The buffers at the peak are the plan's own (`buffers.peak_buffers`, per pipeline stage
`stage_buffers.stage_peak_buffers`), so the kinds always sum to the peak the plan predicts. A
buffer's kind follows from its key (cases):

1. a copy made by a redistribution or a writeback (``tensor>consumer``): communication buffers,
   except the fp32 main copy of a 16-bit parameter (``parameter>main``): optimiser state;
2. a trained parameter or its next value: parameters;
3. a gradient an update reads (summed over micro-batches): gradients;
4. the optimiser's state (Adam's moments, step counters) or its next value: optimiser state;
5. anything else (graph inputs, op outputs, activation gradients, tensors received from
   another stage): activations.
"""

from __future__ import annotations

from dataclasses import dataclass

from autostrat.search.buffers import peak_buffers
from autostrat.search.precision import TensorSizes
from autostrat.search.stage_buffers import stage_peak_buffers

KINDS = ("parameters", "gradients", "optimizer_state", "activations", "communication_buffers")


@dataclass(frozen=True)
class MemoryBreakdown:
    """One device's bytes at its peak, per kind (`KINDS`; `peak_bytes` is their sum), and the
    most activation bytes it holds at any moment (at the end of the forward passes in flight,
    while the peak may fall in the update)."""

    bytes_by_kind: dict
    most_activation_bytes: int = 0

    @property
    def peak_bytes(self) -> int:
        return sum(self.bytes_by_kind.values())


def memory_breakdowns(plan) -> tuple[MemoryBreakdown, ...]:
    """Per pipeline stage of `plan` (one entry for a plan without stages), what one of its
    devices holds at its peak, by kind.

    Example (the tutorial FFN's Momentum step: the kinds sum to the plan's peak):
        >>> from autostrat.autodiff import Momentum
        >>> from autostrat.models import tutorial_plan
        >>> plan = tutorial_plan(optimizer=Momentum(0.01, 0.9))
        >>> [breakdown] = memory_breakdowns(plan)
        >>> breakdown.peak_bytes == plan.prediction.peak_bytes, sorted(breakdown.bytes_by_kind) == sorted(KINDS)
        (True, True)
    """
    kind_of = _classifier(plan)
    def activation(key: str) -> bool:
        return kind_of(key) == "activations"

    held = stage_peak_buffers(plan, activation) if plan.pipeline else (peak_buffers(plan, activation),)
    breakdowns = []
    for pairs, most_activations in held:
        totals = dict.fromkeys(KINDS, 0)
        for key, size in pairs:
            totals[kind_of(key)] += size
        breakdowns.append(MemoryBreakdown(totals, most_activations))
    return tuple(breakdowns)


def _classifier(plan):
    """A function from a buffer's key to its kind (the module docstring's cases)."""
    sizes = TensorSizes.of(plan.graph, plan.precision)
    values = dict(plan.graph.updates)
    parameters = set(sizes.parameters) | {values[p] for p in sizes.parameters if p in values}
    state = {name for name in values if name not in sizes.parameters}
    state |= {values[name] for name in state}

    def kind_of(key: str) -> str:
        if key.endswith(">main"):
            return "optimizer_state"
        if ">" in key:
            return "communication_buffers"
        if key in parameters:
            return "parameters"
        if key in sizes.gradients:
            return "gradients"
        return "optimizer_state" if key in state else "activations"

    return kind_of
