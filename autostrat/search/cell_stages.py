"""Pipeline stages from the cells' ``pipeline_stage``, as MindSpore's users mark them: any cells
(``net.layer1.pipeline_stage = 0; net.relu2.pipeline_stage = 1``), not only repeated layers.

Which stage an op of a training graph runs on (MindSpore's pipeline transformer colours the
graph from the marked cells and passes the colours on to the ops they feed; cases):
1. An op inside marked cells runs on the stage of the innermost of them.
2. An unmarked op that reads what staged ops produce runs on the latest of their stages: the
   loss after the last marked cell runs on the last stage, as in MindSpore.
3. An unmarked op no staged op feeds (a flatten before the first marked cell, a label's
   one-hot in the loss) runs on the earliest stage that reads its output, once, and is sent
   on to later stages that read it too (MindSpore's colouring leaves such an op without a
   stage, and its pipeline split keeps it for the stages that use it). One whose output no
   staged op reads runs on the last stage, with the network's outputs.
4. A backward or recomputed op runs on its forward op's stage, an update on the stage of its
   parameter's first reader (`stages.spread_units`); the optimiser's step counters are then
   shared by every stage (`pipeline.shared_update_ops`).

Stages must follow the network's order: every tensor flows from a stage to the same or a later
one (only a marked op can break it: cases 2 and 3 never do), and every stage runs an op. The
stages are the units of the pipeline's split (`stages.UnitCosts`), one unit each.
"""

from __future__ import annotations

from autostrat.autodiff import op_phase
from autostrat.errors import ConfigError
from autostrat.search.stages import spread_units

SHOWN_OPS = 4  # unmarked ops named per stage in a summary before "+ n more"


def holder(op: str, marks: dict[str, int]) -> str | None:
    """The innermost marked cell (its path) holding `op`, None when no marked cell does.

    Example:
        >>> holder("backbone.layer1.matmul", {"backbone": 0, "backbone.layer1": 1}), holder("loss_fn.one_hot", {"backbone": 0})
        ('backbone.layer1', None)
    """
    holding = [path for path in marks if not path or op.startswith(path + ".")]
    return max(holding, key=len) if holding else None


def forward_stages(graph, marks: dict[str, int], stages: int) -> dict[str, int]:
    """The stage of every forward op of `graph` from `marks` (cell path -> ``pipeline_stage``),
    by the cases of the module docstring.

    Example (an FFN and its loss, its two Dense cells marked: the ReLU between them follows
    the first, the loss the second, the label's one-hot the loss that reads it):
        >>> from autostrat import nn
        >>> from autostrat.autodiff import SGD, build_training
        >>> from autostrat.frontend import trace
        >>> from autostrat.models import FFN
        >>> net = nn.WithLossCell(FFN(), nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"))
        >>> graph = build_training(trace(net, nn.Tensor(shape=(8, 64)), nn.Tensor(shape=(8,), dtype="int32")), SGD())
        >>> marks = {"backbone.dense1": 0, "backbone.dense2": 1}
        >>> found = forward_stages(graph, marks, 2)
        >>> found["backbone.relu"], found["backbone.dense2.bias_add"], found["loss_fn.one_hot"], found["loss_fn.reduce_mean"]
        (0, 1, 1, 1)
    """
    forward = [name for name in graph.ops if op_phase(name) == "forward"]
    for path, stage in sorted(marks.items()):
        if stage >= stages:
            raise ConfigError(f"pipeline_stage: cell {path or graph.name} is marked for stage {stage}, but pipeline_stages "
                              f"is {stages} (stages 0 to {stages - 1})")
    found = {name: marks[holder(name, marks)] for name in forward if holder(name, marks) is not None}
    for name in forward:  # in topological order: case 2
        fed = [found[p] for p in _producers(graph, name) if p in found]
        if name not in found and fed:
            found[name] = max(fed)
    for name in reversed(forward):  # consumers first: case 3
        if name not in found:
            read = [found[reader] for reader in _readers(graph, name) if reader in found]
            found[name] = min(read, default=stages - 1)
    _check_order(graph, forward, found, marks, stages)
    return found


