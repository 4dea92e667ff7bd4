"""The search problem: candidate strategies per op and a cost table per op-to-op edge.

A seeded op has one candidate, its seed. Parameters and graph inputs are not ops: each is
stored in the layout its first consumer wants; every later consumer gets an edge from that
first one.

In a training graph the optimiser's update ops are not searched: each runs in its parameter's
layout (`layout.FollowedStrategy`), so the problem leaves them out and prices, instead, a
gradient-synchronisation edge from each gradient's producer to the parameter's first reader
(the redistribution of the gradient to the layout the parameter is stored in). Any other
updated state (Adam's scalar powers) gets a writeback edge from the op computing its next value
to its first reader.

Costs are in the unit of the cost model: bytes sent per device, or, given the `Hardware`
(``cost_model="time"``), predicted nanoseconds: an op's own cost is then its compute time, plus
that of the optimiser updates that run in the layout it gives a parameter (a replicated weight
is updated whole on every device), and an edge's the α–β time of its fastest redistribution.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from functools import cache

import numpy as np

from autostrat.autodiff import UPDATE_OP_TYPES
from autostrat.cost import AlphaBeta, Hardware, dtype_size, op_cost
from autostrat.cost.ring import ring_nanoseconds
from autostrat.ir import Graph
from autostrat.layout import FollowedStrategy, Layout, Strategy
from autostrat.redistribution import cost_table
from autostrat.search.entry_bounds import entry_bound
from autostrat.search.op_candidates import (HashedTuple, can_be_partial, candidate_mesh, candidate_values, computed_inputs_only, op_candidates,
                                             seeded)
from autostrat.search.optimizer_shard import OptimizerShard, update_layout
from autostrat.search.orders import order_variants
from autostrat.search.precision import TensorSizes
from autostrat.search.problem_edges import SearchEdge, backward_apart, edge_into, sync_edges, synced, writeback_edge
from autostrat.strategies import generate_strategies, split_values

_LAYER = re.compile(r"^(?P<prefix>.+?)\.(?P<index>\d+)\.(?P<rest>.+)$")


def layers_of(names) -> dict[str, dict[int, dict[str, str]]]:
    """The ops among `names` that belong to repeated layers: ``{prefix: {index: {rest: op}}}``.

    Example:
        >>> layers_of(["blocks.0.ffn1.matmul", "blocks.1.ffn1.matmul", "lm_head.matmul"])
        {'blocks': {0: {'ffn1.matmul': 'blocks.0.ffn1.matmul'}, 1: {'ffn1.matmul': 'blocks.1.ffn1.matmul'}}}
    """
    layers: dict[str, dict[int, dict[str, str]]] = {}
    for name in names:
        match = _LAYER.match(name)
        if match:
            layers.setdefault(match["prefix"], {}).setdefault(int(match["index"]), {})[match["rest"]] = name
    return layers


@dataclass(frozen=True)
class OpCosts:
    """Per candidate of one op, per device: its own cost in the objective's unit (`comm`: its
    communication bytes, or its compute and communication nanoseconds), flops and memory."""

    comm: np.ndarray
    flops: np.ndarray
    memory: np.ndarray


@dataclass(frozen=True)
class SearchProblem:
    """`incident[op]`: the edges touching `op`, ordered by the position of the op at their other end."""

    graph: Graph
    device_num: int
    allow_repeated: bool
    candidates: dict[str, tuple[Strategy, ...]]
    edges: tuple[SearchEdge, ...]
    costs: dict[str, OpCosts]
    incident: dict[str, tuple[SearchEdge, ...]]
    state_of: dict[str, str] = field(default_factory=dict)  # optimiser state -> its parameter
    split_values: frozenset[int] | None = None  # the splits candidates may use (`strategies.split_values`)
    mesh: tuple[int, ...] | None = None  # the mesh axes candidates are made of (`candidate_mesh`)
    model: AlphaBeta | None = None  # with cost_model "time": the tables' α–β model (costs are nanoseconds)
    optimizer_shard: OptimizerShard | None = None  # enable_parallel_optimizer: how updates split over replicas
    sizes: TensorSizes | None = None  # bytes per element in its precision (`search.precision`); None: dtypes'
    backward_regathers: bool = False  # backward readers share no forward reader's redistribution (`share_group`)

    def share_group(self, edge: SearchEdge) -> tuple:
        """The readers whose redistributions of one tensor into one layout are one
        (`plan.EdgeRedistribution.shares`): those of `edge`'s tensor and producer; with
        `backward_regathers`, the forward's and the backward's apart (`plan.build_plan`).

        Example:
            >>> from autostrat.autodiff import SGD
            >>> from autostrat.models import tutorial_plan
            >>> problem = build_problem(tutorial_plan(optimizer=SGD()).graph, 8, backward_regathers=True)
            >>> sorted({problem.share_group(edge) for edge in problem.edges if edge.tensor == "relu:0"})
            [('relu:0', 'relu', False), ('relu:0', 'relu', True)]
        """
        return edge.tensor, edge.producer, backward_apart(edge.consumer, self.backward_regathers)

    def update_layout(self, parameter: str, stored: Layout) -> Layout:
        """The layout `parameter`'s update runs in, and its optimiser state is kept in, when
        the parameter is stored in `stored` (`optimizer_shard.OptimizerShard.layout`)."""
        return update_layout(self.optimizer_shard, stored, self.graph.tensors[parameter].dtype)

    @property
    def unit(self) -> str:
        """What the costs count: "bytes" (per device), or "ns" under a time model."""
        return "bytes" if self.model is None else "ns"

    def cost(self, choice: dict[str, int], shared: bool = True) -> int:
        """The cost per device (in `unit`) of a choice: the ops' own costs and every edge's
        entry, as its plan pays it: readers of one tensor that want it in one layout share one
        redistribution (`plan.EdgeRedistribution.shares`), except a parameter kept sharded at
        rest (gathered per reader). With `shared` False, each edge pays its own (a pairwise
        model, an upper bound).

        Example:
            >>> from autostrat.frontend import trace
            >>> from autostrat.models import FFN
            >>> from autostrat.nn import Tensor
            >>> problem = build_problem(trace(FFN(), Tensor(shape=(64, 64)), device_num=8), 8)
            >>> problem.cost({op: 0 for op in problem.candidates})  # all-ones: nothing moves
            0
        """
        total = sum(self.costs[op].comm[index] for op, index in choice.items())
        paid = set()
        for edge in self.edges:
            if shared and not edge.sync and not self._resting(edge, choice):
                wanted = self.candidates[edge.consumer][choice[edge.consumer]].input_layouts[edge.input_index]
                key = (self.share_group(edge), wanted.normalized())
                if key in paid:
                    continue
                paid.add(key)
            total += edge.table[choice[edge.producer], choice[edge.consumer]]
        return int(total)

    def _resting(self, edge: SearchEdge, choice: dict[str, int]) -> bool:
        """Whether `edge` reads a parameter its first reader keeps sharded at rest (ZeRO-3)."""
        return edge.from_input and edge.output_index in self.candidates[edge.producer][choice[edge.producer]].at_rest

    def has_cheaper_edge(self, edge: SearchEdge, producer_choice: int, cost: float) -> bool:
        """Whether a redistribution from the producer's chosen layout to some candidate the
        consumer's rule has, seeded or not, costs less than `cost` (what the edge would cost
        without the consumer's seed). Candidates are priced by their bound (`entry_bounds`),
        least first, and only while it is below `cost`: at 1 024 devices a whole row was 13 of
        the 73 profiled s of DeepSeek-V3's estimate."""
        if cost <= 0:  # no price is negative
            return False
        consumer = self.graph.ops[edge.consumer]
        options = generate_strategies(consumer.rule, self.device_num, self.allow_repeated, self.split_values, self.mesh)
        source = edge.source_layout(self.candidates[edge.producer][producer_choice])
        dtype = (self.sizes or TensorSizes.of(self.graph)).priced(edge.tensor)
        targets = [s.input_layouts[edge.input_index] for s in options]
        normal = source.normalized()  # one object for equal layouts (`normal_form`): the bounds' memo finds it again
        bounds = [entry_bound(normal, target, dtype_size(dtype), self.model) for target in targets]
        for index in sorted(range(len(targets)), key=bounds.__getitem__):
            if bounds[index] >= cost:
                return False
            if cost_table([source], [targets[index]], dtype, self.model)[0, 0] < cost:
                return True
        return False


