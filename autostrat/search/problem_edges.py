"""A search problem's edges (`SearchEdge`): an op's output into another's input, with the cost
table between their candidates (`edge_table`, shared by edges alike), from where an input or
parameter rests (`edge_into`), and a training graph's gradient synchronisation and writeback
edges (`sync_edges`, `writeback_edge`), each weighed once per step.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

from autostrat.autodiff import gradient_name, op_phase
from autostrat.cost import AlphaBeta
from autostrat.ir import Graph
from autostrat.layout import Strategy
from autostrat.redistribution import LazyCostTable
from autostrat.search.optimizer_shard import OptimizerShard, rest_layout, update_layout
from autostrat.search.precision import TensorSizes


@dataclass(frozen=True)
class SearchEdge:
    """Output `output_index` of `producer` feeds input `input_index` of `consumer`.

    `table[i, j]` is the redistribution cost (bytes per device, or nanoseconds) from the
    producer's candidate i to the consumer's candidate j, computed when first read (`table.full()` computes them all;
    edges alike share one table). A parameter or graph input read by several ops is stored as
    its first consumer wants it; each later consumer gets an edge from that first one with
    `from_input` set, `output_index` then being the first consumer's input index.
    """

    tensor: str
    producer: str
    output_index: int
    consumer: str
    input_index: int
    table: LazyCostTable
    from_input: bool = False
    sync: bool = False  # a gradient-synchronisation or writeback edge (training graphs)
    sharding: OptimizerShard | None = None  # from_input: where a parameter at rest is held
    dtype: str = "float32"  # from_input: the tensor's own dtype, whose size the rest layout's threshold counts

    def source_layout(self, strategy: Strategy):
        """The layout the tensor is held in when the producer runs `strategy` (from an input:
        where it rests, `optimizer_shard.rest_layout`)."""
        if self.from_input:
            return rest_layout(self.sharding, strategy, self.output_index, self.dtype)
        return strategy.output_layouts[self.output_index]


def backward_apart(consumer: str, backward_regathers: bool) -> bool:
    """Whether `consumer` reads its inputs apart from the forward's readers: with
    `backward_regathers`, a backward op shares only a backward op's redistribution of a tensor
    (`plan.EdgeRedistribution.shares`), the rule the plan (`plan.build_plan`) and the search's
    objective (`problem.SearchProblem.share_group`) both follow.

    Example:
        >>> backward_apart("bprop/dense1.matmul/mat_mul_1", True), backward_apart("dense1.matmul", True)
        (True, False)
    """
    return backward_regathers and op_phase(consumer) == "backward"


@cache
def edge_table(producer: tuple[Strategy, ...], output_index: int, consumer: tuple[Strategy, ...], input_index: int,
                dtype: str, from_input: bool = False, model: AlphaBeta | None = None,
                sharding: OptimizerShard | None = None, priced: str | None = None, scale: float = 1.0) -> LazyCostTable:
    # Repeated layers have equal rules and candidates, so they share one table: an entry one
    # layer's search computed serves every other layer. `dtype` is the tensor's own (a rest
    # layout's threshold counts it), `priced` what its bytes are priced in (`TensorSizes.priced`).
    if from_input:  # a parameter or graph input, from where its first reader keeps it
        sources = [rest_layout(sharding, s, output_index, dtype) for s in producer]
    else:
        sources = [s.output_layouts[output_index] for s in producer]
    return LazyCostTable(sources, [s.input_layouts[input_index] for s in consumer], priced or dtype, model, scale=scale)


def edge_into(graph: Graph, candidates, tensor: str, consumer: str, index: int, model=None,
               sharding: OptimizerShard | None = None, sizes: TensorSizes | None = None) -> SearchEdge | None:
    """The edge bringing `tensor` to input `index` of `consumer`: from its producer, or from its
    first consumer when it is a parameter or graph input (None for that first consumer itself);
    priced as `sizes` says (None: at its dtype)."""
    dtype = graph.tensors[tensor].dtype
    priced = dtype if sizes is None else sizes.priced(tensor)
    producer = graph.producer(tensor)
    if producer is not None:
        output_index = producer.outputs.index(tensor)
        table = edge_table(candidates[producer.name], output_index, candidates[consumer], index, priced, False, model)
        return SearchEdge(tensor, producer.name, output_index, consumer, index, table)
    owner, owner_index = graph.consumers(tensor)[0]
    if (owner, owner_index) == (consumer, index):
        return None
    table = edge_table(candidates[owner], owner_index, candidates[consumer], index, dtype, True, model, sharding, priced)
    return SearchEdge(tensor, owner, owner_index, consumer, index, table, from_input=True, sharding=sharding, dtype=dtype)


def synced(graph: Graph, parameter: str) -> bool:
    """Whether `parameter`'s gradient is computed (it then has a sync edge)."""
    gradient = gradient_name(parameter)
    return gradient in graph.tensors and graph.producer(gradient) is not None


def sync_edges(graph: Graph, candidates, followers: dict[str, str], model=None,
                sharding: OptimizerShard | None = None, sizes: TensorSizes | None = None, once: float = 1.0) -> list[SearchEdge]:
    """Per update op, an edge from each computed operand of its parameter's shape (the
    gradient) to the parameter's first reader, priced to the layout the parameter is updated
    in: the one it lives in, or with optimizer sharding its shard layout, plus the gather of
    the new value back into the layout it lives in; weighed `once` (`build_problem`)."""
    edges = []
    for parameter in followers.values():
        readers = graph.consumers(parameter)
        if not readers:
            continue  # only its update reads it: it is stored whole, see `follow_parameters`
        owner, owner_index = readers[0]
        gradient = gradient_name(parameter)
        producer = graph.producer(gradient) if gradient in graph.tensors else None
        if producer is None:
            continue
        output_index = producer.outputs.index(gradient)
        dtype = graph.tensors[gradient].dtype
        priced = dtype if sizes is None else sizes.priced(gradient)  # fp16 under fp16, fp32 under bf16
        if sharding is None:
            table = edge_table(candidates[producer.name], output_index, candidates[owner], owner_index, priced, False, model,
                                scale=once)
        else:
            sources = [s.output_layouts[output_index] for s in candidates[producer.name]]
            used = [s.input_layouts[owner_index] for s in candidates[owner]]
            updated = [update_layout(sharding, layout, dtype) for layout in used]
            # At rest (ZeRO-3) a parameter's new value stays in its shard layout: no gather back.
            gathers = [None if new is old or owner_index in s.at_rest else (new, old)
                       for new, old, s in zip(updated, used, candidates[owner])]
            table = LazyCostTable(sources, updated, priced, model, gathers,
                                  None if sizes is None else sizes.priced(parameter), once)
        edges.append(SearchEdge(gradient, producer.name, output_index, owner, owner_index, table, sync=True))
    return edges


def writeback_edge(graph: Graph, candidates, parameter: str, value: str, model=None,
                    sizes: TensorSizes | None = None, once: float = 1.0) -> SearchEdge:
    """The edge from the op computing `parameter`'s next value to the parameter's first consumer
    (once per step: weighed `once`)."""
    producer = graph.producer(value)
    owner, owner_index = graph.consumers(parameter)[0]
    output_index = producer.outputs.index(value)
    table = edge_table(candidates[producer.name], output_index, candidates[owner], owner_index,
                        graph.tensors[value].dtype if sizes is None else sizes.priced(value), False, model, scale=once)
    return SearchEdge(value, producer.name, output_index, owner, owner_index, table, sync=True)
