"""An op's candidate strategies in a search problem (`op_candidates`): its rule's strategies on the
candidate mesh (`candidate_mesh`, `candidate_values`: the splits of the "auto" mesh and of the
seeds), with or without repeated calculation, every device used where asked (`full_only`), and
partial inputs only from producers that can make them (`can_be_partial`). They are kept as a
`HashedTuple`, and what propagation reads of them again and again (`wanted_positions`,
`output_layouts`) is listed once per candidate tuple.
"""

from __future__ import annotations

from functools import cache

from autostrat.ir import Graph, OpNode
from autostrat.layout import Strategy
from autostrat.layout.layout import remembered_hash
from autostrat.strategies import LINEAR_OP_TYPES, generate_strategies, mesh_axes, on_mesh, split_values


class HashedTuple(tuple):
    """A tuple whose hash is computed once: an op's candidates, or their layouts. The search's
    memos (cost tables `problem_edges.edge_table`, own costs, tie orders, bounds) are keyed by
    such tuples, and a tuple's hash hashes every item: 7.5 M strategy hashes in the estimate
    of DeepSeek-V3 on tp 4 x pp 8, 6.6 of its 49.8 s profiled. Equal to (and hashed as) the plain
    tuple of its items; pickled as one (a string's hash differs between processes).

    Example:
        >>> HashedTuple((1, 2)) == (1, 2) and hash(HashedTuple((1, 2))) == hash((1, 2))
        True
    """

    def __hash__(self) -> int:
        return remembered_hash(self, tuple.__hash__)

    def __reduce__(self):
        return HashedTuple, (tuple(self),)


@cache
def wanted_positions(candidates: tuple, index: int) -> dict:
    """Per normal form of input `index`, the positions of the `candidates` (a consumer's) that
    want it: read once per decided neighbour (1.9 M candidates' layouts in DeepSeek-V3's tp 4
    estimate, against a few paid layouts each time)."""
    positions: dict = {}
    for position, candidate in enumerate(candidates):
        positions.setdefault(candidate.input_layouts[index].normalized(), []).append(position)
    return positions


@cache
def output_layouts(candidates: tuple, index: int) -> HashedTuple:
    """The layout of output `index` under each of `candidates` (a tuple hashed once: the
    destination bounds are remembered by it, `candidate_prices.destination_bounds`)."""
    return HashedTuple(candidate.output_layouts[index] for candidate in candidates)


def op_candidates(op: OpNode, device_num: int, allow_repeated: bool, full_only: bool = False,
                  values: frozenset[int] | None = None, mesh: tuple[int, ...] | None = None) -> tuple[Strategy, ...]:
    """An unseeded op's candidates (with splits in `values`, on `mesh`'s axes, unless None).
    With `full_only`, only strategies using every device, when the op has any (otherwise its
    all-ones strategy)."""
    candidates = generate_strategies(op.rule, device_num, allow_repeated, values, mesh)
    if full_only:
        return tuple(s for s in candidates if s.repeat == 1 and device_num > 1) or candidates[:1]
    return candidates


def computed_inputs_only(graph: Graph, op: OpNode, candidates: tuple[Strategy, ...], seen: dict) -> tuple[Strategy, ...]:
    """`candidates` without those summing partial inputs when an input can never be partial
    sums (`can_be_partial`), as in a bias-free row-parallel MatMul feeding a residual Add whose
    other input comes from a Reshape (LLaMA blocks). Such a candidate is fed by a PartialCreate
    of that input (free, `redistribution.moves`), so the filter only keeps candidate sets (and
    plans) as small as they were before that step existed; lifting it is a search decision of
    its own. `seen` carries `can_be_partial`'s answers from op to op."""
    if all(can_be_partial(graph, tensor, seen) for tensor in op.inputs):
        return candidates
    return tuple(strategy for strategy in candidates if not strategy.sums_partials)


def can_be_partial(graph: Graph, tensor: str, seen: dict | None = None) -> bool:
    """Whether some strategy of its producer leaves `tensor` as partial sums: a split reduction
    factor, or a linear op (`LINEAR_OP_TYPES`) summing inputs that can be partial. A parameter,
    graph input or constant is stored whole, never as partial sums. `seen` (tensor -> answer)
    keeps the answers of earlier calls on `graph`: each op asking anew walked the residual
    stream's chain of Adds back to its start (quadratic in the layers: 8 of 250 profiled s at
    126 layers).

    Example:
        >>> from autostrat.frontend import trace
        >>> from autostrat.models import FFN
        >>> from autostrat.nn import Tensor
        >>> graph = trace(FFN(), Tensor(shape=(64, 64)))
        >>> can_be_partial(graph, "dense1.matmul:0"), can_be_partial(graph, "dense1.weight")
        (True, False)
    """
    seen = {} if seen is None else seen
    pending = [tensor]
    while pending:  # depth first without recursion: chains of Adds can be thousands of ops long
        name = pending[-1]
        if name in seen:  # answered by an earlier call
            pending.pop()
            continue
        producer = graph.tensors[name].producer
        op = graph.ops.get(producer) if producer is not None else None
        if op is None or op.rule.reduction or op.op_type not in LINEAR_OP_TYPES:
            seen[name] = op is not None and bool(op.rule.reduction)
            pending.pop()
            continue
        waiting = [t for t in op.inputs if t not in seen]
        if waiting:
            pending.extend(waiting)
            continue
        seen[name] = all(seen[t] for t in op.inputs)
        pending.pop()
    return seen[tensor]


def seeded(op: OpNode, device_num: int) -> tuple[Strategy]:
    return (Strategy.from_tuples(op.rule, op.in_strategy, device_num, op.out_strategy, where=op.name),)


def candidate_mesh(seeds, device_num: int, mesh="auto") -> tuple[int, ...] | None:
    """The axes of `mesh` (`strategies.mesh_axes`) every candidate's device matrix is made of
    (`strategies.on_mesh`); None, any device matrix, without a mesh or when a seed is off it
    (Megatron's TP 4 on 8 x 8 devices), so that its neighbours can still take its layouts."""
    axes = mesh_axes(device_num, mesh)
    if axes is None:
        return None
    if all(on_mesh(seed.splits, seed.repeat, axes) for seed in seeds):
        return axes
    return None


def candidate_values(seeds, device_num: int, mesh="auto") -> frozenset[int] | None:
    """The splits candidates may use on `mesh` (`strategies.mesh_axes`): products of its axes and
    every split the `seeds` (strategies) use; None for every divisor."""
    axes = mesh_axes(device_num, mesh)
    if axes is None:
        return None
    return split_values(axes, frozenset(split for seed in seeds for split in seed.splits))