@cache
def _op_costs(candidates: tuple[Strategy, ...], dtypes: tuple[str, ...], rates: tuple[str, ...],
              hardware: Hardware | None = None) -> OpCosts:
    # `dtypes`: the operands' priced dtypes (bytes); `rates`: those setting the FLOP rate (`TensorSizes`).
    costs = [op_cost(strategy, dtypes) for strategy in candidates]
    if hardware is None:
        own = [c.comm_bytes for c in costs]
    else:  # the compute's time, a ring's sends overlapped with it (edges carry every other message)
        model = hardware.alpha_beta(candidates[0].device_num)
        own = [ring_nanoseconds(s, hardware.compute_nanoseconds(c, rates, candidates[0].rule.op_type), s.ring and dtypes[1], model)
               for s, c in zip(candidates, costs)]
    return OpCosts(
        np.array(own, dtype=float),
        np.array([c.flops_per_device for c in costs], dtype=float),
        np.array([c.memory_bytes_per_device for c in costs], dtype=float),
    )


@cache
def _followed_nanoseconds(rule, layout: Layout, dtypes: tuple[str, ...], rates: tuple[str, ...], hardware: Hardware) -> int:
    """Compute time of an op running in `layout` (an optimiser update, `layout.FollowedStrategy`)."""
    return hardware.compute_nanoseconds(op_cost(FollowedStrategy(rule, layout), dtypes), rates, rule.op_type)


