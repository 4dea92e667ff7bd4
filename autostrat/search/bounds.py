"""A plan's communication against the lower bound of its matmul-family ops (issue #19).

Every byte of a plan is charged to one op (`op_charges`): the collectives that sum partial
values to the op that produced them (its split reduction made them), every other
redistribution step to the op that reads the tensor, and a parameter's writeback to the first
op reading the parameter (under the bound's one-copy model that op gathers the weight). Each
MatMul and BatchMatMul is then compared with its bound (`cost.lower_bound`: Al Daas et al.,
SPAA 2022) on the plan's devices.

What the figures mean, honestly: each op's bound holds for that op alone, moving its inputs
from, and its output to, one evenly spread copy. The plan-level figure divides the bytes
charged to the matmul-family ops by the sum of their bounds. Ops that share an operand (the
Q, K and V projections reading one activation; a forward product and the backward products
reading its weight) can share communication, so the summed bound is not a bound on the plan;
and an op whose input stays replicated from an earlier collective, or that repeats work,
can sit below 1× of its own bound.
"""

from __future__ import annotations

from dataclasses import dataclass

from autostrat.cost import dtype_size
from autostrat.cost.lower_bound import Bound, communication_bound, matmul_dims

FLAG = 1.5  # ops sending more than this multiple of their bound are flagged
SUMMING_KINDS = ("AllReduce", "ReduceScatter")
CITATION = "Al Daas et al. 2022, each for its op alone"


@dataclass(frozen=True)
class OpBound:
    """One matmul-family op: its bound, the bytes per device charged to it, and their ratio
    (None when the bound is 0)."""

    op: str
    bound: Bound
    charged: int

    @property
    def ratio(self) -> float | None:
        return self.charged / self.bound.bytes if self.bound.bytes > 0 else None


@dataclass(frozen=True)
class PlanBounds:
    """The matmul-family ops of a plan against their bounds, and the plan-level sums."""

    ops: tuple[OpBound, ...]
    total_bytes: int  # the plan's bytes per device, all ops

    @property
    def charged(self) -> int:
        return sum(op.charged for op in self.ops)

    @property
    def bound(self) -> float:
        return sum(op.bound.bytes for op in self.ops)

    @property
    def ratio(self) -> float | None:
        return self.charged / self.bound if self.bound > 0 else None

    @property
    def flagged(self) -> tuple[OpBound, ...]:
        """The ops above `FLAG` times their bound, in graph order."""
        return tuple(op for op in self.ops if op.ratio is not None and op.ratio > FLAG)

    @property
    def line(self) -> str:
        """One line for the plan's table (see the module docstring for what it means)."""
        share = f"matmul-family ops send {self.charged:,} of the plan's {self.total_bytes:,} bytes per device"
        if not self.ops:
            return f"communication: no matmul-family op to bound (the plan sends {self.total_bytes:,} bytes per device)"
        if self.ratio is None:
            return f"communication: every matmul-family op's lower bound is 0 ({share})"
        return (f"communication: {self.ratio:.2f}× the per-op lower bounds ({share}; their bounds sum to "
                f"{self.bound:,.0f}: {CITATION}, not a bound on the plan); {len(self.flagged)} op(s) above {FLAG}× their own")


def plan_bounds(plan) -> PlanBounds:
    """Every matmul-family op of `plan` against its lower bound on the plan's devices.

    Example (MindSpore's tutorial FFN: its first MatMul seeded ((2, 1), (1, 4)) on 8 devices; the
    first MatMul reads the input and its weight loaded already sliced its way, so sends nothing):
        >>> from autostrat.models import tutorial_plan
        >>> bounds = plan_bounds(tutorial_plan())
        >>> [(op.op, op.bound.regime, round(op.bound.bytes, 6), op.charged, round(op.ratio, 6)) for op in bounds.ops]
        [('dense1.matmul', '3-D', 6144.0, 0, 0.0), ('dense2.matmul', '3-D', 6144.0, 6144, 1.0)]
        >>> bounds.line
        "communication: 0.50× the per-op lower bounds (matmul-family ops send 6,144 of the plan's 6,144 bytes per device; their bounds sum to 12,288: Al Daas et al. 2022, each for its op alone, not a bound on the plan); 0 op(s) above 1.5× their own"
    """
    charges = op_charges(plan)
    found = (_op_bound(plan, name, charges) for name in plan.graph.ops)
    return PlanBounds(tuple(bound for bound in found if bound is not None), plan.total_bytes)


def op_bound(plan, op: str) -> OpBound | None:
    """`op`'s bound and the bytes charged to it, None unless it is a matmul-family op.

    Example:
        >>> from autostrat.frontend import trace
        >>> from autostrat.models import FFN
        >>> from autostrat.nn import Tensor
        >>> from autostrat.search import search
        >>> plan = search(trace(FFN(), Tensor(shape=(64, 64)), device_num=8), 8)
        >>> op_bound(plan, "dense2.matmul").bound.regime, op_bound(plan, "relu")
        ('3-D', None)
    """
    return _op_bound(plan, op, op_charges(plan))


def _op_bound(plan, op: str, charges: dict[str, int]) -> OpBound | None:
    node = plan.graph.ops[op]
    dims = matmul_dims(node.rule)
    if dims is None:
        return None
    itemsize = dtype_size(plan.sizes.priced(node.outputs[0]))  # the bytes its charges are priced in
    return OpBound(op, communication_bound(dims, plan.device_num, itemsize), charges[op])


def op_charges(plan) -> dict[str, int]:
    """Bytes per device charged to each op of `plan` (every op listed); they sum to
    `plan.total_bytes` (see the module docstring for who pays what).

    Example:
        >>> from autostrat.models import tutorial_plan
        >>> plan = tutorial_plan()
        >>> {op: charged for op, charged in op_charges(plan).items() if charged}, plan.total_bytes
        ({'dense2.matmul': 6144}, 6144)
    """
    charges = dict.fromkeys(plan.graph.ops, 0)
    for edge in plan.redistributions:
        if edge.shares:
            continue  # an earlier edge paid for it
        producer = plan.graph.tensors[edge.tensor].producer or edge.consumer
        _charge(charges, edge.plan, producer, edge.consumer)
    for writeback in plan.writebacks:
        first_reader = plan.graph.consumers(writeback.parameter)[0][0]
        _charge(charges, writeback.plan, first_reader, first_reader)
    return charges


def _charge(charges: dict[str, int], redistribution, producer: str, consumer: str) -> None:
    """Charge `redistribution`'s steps: sums of partial values to `producer`, the rest to
    `consumer`; whatever the plan's cost holds beyond its steps' bytes goes to `consumer`, so
    the charges always add up to the plan's cost."""
    for step in redistribution.steps:
        summing = step.kind in SUMMING_KINDS and bool(step.before.partial)
        charges[producer if summing else consumer] += step.bytes
    charges[consumer] += redistribution.cost - sum(step.bytes for step in redistribution.steps)
