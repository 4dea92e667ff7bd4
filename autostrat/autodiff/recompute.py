"""Recompute (MindSpore's ``Cell.recompute()``): a cell keeps only its inputs for the backward;
its forward ops run again inside the backward, just before the first backward op needing them.

On a training graph: every forward op of a recomputed cell (an op named ``<cell path>.…``) whose
output a backward op of the same recomputed unit reads (a bprop ``bprop/<op>/…`` of one of its
forward ops) gets a copy ``recompute/<op>``, computing ``recompute/<tensor>`` from the same
inputs (or their recomputed copies, inside the cell), with the same attributes and seed
(Dropout's mask is a function of its seed and element positions, so it is drawn again alike).
The unit's backward ops then read the copies; a backward op outside the unit reads the
original, which its own forward op read and so kept anyway (the next block's input checkpoint):
a copy is made by its unit's backward alone, so no backward waits for another unit's backward
(on another pipeline stage: a dependency no schedule has, which deadlocked interleaved and
zero-bubble schedules). The originals' outputs read by no other unit's backward die at their
last forward reader, so the live activations of the cell between its forward and its backward
are its inputs (and what other units' backward ops read of it); the copies live from their
recomputation to their last backward reader. The copies are placed, in forward order, just
before the first backward op reading any of the unit's copies, so one unit's activations are
rebuilt only when its backward starts.
"""

from __future__ import annotations

from dataclasses import replace

from autostrat.errors import ConfigError
from autostrat.ir import Graph, OpNode

RECOMPUTE_PREFIX = "recompute/"


def in_cell(name: str, cell: str) -> bool:
    """Whether the op `name` belongs to the cell at path `cell` ("" is the whole network), or is
    the op at that path (a primitive marked by ``Primitive.recompute``).

    Example:
        >>> in_cell("blocks.0.ffn1.matmul", "blocks.0"), in_cell("blocks.01.ffn1.matmul", "blocks.0"), in_cell("relu1", "relu1")
        (True, False, True)
    """
    return not cell or name == cell or name.startswith(cell + ".")


def recompute_cells(graph: Graph, cells: tuple[str, ...], forward: set[str]) -> Graph:
    """`graph` (a training graph whose forward ops are `forward`) with the forward ops of `cells`
    recomputed inside the backward (see the module docstring).

    Example:
        >>> from autostrat.autodiff import build_backward
        >>> from autostrat.frontend import trace
        >>> from autostrat.models import FFN
        >>> from autostrat.nn import Tensor
        >>> forward = trace(FFN(), Tensor(shape=(64, 64)))
        >>> again = recompute_cells(build_backward(forward), ("",), set(forward.ops))  # the whole network
        >>> [name for name in again.ops if name.startswith(RECOMPUTE_PREFIX)]  # what dense2's backward reads
        ['recompute/dense1.matmul', 'recompute/dense1.bias_add', 'recompute/relu']
        >>> again.ops["recompute/relu"].outputs, again.consumers("relu:0")
        (('recompute/relu:0',), (('dense2.matmul', 0),))
    """
    units = _units(graph, cells, forward)
    unit_of = {name: cell for cell, inside in units.items() for name in inside}  # forward op -> its unit
    # What each unit's backward reads, once: asked per unit, it scanned every op per unit
    # (quadratic in the layers: 13 of 650 profiled s of a 126-layer estimate).
    read_back: dict[str, set[str]] = {cell: set() for cell in units}
    for name, op in graph.ops.items():
        cell = unit_of.get(_bprop_of(name)) if name not in forward else None
        if cell is not None:
            read_back[cell].update(graph.tensors[tensor].producer for tensor in op.inputs)
    ops_of = {cell: sorted(_copied(graph, inside, read_back[cell]), key=graph.op_index) for cell, inside in units.items()}
    renamed = {tensor: RECOMPUTE_PREFIX + tensor for names in ops_of.values() for name in names for tensor in graph.ops[name].outputs}
    if not renamed:
        return graph
    tensors = dict(graph.tensors)
    for tensor, copy in renamed.items():
        tensors[copy] = replace(graph.tensors[tensor], name=copy, producer=RECOMPUTE_PREFIX + graph.tensors[tensor].producer)
    ops: dict[str, OpNode] = {}
    pending = {cell: _copies(graph, names, renamed) for cell, names in ops_of.items() if names}
    for name, op in graph.ops.items():
        cell = unit_of.get(_bprop_of(name)) if name not in forward else None
        if cell is not None:
            own = {tensor for tensor in op.inputs if tensor in renamed and unit_of.get(graph.tensors[tensor].producer) == cell}
            if own and cell in pending:
                ops.update((copy.name, copy) for copy in pending.pop(cell))  # the unit's copies, before their first reader
            op = replace(op, inputs=tuple(renamed[tensor] if tensor in own else tensor for tensor in op.inputs))
        ops[name] = op
    return Graph(tensors, ops, graph.outputs, graph.name, graph.values, graph.updates)