def build_problem(graph: Graph, device_num: int, allow_repeated: bool = False, full_only: bool = False,
                  lazy: bool = True, mesh="auto", hardware: Hardware | None = None,
                  optimizer_shard: OptimizerShard | None = None, precision: str = "fp32",
                  micro_batches: int = 1, backward_regathers: bool = False) -> SearchProblem:
    """Candidates on `mesh` (`candidate_values`), own costs and edge tables of every op and edge
    of `graph`; the tables' entries are computed as the search reads them, or all at once
    without `lazy` (tests compare the two). Costs are bytes, or nanoseconds on `hardware`.
    With `optimizer_shard`, parameters' updates run split over their replicas: gradients are
    priced into the shard layout, and the parameter's first reader pays the gather back. Memory
    counts trained parameters' state, and the costs price every tensor, as `precision` keeps it
    (`search.precision`). A step runs the graph for `micro_batches` micro-batches (a pipeline's
    micro-batch graph) and its updates once: what runs once per step (gradient synchronisation,
    the updates' compute and gathers, writebacks) is weighed ``1 / micro_batches`` against the
    rest, which every micro-batch pays (issue #34's finding 1)."""
    full, sizes = graph, TensorSizes.of(graph, precision)
    graph, followers = searched_graph(graph)
    seeds = {name: seeded(op, device_num) for name, op in graph.ops.items() if op.is_seeded}
    values = candidate_values((seed for seed, in seeds.values()), device_num, mesh)
    axes = candidate_mesh((seed for seed, in seeds.values()), device_num, mesh)
    partial: dict[str, bool] = {}  # `can_be_partial`'s answers, shared by every op
    candidates = {name: seeds.get(name) or computed_inputs_only(graph, op, op_candidates(
        op, device_num, allow_repeated, full_only, values, axes), partial) for name, op in graph.ops.items()}
    candidates = {name: HashedTuple(found) for name, found in
                  _rest_variants(graph, order_variants(graph, candidates), followers, optimizer_shard).items()}
    model = None if hardware is None else hardware.alpha_beta(device_num)
    once = 1.0 / micro_batches  # a per-step cost's weight against a micro-batch's
    costs = _own_costs(full, graph, candidates, followers, hardware, optimizer_shard, device_num, sizes, once)
    edges = []
    for op in graph.ops.values():
        for index, tensor in enumerate(op.inputs):
            edge = edge_into(graph, candidates, tensor, op.name, index, model, optimizer_shard, sizes)
            if edge is not None:
                edges.append(edge)
    edges += sync_edges(graph, candidates, followers, model, optimizer_shard, sizes, once)
    for parameter, value in graph.updates:
        if graph.tensors[value].producer in followers:
            continue
        edge = writeback_edge(graph, candidates, parameter, value, model, sizes, once)
        if edge.producer != edge.consumer:
            edges.append(edge)
        else:  # the op reads and updates its own state: only its own candidate's cost counts
            own = costs[edge.producer]
            costs[edge.producer] = OpCosts(own.comm + np.diagonal(edge.table.full()), own.flops, own.memory)
    if not lazy:
        for edge in edges:
            edge.table.full()
    return SearchProblem(graph, device_num, allow_repeated, candidates, tuple(edges), costs, _incident(graph, edges),
                         optimizer_state(full, followers), values, axes, model, optimizer_shard, sizes, backward_regathers)


def _rest_variants(graph: Graph, candidates, followers: dict[str, str], sharding: OptimizerShard | None):
    """`candidates`, with ZeRO-3 (`OptimizerShard.at_rest`) the first reader of updated
    parameters also offered each of its candidates that shards one of them with those
    parameters at rest (`Strategy.at_rest`), after all the others: a seed stays candidate 0,
    and the propagation's enumeration-order tie-break keeps parameters whole (it rests them
    afterwards only where that costs nothing: `propagate._rest_where_free`)."""
    if sharding is None or not sharding.at_rest:
        return candidates
    first_reads: dict[str, list[int]] = {}
    for parameter in followers.values():
        readers = graph.consumers(parameter)
        if readers:
            first_reads.setdefault(readers[0][0], []).append(readers[0][1])
    result = dict(candidates)
    for op, indices in first_reads.items():
        dtypes = [graph.tensors[tensor].dtype for tensor in graph.ops[op].inputs]
        variants = []
        for strategy in candidates[op]:
            resting = tuple(i for i in sorted(indices)
                            if update_layout(sharding, strategy.input_layouts[i], dtypes[i]) is not strategy.input_layouts[i])
            if resting:
                variants.append(replace(strategy, at_rest=resting))
        result[op] = candidates[op] + tuple(variants)
    return result


