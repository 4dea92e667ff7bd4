"""Per-device memory of a choice of strategies: parameters plus the activations live at the
peak of the graph's topological (trace-order) schedule.

Every tensor's per-device bytes depend on one op's candidate: an op output on its producer's, a
parameter or graph input on its first consumer's (it is stored as that op wants it). An op
output is live from its producer's step to its last consumer's step (to the end for a graph
output); a graph input (the batch) from the first step to its last consumer's, as a rank loads
it before it runs any op and drops it after its last use; parameters, constants and optimiser
state (in its parameter's update layout, split further with optimizer sharding) are live
throughout; an update's result takes its parameter's place. The peak is reached at a step where
a tensor is produced, so those steps are the only ones to bound.

What a run measures (`runtime.executor`, `RankResult.peak_bytes`) is this schedule on every
rank, plus what the model cannot price per op: a tensor's redistributed copy, whose existence
depends on the strategies of both its producer and its consumer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from autostrat.cost import dtype_size
from autostrat.search.problem import SearchProblem


@dataclass(frozen=True)
class TensorBytes:
    """Per candidate of `owner`, the bytes one device holds of `tensor`."""

    tensor: str
    owner: str
    bytes: tuple[int, ...]


def tensor_bytes(problem: SearchProblem) -> tuple[list[TensorBytes], list[TensorBytes]]:
    """(always-live parameters, constants and state; op outputs and graph inputs), with their
    per-candidate bytes."""
    graph = problem.graph
    resident, activations = [], []
    for name, info in graph.tensors.items():
        size = dtype_size(info.dtype)
        if info.producer is not None:
            if info.producer not in graph.ops:
                continue  # an update's result: it replaces its parameter or state in place
            owner, index = info.producer, graph.ops[info.producer].outputs.index(name)
            layouts = [s.output_layouts[index] for s in problem.candidates[owner]]
            activations.append(TensorBytes(name, owner, tuple(math.prod(l.slice_shape) * size for l in layouts)))
            continue
        # Optimiser state is kept in its parameter's update layout (the parameter's own layout,
        # which the first reader chooses, or with optimizer sharding its shard layout).
        stored_as = problem.state_of.get(name, name)
        if graph.consumers(stored_as):
            owner, index = graph.consumers(stored_as)[0]
            layouts = [s.input_layouts[index] for s in problem.candidates[owner]]
            if name in problem.state_of:
                layouts = [problem.update_layout(stored_as, layout) for layout in layouts]
            held = activations if info.kind == "input" else resident  # a batch is dropped after its last use
            held.append(TensorBytes(name, owner, tuple(math.prod(l.slice_shape) * size for l in layouts)))
    return resident, activations


def spans(problem: SearchProblem, activations: list[TensorBytes]) -> list[tuple[int, int]]:
    """Per activation, the first and last step (op index) it is live at, both included (a graph
    input from the first step: a rank loads it before it runs any op)."""
    graph = problem.graph
    result = []
    for item in activations:
        start = 0 if graph.tensors[item.tensor].producer is None else graph.op_index(item.owner)
        uses = [graph.op_index(op) for op, _ in graph.consumers(item.tensor)]
        end = len(graph.ops) if item.tensor in graph.outputs or not uses else max(uses)
        result.append((start, end))
    return result


def live_sets(problem: SearchProblem, activations: list[TensorBytes]) -> list[tuple[int, ...]]:
    """For every step that produces a tensor, the indices (into `activations`) live there
    (duplicates dropped)."""
    intervals = spans(problem, activations)
    steps = sorted({start for start, _ in intervals})
    return sorted({tuple(i for i, (start, end) in enumerate(intervals) if start <= step <= end) for step in steps})


def peak_bytes(problem: SearchProblem, choice: dict[str, int]) -> int:
    """The per-device peak of a choice (what the solver's memory constraints bound).

    Example:
        >>> from autostrat.frontend import trace
        >>> from autostrat.models import FFN
        >>> from autostrat.nn import Tensor
        >>> from autostrat.search.problem import build_problem
        >>> problem = build_problem(trace(FFN(), Tensor(shape=(64, 64)), device_num=8), 8)
        >>> peak_bytes(problem, {op: 0 for op in problem.candidates})  # all-ones: everything whole
        66048
    """
    resident, activations = tensor_bytes(problem)
    base = sum(item.bytes[choice[item.owner]] for item in resident)
    # Live bytes per step as a running sum: +bytes where a tensor starts, -bytes after its end
    # (linear in the tensors; listing each step's live set grows with their product).
    change = [0] * (len(problem.graph.ops) + 2)
    starts = set()
    for item, (start, end) in zip(activations, spans(problem, activations)):
        size = item.bytes[choice[item.owner]]
        change[start] += size
        change[end + 1] -= size
        starts.add(start)
    live, peak = 0, 0
    for step, delta in enumerate(change):
        live += delta
        if step in starts:
            peak = max(peak, live)
    return base + peak