def _bprop_of(name: str) -> str | None:
    """The forward op whose bprop the backward op `name` belongs to (``bprop/<op>/<kind>``), or
    None (a gradient sum, a parameter's identity: no unit's backward)."""
    return name.removeprefix("bprop/").rpartition("/")[0] if name.startswith("bprop/") else None


def _units(graph: Graph, cells: tuple[str, ...], forward: set[str]) -> dict[str, set[str]]:
    """The recomputed units and their forward ops, each named by one of its cells: a cell with
    the ops inside it (a cell inside another is part of it); marked primitives (a cell that is
    an op) reading one another's outputs form one unit, recomputed back to the first unmarked
    inputs, as MindSpore chains ``Primitive.recompute`` (Megatron's selective recompute of the
    attention core is such a chain).

    Example (the bias add and the ReLU reading it are one unit, recomputed from the matmul's output):
        >>> from autostrat.frontend import trace
        >>> from autostrat.models import FFN
        >>> from autostrat.nn import Tensor
        >>> forward = trace(FFN(), Tensor(shape=(64, 64)))
        >>> {unit: sorted(ops) for unit, ops in _units(forward, ("relu", "dense1.bias_add"), set(forward.ops)).items()}
        {'dense1.bias_add': ['dense1.bias_add', 'relu']}
    """
    cells = tuple(cell for cell in cells if not any(other != cell and in_cell(cell, other) for other in cells))
    parent = {cell: cell for cell in cells}

    def root(cell: str) -> str:
        while parent[cell] != cell:
            cell = parent[cell]
        return cell

    for cell in (cell for cell in cells if cell in forward):
        for tensor in graph.ops[cell].inputs:
            producer = graph.tensors[tensor].producer
            if producer in parent and producer in forward:
                parent[root(cell)] = root(producer)
    units: dict[str, set[str]] = {}
    for cell in cells:
        inside = {name for name in forward if in_cell(name, cell)}
        if not inside:
            raise ConfigError(f"recompute: no forward op belongs to cell {cell!r}")
        units.setdefault(root(cell), set()).update(inside)
    return units


def _copied(graph: Graph, inside: set[str], read_back: set) -> set[str]:
    """The ops of one cell (`inside`) to recompute: producers of tensors a backward op reads
    (`read_back`: every such producer), and the producers of their inputs inside the cell (its
    inputs from outside are kept)."""
    found, stack = set(), [name for name in inside if name in read_back]
    while stack:
        name = stack.pop()
        if name in found:
            continue
        found.add(name)
        stack += [producer for tensor in graph.ops[name].inputs if (producer := graph.tensors[tensor].producer) in inside]
    return found


def _copies(graph: Graph, names: list[str], renamed: dict[str, str]) -> list[OpNode]:
    """The copies of one cell's ops `names`: they read each other's copies, and the cell's
    inputs (computed outside it, recomputed or not) as they are."""
    own = {tensor for name in names for tensor in graph.ops[name].outputs}
    return [replace(graph.ops[name], name=RECOMPUTE_PREFIX + name, outputs=tuple(renamed[t] for t in graph.ops[name].outputs),
                    inputs=tuple(renamed[t] if t in own else t for t in graph.ops[name].inputs)) for name in names]
