"""The traced graph: op nodes, the tensors between them, and the seeds users configured.

Ops are kept in trace order, which is a topological order. Tensors are named: graph inputs by
the `construct` argument name (``x``), parameters by their attribute path (``dense1.weight``),
op outputs by the op name with an output index (``dense1.matmul:0``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any

from autostrat.errors import ConfigError
from autostrat.rules import Rule

if TYPE_CHECKING:
    import networkx as nx

TENSOR_KINDS = ("constant", "input", "output", "parameter")


@dataclass(frozen=True)
class TensorInfo:
    """One tensor of the graph: its global shape, dtype name, and where it comes from."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    kind: str
    producer: str | None = None  # the op that computes it (kind "output")

    def __str__(self) -> str:
        return f"{self.name}: {self.dtype}{list(self.shape)}"


@dataclass(frozen=True)
class OpNode:
    """One op application: its inputs and outputs by tensor name, attributes, rule and seed."""

    name: str
    op_type: str
    attrs: tuple[tuple[str, Any], ...]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    rule: Rule
    in_strategy: tuple | None = None
    out_strategy: tuple | None = None
    source: str = field(default="", compare=False)  # "file:line" of the code that applied it (IR dumps)

    @property
    def attr_dict(self) -> dict[str, Any]:
        return dict(self.attrs)

    @property
    def is_seeded(self) -> bool:
        return self.in_strategy is not None


@dataclass(frozen=True)
class Graph:
    """A traced model. `ops` are in topological (trace) order.

    Example:
        >>> from autostrat.rules import make_rule
        >>> x = TensorInfo("x", (4, 8), "float32", "input")
        >>> relu = OpNode("relu", "ReLU", (), ("x",), ("relu:0",), make_rule("ReLU", [(4, 8)]))
        >>> graph = Graph({"x": x, "relu:0": TensorInfo("relu:0", (4, 8), "float32", "output", "relu")},
        ...               {"relu": relu}, ("relu:0",))
        >>> graph.consumers("x"), graph.producer("relu:0").name
        ((('relu', 0),), 'relu')
    """

    tensors: dict[str, TensorInfo]
    ops: dict[str, OpNode]
    outputs: tuple[str, ...]
    name: str = "graph"
    # Parameter and constant tensors by name; `.asnumpy()` gives (and first makes) their data.
    values: dict = field(default_factory=dict, compare=False, repr=False)
    # A training graph's state updates: (parameter, the tensor holding its value for the next
    # step); MindSpore's Assign, kept out of the ops so the graph stays acyclic.
    updates: tuple[tuple[str, str], ...] = ()
    _consumers: dict = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        consumers: dict[str, list[tuple[str, int]]] = {name: [] for name in self.tensors}
        for op in self.ops.values():
            for index, tensor in enumerate(op.inputs):
                if tensor not in self.tensors:
                    raise ConfigError(f"op {op.name} reads tensor {tensor!r}, which the graph does not have")
                consumers[tensor].append((op.name, index))
        object.__setattr__(self, "_consumers", {k: tuple(v) for k, v in consumers.items()})
        for parameter, value in self.updates:
            kinds = (self.tensors[parameter].kind if parameter in self.tensors else None, self.tensors.get(value))
            if kinds[0] != "parameter" or kinds[1] is None or kinds[1].shape != self.tensors[parameter].shape:
                raise ConfigError(f"update {parameter} <- {value}: expected a parameter and a computed tensor of its shape")

    def producer(self, tensor: str) -> OpNode | None:
        """The op computing `tensor`, None for inputs, parameters and constants."""
        info = self.tensors[tensor]
        return self.ops[info.producer] if info.producer else None

    def consumers(self, tensor: str) -> tuple[tuple[str, int], ...]:
        """``(op name, input index)`` of every use of `tensor`, in op order."""
        return self._consumers[tensor]

    def op_index(self, name: str) -> int:
        return self._order[name]

    @cached_property
    def _order(self) -> dict[str, int]:
        return {name: index for index, name in enumerate(self.ops)}

    @cached_property
    def digraph(self) -> nx.MultiDiGraph:
        """Op-to-op data edges; each edge carries the tensor name and the consumer's input index."""
        import networkx as nx  # here only: nothing on a rank's or the search's path needs it (0.3 s to import)

        graph = nx.MultiDiGraph()
        graph.add_nodes_from(self.ops)
        for op in self.ops.values():
            for index, tensor in enumerate(op.inputs):
                producer = self.tensors[tensor].producer
                if producer is not None:
                    graph.add_edge(producer, op.name, key=f"{tensor}->{index}", tensor=tensor, index=index)
        return graph

    def parameters(self) -> tuple[TensorInfo, ...]:
        return tuple(t for t in self.tensors.values() if t.kind == "parameter")

    def inputs(self) -> tuple[TensorInfo, ...]:
        return tuple(t for t in self.tensors.values() if t.kind == "input")