def marked_units(graph, marks: dict[str, int], stages: int) -> dict[str, int]:
    """The stage of every op of the training graph `graph` (case 4 for what is not forward).

    Example (the FFN of `forward_stages`):
        >>> from autostrat import nn
        >>> from autostrat.autodiff import SGD, build_training
        >>> from autostrat.frontend import trace
        >>> from autostrat.models import FFN
        >>> net = nn.WithLossCell(FFN(), nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"))
        >>> graph = build_training(trace(net, nn.Tensor(shape=(8, 64)), nn.Tensor(shape=(8,), dtype="int32")), SGD())
        >>> marks = {"backbone.dense1": 0, "backbone.dense2": 1}
        >>> units = marked_units(graph, marks, 2)
        >>> units["bprop/backbone.relu/relu_grad"], units["optimizer/dense1.weight"], units["optimizer/dense2.bias"]
        (0, 0, 1)
    """
    return spread_units(graph, forward_stages(graph, marks, stages), stages - 1)


def stage_cells(graph, marks: dict[str, int], units: dict[str, int], stages: int) -> tuple[str, ...]:
    """Per stage, what runs there in the user's words: its marked cells, then its unmarked
    forward ops (the first `SHOWN_OPS`).

    Example (the FFN of `forward_stages`):
        >>> from autostrat import nn
        >>> from autostrat.autodiff import SGD, build_training
        >>> from autostrat.frontend import trace
        >>> from autostrat.models import FFN
        >>> net = nn.WithLossCell(FFN(), nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"))
        >>> graph = build_training(trace(net, nn.Tensor(shape=(8, 64)), nn.Tensor(shape=(8,), dtype="int32")), SGD())
        >>> marks = {"backbone.dense1": 0, "backbone.dense2": 1}
        >>> stage_cells(graph, marks, marked_units(graph, marks, 2), 2)
        ('backbone.dense1 + unmarked backbone.relu', 'backbone.dense2 + unmarked loss_fn.one_hot, loss_fn.softmax_cross_entropy, loss_fn.reduce_mean')
    """
    cells: list[dict[str, None]] = [{} for _ in range(stages)]
    loose: list[list[str]] = [[] for _ in range(stages)]
    for name in graph.ops:
        if op_phase(name) == "forward":
            path = holder(name, marks)
            if path is None:
                loose[units[name]].append(name)
            else:
                cells[units[name]][path or graph.name] = None
    described = []
    for marked, ops in zip(cells, loose):
        more = f" + {len(ops) - SHOWN_OPS} more" if len(ops) > SHOWN_OPS else ""
        unmarked = f"unmarked {', '.join(ops[:SHOWN_OPS])}{more}" if ops else ""
        described.append(" + ".join(part for part in (", ".join(marked), unmarked) if part))
    return tuple(described)


def _producers(graph, name: str) -> list[str]:
    return [graph.tensors[t].producer for t in graph.ops[name].inputs if graph.tensors[t].producer in graph.ops]


def _readers(graph, name: str) -> list[str]:
    return [reader for output in graph.ops[name].outputs for reader, _ in graph.consumers(output)
            if op_phase(reader) == "forward"]


def _check_order(graph, forward: list[str], found: dict[str, int], marks: dict[str, int], stages: int) -> None:
    """Refuses a tensor flowing to an earlier stage (naming both cells) and a stage with no op."""
    for name in forward:
        for producer in _producers(graph, name):
            if found[producer] > found[name]:
                before, reader = holder(producer, marks), holder(name, marks) or graph.name
                source = f"cell {before or graph.name}" if before is not None else f"op {producer} (unmarked: the stage of what it reads)"
                raise ConfigError(f"pipeline_stage: cell {reader} (stage {found[name]}) reads the output of {source} "
                                  f"(stage {found[producer]}); stages must follow the network's order, a cell's stage at "
                                  f"least the stage of every cell it reads from")
    empty = sorted(set(range(stages)) - set(found.values()))
    if empty:
        raise ConfigError(f"pipeline_stage: no op runs on stage {', '.join(map(str, empty))} of {stages} "
                          f"(pipeline_stages); mark a cell for every stage, in the network's order")

