"""Gradient buckets fused: a bucket's gradients synchronised by the same collective over the same
devices run as one collective over their concatenated flat slices (issue #37; MindSpore's
``comm_fusion``, PyTorch DDP's and Megatron's flat bucket buffers), paying one latency per
collective instead of one per gradient.

Cases (`fusion_key`): a "sync" edge whose redistribution is one AllReduce step fuses with the
other such edges of its bucket that have the same groups (members in the same order: the
ring's), the same reduce op and the same dtype on the wire; every other edge (a ReduceScatter
or AllGather, several steps) stays a collective of its own, as planned. A ReduceScatter or
AllGather of concatenated pieces would need every member's block of each gradient laid out
together (Megatron's distributed optimizer builds its buffer so): not built.

A fused collective's algorithm is chosen as an edge's is (`cost.algorithms.choose_algorithm`,
on the plan's hardware and objective), for the concatenated size; it runs where its first edge
stood in the bucket. The runtime runs it so (`runtime.bucketing`, `runtime.stream.FusedAllReduce`):
concatenate, one collective, split back. Fusing is what buckets mean (MindSpore's comm_fusion
fuses): without `bucket_bytes` every edge is its own collective, after the backward.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from autostrat.cost.algorithms import algorithm_nanoseconds, choose_algorithm


@dataclass(frozen=True)
class SyncCollective:
    """One collective of a bucket: `edges` (the plan's "sync" edges; one unless fused) and, when
    fused, the `algorithm` chosen for their concatenated `local_bytes` of `itemsize`-byte elements
    and what its busiest member sends (`sent`, as `choose_algorithm` counts it)."""

    edges: tuple
    algorithm: str = "ring"
    local_bytes: int = 0
    itemsize: int = 0
    sent: int = 0

    @property
    def fused(self) -> bool:
        return len(self.edges) > 1

    @property
    def step(self):
        """The first edge's step: its groups, device matrix and axes are every member's."""
        return self.edges[0].plan.steps[0]

    def nanoseconds(self, model) -> int:
        """Its time under the α–β `model`: one collective of the summed bytes when fused."""
        if not self.fused:
            return self.edges[0].plan.nanoseconds(model)
        step = self.step
        return algorithm_nanoseconds(model, "AllReduce", self.algorithm, step.before.device_matrix, tuple(step.axes),
                                     self.local_bytes, self.itemsize)

    @property
    def bytes(self) -> int:
        """What its busiest member sends."""
        return self.sent if self.fused else self.edges[0].plan.cost


def fusion_key(plan, edge) -> tuple | None:
    """What `edge` (a "sync" edge of `plan`) must share with another to fuse with it: its
    AllReduce's groups, reduce op and dtype on the wire; None when it does not fuse (module docstring)."""
    steps = edge.plan.steps
    if len(steps) != 1 or steps[0].kind != "AllReduce" or steps[0].group_size == 1:
        return None
    return steps[0].groups, steps[0].before.partial_op, plan.sizes.priced(edge.tensor), plan.sizes(edge.tensor)


def sync_collectives(plan, bucket) -> tuple[SyncCollective, ...]:
    """The collectives `bucket` (edges of `plan`, in stream order) runs as: its edges of one
    `fusion_key` fused, at the place of the first of them; the others one each.

    Example (the tutorial FFN trained data parallel on 4 devices, every gradient in one bucket:
    three AllReduced over the 4 devices, fused; dense2's bias gathered, alone):
        >>> from autostrat import reset_auto_parallel_context, set_auto_parallel_context
        >>> from autostrat.autodiff import SGD
        >>> from autostrat.frontend.train import training_plan
        >>> from autostrat.models import FFN
        >>> from autostrat.search.prediction import sync_edges
        >>> set_auto_parallel_context(parallel_mode="data_parallel", device_num=4)
        >>> plan = training_plan(FFN(), SGD(0.01))[0]
        >>> reset_auto_parallel_context()
        >>> [([edge.tensor for edge in c.edges], c.local_bytes) for c in sync_collectives(plan, sync_edges(plan))]
        [(['grad/dense2.bias'], 0), (['grad/dense2.weight', 'grad/dense1.bias', 'grad/dense1.weight'], 33024)]
    """
    members: dict = {}
    order = []
    for edge in bucket:
        key = fusion_key(plan, edge)
        if key is None:
            order.append([edge])
            continue
        if key not in members:
            members[key] = []
            order.append(members[key])
        members[key].append(edge)
    return tuple(_collective(plan, tuple(edges)) for edges in order)


def _collective(plan, edges: tuple) -> SyncCollective:
    if len(edges) == 1:
        return SyncCollective(edges)
    step, itemsize = edges[0].plan.steps[0], plan.sizes(edges[0].tensor)
    local_bytes = sum(math.prod(edge.plan.steps[0].before.slice_shape) for edge in edges) * itemsize
    algorithm, _, sent = choose_algorithm(plan.hardware.alpha_beta(plan.device_num), "AllReduce", step.before.device_matrix,
                                          tuple(step.axes), local_bytes, itemsize, plan.cost_model)
    return SyncCollective(edges, algorithm, local_bytes, itemsize, sent)
