"""Per-device memory of a choice of strategies: parameters plus the activations live at the
peak of the graph's topological (trace-order) schedule.

Every tensor's per-device bytes depend on one op's candidate: an op output on its producer's, a
parameter or graph input on its first consumer's (it is stored as that op wants it). An op
output is live from its producer's step to its last consumer's step (to the end for a graph
output); a graph input (the batch) from the first step to its last consumer's, as a rank loads
it before it runs any op and drops it after its last use; parameters, constants and optimiser
state (in its parameter's update layout, split further with optimizer sharding; with a 16-bit
`precision` also the fp32 main copies, `search.precision`) are live throughout; an update's result takes its parameter's place; a parameter at rest (ZeRO-3) is
held shard-sized, and gathered for its first reader while that runs. The peak is reached at a
step where a tensor is produced, so those steps are the only ones to bound.

What a run measures (`runtime.held_memory`, `RankResult.peak_bytes`) is what `buffers.plan_peak`
predicts from the plan: this, less the originals a run drops once a copy has been made, plus
the copies a redistribution writes in its consumer's layout (and its steps' intermediates).
Whether a copy exists depends on the strategies of both ends of an edge, which a form over one
op's candidates cannot see; counting one for every candidate of every consumer over-counted the
shipped configs' peaks by 6-10 % (their runs hold few copies at their peak), so the forms leave
them out and the search checks the plan's exact peak against a budget afterwards
(`search.search`), solving again under a tighter one when copies push it over.

What that costs, measured (`benchmarks/quality.py`'s 7b row refined for time, 64 devices): the
first solve's optimum peaks at 66.4 GB against a budget of 64.0 GB, 15.2 GB above what these
forms count, and a second solve follows (3.8 s; 20-28 s before `sharing.merged_fanouts`). At
that peak 66 copies hold 17.7 GB, 65 of them the LayerNorm outputs gathered for the QKV, first
FFN and output matmuls (268 MB each), which the backward reads again (`Edge.shares`), so they
live from the forward matmul to its gradient. Such a copy depends on one edge's pair of
candidates: a term on that edge's pair variable in every step it spans would let one solve see it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from autostrat.search.optimizer_shard import rest_layout
from autostrat.search.precision import TensorSizes
from autostrat.search.problem import SearchProblem


@dataclass(frozen=True)
class TensorBytes:
    """Per candidate of `owner`, the bytes one device holds of `tensor`."""

    tensor: str
    owner: str
    bytes: tuple[int, ...]
    at: str = ""  # a copy (redistributed, or a ZeRO-3 gather): live only while this op runs


def tensor_bytes(problem: SearchProblem) -> tuple[list[TensorBytes], list[TensorBytes]]:
    """(always-live parameters, constants and state; op outputs and graph inputs), with their
    per-candidate bytes."""
    graph = problem.graph
    sizes = problem.sizes or TensorSizes.of(graph)
    resident, activations = [], []
    for name, info in graph.tensors.items():
        size = sizes(name)
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
            if name in problem.state_of:
                layouts = [problem.update_layout(stored_as, s.input_layouts[index]) for s in problem.candidates[owner]]
            else:  # where it rests: where its first reader uses it, or with ZeRO-3 maybe its shard layout
                layouts = [rest_layout(problem.optimizer_shard, s, index, info.dtype) for s in problem.candidates[owner]]
            held = activations if info.kind == "input" else resident  # a batch is dropped after its last use
            held.append(TensorBytes(name, owner, tuple(math.prod(l.slice_shape) * size for l in layouts)))
            if name not in problem.state_of:
                activations += _gathered_copy(problem, name, owner, index, size)
            if sizes.main_bytes and name in sizes.parameters:  # its fp32 main copies, split like its optimiser state
                layouts = [problem.update_layout(name, s.input_layouts[index]) for s in problem.candidates[owner]]
                resident.append(TensorBytes(name, owner, tuple(math.prod(l.slice_shape) * sizes.main_bytes for l in layouts)))
    return resident, activations


def _gathered_copy(problem: SearchProblem, parameter: str, owner: str, index: int, size: int) -> list[TensorBytes]:
    """A parameter at rest (ZeRO-3) is gathered for each op reading it: for its first reader,
    the copy of its used slice while it runs, when it keeps the parameter at rest. (A later
    reader's copy is a redistribution like any other, which the forms leave out: see the module.)"""
    whole = [math.prod(s.input_layouts[index].slice_shape) * size if index in s.at_rest else 0 for s in problem.candidates[owner]]
    return [TensorBytes(parameter, owner, tuple(whole), at=owner)] if any(whole) else []


def model_state_bytes(problem: SearchProblem, choice: dict[str, int]) -> int:
    """Per device, the bytes a choice keeps of the trained parameters, their gradients, their
    optimiser state and (16-bit precisions) their fp32 main copies: what Megatron-LM's
    distributed optimizer table counts per parameter (`search.precision`).

    Example (the tutorial FFN's Adam step, whole on every device: 8 320 parameters, 16 bytes each):
        >>> from autostrat.autodiff import Adam, build_training
        >>> from autostrat.frontend import trace
        >>> from autostrat.models import FFN
        >>> from autostrat.nn import Tensor
        >>> from autostrat.search.problem import build_problem
        >>> problem = build_problem(build_training(trace(FFN(), Tensor(shape=(64, 64))), Adam()), 1)
        >>> model_state_bytes(problem, dict.fromkeys(problem.candidates, 0))
        133120
    """
    sizes = problem.sizes or TensorSizes.of(problem.graph)
    resident, activations = tensor_bytes(problem)
    counted = [item for item in resident if item.tensor in sizes.parameters or item.tensor in problem.state_of]
    counted += [item for item in activations if item.tensor in sizes.gradients and not item.at]
    return sum(item.bytes[choice[item.owner]] for item in counted)


def resident_floor(problem: SearchProblem) -> int:
    """The fewest bytes a device needs for the parameters, constants and optimiser state alone,
    over every choice: no budget below it can fit, so the search never asks for one.

    Example (the tutorial FFN's two weights and two biases, split at most 8 ways):
        >>> from autostrat.frontend import trace
        >>> from autostrat.models import FFN
        >>> from autostrat.nn import Tensor
        >>> from autostrat.search.problem import build_problem
        >>> resident_floor(build_problem(trace(FFN(), Tensor(shape=(64, 64)), device_num=8), 8))
        4160
    """
    resident, _ = tensor_bytes(problem)
    return sum(min(item.bytes) for item in resident)


def spans(problem: SearchProblem, activations: list[TensorBytes]) -> list[tuple[int, int]]:
    """Per activation, the first and last step (op index) it is live at, both included (a graph
    input from the first step: a rank loads it before it runs any op)."""
    graph = problem.graph
    result = []
    for item in activations:
        if item.at:
            result.append((graph.op_index(item.at),) * 2)
            continue
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
    return base + _live_peak(problem, activations, [item.bytes[choice[item.owner]] for item in activations])[0]


@dataclass(frozen=True)
class PeakFloor:
    """The fewest bytes any choice's per-op peak (`peak_bytes`) can have, and the op whose step
    reaches it: every tensor at its smallest over its owner's candidates, each on its own (a
    relaxation: one op's candidate sizes several tensors, so no choice need reach it)."""

    bytes: int
    at: str

    def refusal(self, budget: int) -> str:
        """Why no choice fits `budget` bytes per device (the floor is over it)."""
        return (f"no choice of strategies fits max_device_memory = {budget:,} bytes per device: the parameters, "
                f"optimiser state and the tensors live at {self.at}, each at its smallest over its candidates, "
                f"need {self.bytes:,} bytes per device (the search's per-op memory model, before any cost table "
                f"is priced). Recompute, optimizer_level level3 or pipeline_stages may fit")


def peak_floor(problem: SearchProblem) -> PeakFloor:
    """The `PeakFloor` of `problem`: no budget below it can fit, so a search under one refuses
    before pricing a cost table (the solver's memory constraints, the same per-op model, could
    only prove it infeasible).

    Example (the tutorial FFN on 8 devices: at least 1/8 of every tensor):
        >>> from autostrat.frontend import trace
        >>> from autostrat.models import FFN
        >>> from autostrat.nn import Tensor
        >>> from autostrat.search.problem import build_problem
        >>> problem = build_problem(trace(FFN(), Tensor(shape=(64, 64)), device_num=8), 8)
        >>> floor = peak_floor(problem)
        >>> floor.bytes <= peak_bytes(problem, {op: 0 for op in problem.candidates}), floor.at
        (True, 'dense1.matmul')
    """
    resident, activations = tensor_bytes(problem)
    peak, step = _live_peak(problem, activations, [min(item.bytes) for item in activations])
    ops = list(problem.graph.ops)
    return PeakFloor(sum(min(item.bytes) for item in resident) + peak, ops[min(step, len(ops) - 1)])


def _live_peak(problem: SearchProblem, activations: list[TensorBytes], sizes: list[int]) -> tuple[int, int]:
    """The most bytes live at once of `activations` at `sizes` (each while `spans` says), over
    the steps that produce a tensor, and the first such step."""
    # Live bytes per step as a running sum: +bytes where a tensor starts, -bytes after its end
    # (linear in the tensors; listing each step's live set grows with their product).
    change = [0] * (len(problem.graph.ops) + 2)
    starts = set()
    for size, (start, end) in zip(sizes, spans(problem, activations)):
        change[start] += size
        change[end + 1] -= size
        starts.add(start)
    live, peak, at = 0, 0, 0
    for step, delta in enumerate(change):
        live += delta
        if step in starts and live > peak:
            peak, at = live, step
    return peak, at