def _own_costs(full: Graph, graph: Graph, candidates, followers: dict[str, str], hardware: Hardware | None,
               sharding: OptimizerShard | None, device_num: int, sizes: TensorSizes, once: float = 1.0) -> dict[str, OpCosts]:
    """Every searched op's `OpCosts`; on `hardware`, a parameter's first reader also pays, per
    candidate, the compute of the parameter's update in the layout it runs in. The gather of a
    sharded parameter's new value goes with its gradient's sync edge (`sync_edges`), which
    then costs what the AllReduce it replaces costs: a propagation weighing an op's own cost
    before its gradient's edge would otherwise see only the gather's price. What the update
    adds runs once per step: weighed `once` (`build_problem`)."""
    costs = {}
    for name, op in graph.ops.items():
        operands = op.inputs + op.outputs
        costs[name] = _op_costs(candidates[name], tuple(map(sizes.priced, operands)), sizes.rate_dtypes(operands), hardware)
    model = None if hardware is None else hardware.alpha_beta(device_num)
    for update, parameter in followers.items():
        if not graph.consumers(parameter):
            continue  # only its update reads it: stored whole whatever the choice, a constant
        owner, index = graph.consumers(parameter)[0]
        op = full.ops[update]
        dtypes, rates = tuple(map(sizes.priced, op.inputs + op.outputs)), sizes.rate_dtypes(op.inputs + op.outputs)
        extra = np.zeros(len(candidates[owner]))
        for number, strategy in enumerate(candidates[owner]):
            used = strategy.input_layouts[index]
            updated = update_layout(sharding, used, graph.tensors[parameter].dtype)
            if index in strategy.at_rest or (updated is not used and not synced(graph, parameter)):
                # At rest: its gather for this reader. Else a parameter with no gradient has no
                # sync edge to carry the gather of its new value (`sync_edges`).
                extra[number] += cost_table([updated], [used], sizes.priced(parameter), model)[0, 0]
            if hardware is not None:
                extra[number] += _followed_nanoseconds(op.rule, updated, dtypes, rates, hardware)
        own = costs[owner]
        costs[owner] = OpCosts(own.comm + extra * once, own.flops, own.memory)
    return costs


def optimizer_state(graph: Graph, followers: dict[str, str]) -> dict[str, str]:
    """Each optimiser state tensor an update op reads besides its parameter (moments, shaped
    like it and stored in its layout), mapped to that parameter."""
    state = {}
    for update, parameter in followers.items():
        for tensor in graph.ops[update].inputs:
            info = graph.tensors[tensor]
            if tensor != parameter and info.kind == "parameter" and info.shape == graph.tensors[parameter].shape:
                state[tensor] = parameter
    return state


def searched_graph(graph: Graph) -> tuple[Graph, dict[str, str]]:
    """`graph` without its update ops, and ``{update op: its parameter}``.

    Example:
        >>> from autostrat.autodiff import Momentum, build_training
        >>> from autostrat.frontend import trace
        >>> from autostrat.models import FFN
        >>> from autostrat.nn import Tensor
        >>> core, followers = searched_graph(build_training(trace(FFN(), Tensor(shape=(64, 64))), Momentum()))
        >>> len(core.ops), followers["optimizer/dense1.weight"]
        (11, 'dense1.weight')
    """
    followers = {
        name: op.inputs[0] for name, op in graph.ops.items()
        if op.op_type in UPDATE_OP_TYPES and graph.tensors[op.inputs[0]].kind == "parameter"
    }
    if not followers:
        return graph, {}
    ops = {name: op for name, op in graph.ops.items() if name not in followers}
    return Graph(graph.tensors, ops, graph.outputs, graph.name, graph.values), followers


def _incident(graph: Graph, edges: list[SearchEdge]) -> dict[str, tuple[SearchEdge, ...]]:
    found: dict[str, list[SearchEdge]] = {name: [] for name in graph.ops}
    for edge in edges:
        found[edge.producer].append(edge)
        found[edge.consumer].append(edge)

    def position(op: str, edge: SearchEdge) -> tuple[int, int]:
        other = edge.consumer if edge.producer == op else edge.producer
        return graph.op_index(other), edge.input_index

    return {op: tuple(sorted(edges, key=lambda e: position(op, e))) for op, edges in found.items()}

