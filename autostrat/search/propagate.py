"""Choosing a strategy for every op: BFS sharding propagation, and the simpler modes.

Propagation (MindSpore's sharding_propagation), case by case:

- seeds keep their strategy and are never overwritten;
- a queue starts with the seeds in graph (topological) order; popping an op visits the ops it
  shares an edge with, in graph order; each one not yet decided takes the candidate with the
  smallest key ``(redistribution bytes to every decided neighbour + own communication, flops,
  outer factors split first)`` and joins the queue, its origin "propagated from" the popped op;
- layers follow their seeds: when some layers of a `CellList` (ops named ``<prefix>.<i>.<rest>``)
  are seeded, every unseeded layer with the same ops (same rules) takes the strategies the first
  such seeded layer ends up with, its origin "follows <that op>" (`follow_layers=False` turns
  this off). The seeded layer is propagated first, without entering its followers;
- the forward pass is propagated before the backward one, over forward edges only; backward
  ops then take, in data-flow order (the gradient's order), the cheapest candidate given every
  decided neighbour: their forward op's saved tensors and weights, the gradients already
  computed, the gradient synchronisation to where each weight is stored, and where each
  activation gradient is going (the layout its forward consumer read the activation in), and
  each part of a parameter read twice (a tied table), where its first reader reads it. That
  is the strategy the forward op implies (Megatron's backward of a column-parallel MatMul: a
  partial input gradient, AllReduced) unless another is cheaper;
- the edges between two readers of one parameter or graph input are priced when choosing, but
  do not carry the propagation: a weight read by a forward and a backward op would otherwise
  hand its layout across the graph, far from the data flow the seeds describe; nor do the
  gradient-synchronisation edges of a training graph, until a last round from every decided
  op reaches what the data edges did not;
- ops no seed reaches get the all-ones strategy and a warning (none for an op with no other
  candidate, such as a scalar's);
- two adjacent seeds keep their strategies and get a redistribution on their edge; when it costs
  more than feeding the best candidate of the consumer would (their layouts disagree, beyond
  resolving a partial sum), a warning says so, unless the seeds come from one saved plan.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, replace
from functools import cache

import numpy as np

from autostrat.autodiff import gradient_name, op_phase
from autostrat.autodiff.recompute import RECOMPUTE_PREFIX
from autostrat.layout import Strategy
from autostrat.layout.nd_tp import gathers_by_design
from autostrat.search.candidate_prices import ColumnTerm, DestinationTerm, RowTerm, choice_key, total_cost
from autostrat.search.op_candidates import output_layouts, wanted_positions
from autostrat.search.precision import TensorSizes
from autostrat.search.problem import SearchProblem, layers_of

GRADIENT_PREFIX = gradient_name("")

SEED, DEFAULT, DATA_PARALLEL = "seed", "default", "data parallel"


@dataclass(frozen=True)
class Assignment:
    """A candidate index per op, where each choice came from, and what the user should know."""

    choice: dict[str, int]
    origin: dict[str, str]
    warnings: tuple[str, ...]


def _neighbour_terms(problem: SearchProblem, op: str, choice: dict[str, int], sync: bool) -> list:
    """One term per edge to a decided neighbour (over gradient-synchronisation edges too when
    `sync`): its redistribution bytes per candidate (`candidate_prices`)."""
    terms = []
    for edge in problem.incident[op]:
        if edge.sync and not sync:
            continue
        if edge.consumer == op and edge.producer in choice:
            terms.append(_row_term(problem, edge, choice))
        elif edge.producer == op and edge.consumer in choice:
            terms.append(ColumnTerm(edge.table, choice[edge.consumer]))
    return terms


def _row_term(problem: SearchProblem, edge, choice: dict[str, int]) -> RowTerm:
    paid = _paid_for(problem, edge, choice)
    free = None
    if paid:  # another reader already has the tensor redistributed to these layouts
        candidates = problem.candidates[edge.consumer]
        free = np.zeros(len(candidates), dtype=bool)
        positions = wanted_positions(candidates, edge.input_index)
        for layout in paid:
            free[positions.get(layout, [])] = True
    return RowTerm(edge.table, choice[edge.producer], free)


def _paid_for(problem: SearchProblem, edge, choice: dict[str, int]) -> set:
    """The layouts (normal forms) the decided other readers of `edge`'s tensor want it in: one
    redistribution per tensor and layout serves them all (`plan.EdgeRedistribution.shares`)."""
    paid, group = set(), problem.share_group(edge)
    for other in problem.incident[edge.producer]:
        if (other.consumer != edge.consumer and other.consumer in choice and not other.sync
                and problem.share_group(other) == group):
            strategy = problem.candidates[other.consumer][choice[other.consumer]]
            paid.add(strategy.input_layouts[other.input_index].normalized())
    return paid


TIE_BREAKS = ("memory", "outer")


def best_candidate(problem: SearchProblem, op: str, choice: dict[str, int], sync: bool = True,
                   extra: tuple = (), tie_break: str = "memory", memo: dict | None = None) -> int:
    """The cheapest candidate: bytes (to decided neighbours; over gradient-synchronisation edges
    too unless `sync` is False; plus the `extra` terms, see `candidate_prices.total_cost`), then flops, then as `tie_break`
    says: "memory" (fewer bytes held, then enumeration order) or "outer" (`outer_first`). With
    `memo`, an answer is remembered by everything it depends on (`candidate_prices.choice_key`):
    the same op of repeated layers is priced once where its neighbours chose alike (DeepSeek-V3's
    recipe: 2 240 of 10 836 choices priced, its propagation 4.7 s to 4.1 s profiled; the tables'
    own memos had most of the rest)."""
    terms = _neighbour_terms(problem, op, choice, sync) + list(extra)
    candidates, costs = problem.candidates[op], problem.costs[op]
    key = None if memo is None else choice_key(candidates, costs, terms, tie_break)
    if key is not None and key in memo:
        return memo[key]
    total = total_cost(costs.comm, terms)
    ties = (np.arange(len(candidates)), costs.memory) if tie_break == "memory" else (outer_first(candidates),)
    found = int(np.lexsort((*ties, costs.flops, total))[0])
    if memo is not None:
        memo[key] = found
    return found


@cache
def outer_first(candidates: tuple) -> np.ndarray:
    """Per candidate, its rank when the splits of the outer factors (a batch or sequence dim
    comes first) decide, largest first, then enumeration order."""
    order = sorted(range(len(candidates)), key=lambda i: tuple(-split for split in candidates[i].splits))
    ranks = np.empty(len(candidates), dtype=int)
    ranks[order] = np.arange(len(candidates))
    return ranks


def _seeds(problem: SearchProblem) -> list[str]:
    return [name for name, op in problem.graph.ops.items() if op.is_seeded]


def propagate(problem: SearchProblem, progress=None, follow_layers: bool = True,
              seeds_from_one_plan: bool = False) -> Assignment:
    """BFS from the seeds (see the module docstring), once per tie-break of equally cheap
    candidates (`TIE_BREAKS`); the cheaper plan wins, the first on a tie. With `follow_layers`
    and layers to follow, also without following them: copying a seeded layer's strategies is
    a start the search may leave, never a constraint (a forward-only `TransformerStack` of 96
    blocks, hidden 1024, on 8 devices, block 0 seeded TP 4 x DP 2: 2 006 MB per device
    following it, 13.6 MB without; `benchmarks/optimal.py`).

    Why two: a tie decided locally shows its price only ops later. After a row-parallel MatMul
    a ReduceScatter may split the hidden dim (holding less of the bias) or the rows (the
    sequence, which LayerNorm can keep); the first wins on the tutorial FFN's backward, the
    second on a transformer block's (Megatron's sequence parallelism). `progress.step` hears
    of every op reached (`progress.SearchProgress`).
    """
    follows = (True, False) if follow_layers and seeded_layers(problem) else (False,)
    memo = {}
    plans = [_propagate(problem, progress, follow, tie_break, seeds_from_one_plan, memo)
             for follow in follows for tie_break in TIE_BREAKS]
    return min(plans, key=lambda plan: problem.cost(plan.choice, shared=True))


def _propagate(problem: SearchProblem, progress, follow_layers: bool, tie_break: str,
               seeds_from_one_plan: bool = False, memo: dict | None = None) -> Assignment:
    seeds = _seeds(problem)
    choice = {name: 0 for name in seeds}
    origin = {name: SEED for name in seeds}
    ops = problem.graph.ops
    forward = {name for name in ops if op_phase(name) == "forward"}
    leaders = seeded_layers(problem) if follow_layers else {}
    walk = _Walk(problem, choice, origin, tie_break, progress, memo)
    walk.visit(seeds, forward - leaders.keys())
    for follower, leader in leaders.items():
        if leader in choice:
            _follow(problem, choice, origin, follower, leader)
    walk.visit([name for name in ops if name in choice], forward)
    walk.backward()
    if any(edge.sync for edge in problem.edges):
        walk.visit([name for name in ops if name in choice], set(ops), across_sync=True)
    return _finish(problem, choice, origin, seeds_from_one_plan)


@dataclass
class _Walk:
    """The rounds of one propagation, sharing its choices, origins and tie-break."""

    problem: SearchProblem
    choice: dict[str, int]
    origin: dict[str, str]
    tie_break: str
    progress: object = None
    memo: dict | None = None  # `best_candidate`'s answers, shared by the propagations of one problem

    def visit(self, start: list[str], allowed: set[str], across_sync: bool = False) -> None:
        """One BFS round from `start` that decides only `allowed` ops; the last round of a
        training graph also crosses gradient-sync edges, reaching the backward ops no data edge
        leads to (a bias gradient of the sensitivity)."""
        problem, choice = self.problem, self.choice
        queue = deque(start)
        while queue:
            current = queue.popleft()
            for edge in problem.incident[current]:
                neighbour = edge.consumer if edge.producer == current else edge.producer
                if neighbour in choice or neighbour not in allowed or edge.from_input or (edge.sync and not across_sync):
                    continue
                choice[neighbour] = best_candidate(problem, neighbour, choice, tie_break=self.tie_break, memo=self.memo)
                self.origin[neighbour] = f"propagated from {current}"
                queue.append(neighbour)
                self._reached()

    def backward(self) -> None:
        """Each backward op not yet decided, in data-flow order, given every decided neighbour
        and where the activation gradients it computes are going. An op storing a tensor other
        backward ops read too (the sensitivity) comes after them, so that it stores the tensor
        where they can all read it."""
        problem, choice = self.problem, self.choice
        for name in problem.graph.ops:  # a recomputed forward op runs as it did in the forward
            forward = name.removeprefix(RECOMPUTE_PREFIX)
            if forward != name and name not in choice and forward in choice:
                _follow(problem, choice, self.origin, name, forward)
        backward = [name for name in problem.graph.ops if name not in choice and op_phase(name) == "backward"]
        stores = [name for name in backward if _stores_shared_input(problem.graph, name)]
        for name in [name for name in backward if name not in stores] + stores:
            extra = _gradient_destinations(problem, name, choice)
            choice[name] = best_candidate(problem, name, choice, extra=extra, tie_break=self.tie_break, memo=self.memo)
            self.origin[name] = f"backward of {_forward_op(problem.graph, name)}"
            self._reached()

    def _reached(self) -> None:
        if self.progress is not None:
            what = "propagating" if self.tie_break == TIE_BREAKS[0] else f"propagating ({self.tie_break} tie-break)"
            self.progress.step(what, len(self.choice), len(self.problem.graph.ops))


def seeded_layers(problem: SearchProblem) -> dict[str, str]:
    """``{op of an unseeded layer: the same op of the first seeded layer it repeats}``.

    Layers are the ``<prefix>.<i>.<rest>`` forward ops of a `CellList`; an unseeded layer
    repeats a seeded one when both have the same ops with the same rules.
    """
    layers = layers_of(name for name in problem.graph.ops if op_phase(name) == "forward")
    ops = problem.graph.ops
    leaders = {}
    for by_index in layers.values():
        seeded = [layer for _, layer in sorted(by_index.items()) if any(ops[name].is_seeded for name in layer.values())]
        for layer in by_index.values():
            if layer in seeded:
                continue
            leader = next((first for first in seeded if _repeats(problem, first, layer)), None)
            if leader is not None:
                leaders.update({name: leader[rest] for rest, name in layer.items()})
    return leaders


def _repeats(problem: SearchProblem, first: dict[str, str], other: dict[str, str]) -> bool:
    ops = problem.graph.ops
    return first.keys() == other.keys() and all(ops[first[rest]].rule == ops[other[rest]].rule for rest in first)


def _follow(problem: SearchProblem, choice: dict[str, int], origin: dict[str, str], follower: str, leader: str) -> None:
    """`follower` takes `leader`'s strategy, when it is one of its candidates (the logical mesh
    may not offer a propagated strategy's splits to an op of another layer)."""
    strategy = problem.candidates[leader][choice[leader]]
    candidates = problem.candidates[follower]
    if strategy in candidates:
        choice[follower], origin[follower] = candidates.index(strategy), f"follows {leader}"


def _forward_op(graph, name: str) -> str:
    """The forward op a backward op belongs to (its bprop's scope, or what produced the tensor
    whose gradients it accumulates)."""
    kind, _, rest = name.partition("/")
    if kind == "bprop":
        return rest.rsplit("/", 1)[0]
    tensor = rest.rsplit("_", 1)[0] if kind == "accumulate" and rest not in graph.tensors else rest
    producer = graph.tensors[tensor].producer if tensor in graph.tensors else None
    return producer or tensor


def _gradient_destinations(problem: SearchProblem, op: str, choice: dict[str, int]) -> list:
    """Terms (see `candidate_prices.total_cost`) pricing, per candidate of `op`, the bytes that bring each
    activation gradient it outputs, and each part of a parameter's gradient an accumulate op
    sums (a tied table's lookup and LM head), to the layout its first forward reader read the
    activation (the parameter) in. A weight gradient of one part is priced by the gradient-
    synchronisation edges instead; a part's goes to the accumulate op, decided later (without
    the term a lookup's gradient kept the whole vocabulary, partial, where gathering its input
    gives each device its own rows: Megatron's VocabParallelEmbedding)."""
    graph, terms = problem.graph, []
    for index, tensor in enumerate(graph.ops[op].outputs):
        parameter = _accumulated_parameter(graph, tensor)
        target = parameter or tensor.removeprefix(GRADIENT_PREFIX)
        if parameter is None and (target == tensor or target not in graph.tensors or graph.tensors[target].kind == "parameter"):
            continue
        reader = next(((r, i) for r, i in graph.consumers(target) if op_phase(r) == "forward" and r in choice), None)
        if reader is not None:
            wanted = problem.candidates[reader[0]][choice[reader[0]]].input_layouts[reader[1]]
            dtype = (problem.sizes or TensorSizes.of(graph)).priced(tensor)
            terms.append(DestinationTerm(output_layouts(problem.candidates[op], index), wanted, dtype, problem.model))
    return terms


def _accumulated_parameter(graph, tensor: str) -> str | None:
    """The parameter whose gradient an accumulate op reading `tensor` sums (`accumulate/<name>`,
    a suffix ``_<k>`` from the third part on), or None."""
    for consumer, _ in graph.consumers(tensor):
        kind, _, rest = consumer.partition("/")
        target = rest if rest in graph.tensors else rest.rsplit("_", 1)[0]
        if kind == "accumulate" and target in graph.tensors and graph.tensors[target].kind == "parameter":
            return target
    return None


def _stores_shared_input(graph, op: str) -> bool:
    """Whether `op` is the first reader, which stores it, of a tensor no op computes (the
    sensitivity, a graph input) that other ops read too."""
    return any(graph.tensors[t].producer is None and graph.consumers(t)[0] == (op, i) and len(graph.consumers(t)) > 1
               for i, t in enumerate(graph.ops[op].inputs))


def _finish(problem: SearchProblem, choice: dict[str, int], origin: dict[str, str],
            seeds_from_one_plan: bool = False) -> Assignment:
    """`choice` completed (unreached ops: the all-ones strategy), with the warnings a person
    should see; seeds read from one saved plan (a strategy checkpoint) are not said to disagree,
    as a redistribution between two of them was in that plan too."""
    warnings = []
    unreached = [name for name in problem.graph.ops if name not in choice]
    for name in unreached:
        choice[name], origin[name] = 0, DEFAULT  # candidate 0 is the all-ones strategy
    unreached = [name for name in unreached if len(problem.candidates[name]) > 1]  # scalars: nothing to choose
    if unreached:
        warnings.append(f"{len(unreached)} op(s) reached by no seed keep the all-ones strategy: {', '.join(unreached)}")
    for edge in () if seeds_from_one_plan else problem.edges:
        if origin[edge.producer] == SEED and origin[edge.consumer] == SEED and not gathers_by_design(edge.producer, edge.consumer):
            cost = edge.table[choice[edge.producer], choice[edge.consumer]]
            if problem.has_cheaper_edge(edge, choice[edge.producer], cost):
                warnings.append(
                    f"seeds of {edge.producer} and {edge.consumer} disagree on {edge.tensor}: "
                    f"a redistribution of {cost:.0f} {problem.unit} per device is inserted"
                )
    _rest_where_free(problem, choice, origin)
    ordered = {name: choice[name] for name in problem.graph.ops}
    return Assignment(ordered, {name: origin[name] for name in ordered}, tuple(warnings))


def _rest_where_free(problem: SearchProblem, choice: dict[str, int], origin: dict[str, str]) -> None:
    """With ZeRO-3 (`optimizer_shard`): an op keeps the parameters it reads first at rest
    (`Strategy.at_rest`, the same strategy otherwise) where that costs nothing more on its own
    and its edges: a weight read once (no input gradient reads it again) is gathered before its
    use instead of after its update, for the same bytes, and held shard-sized."""
    for op, candidates in problem.candidates.items():
        chosen = candidates[choice[op]]
        if chosen.at_rest:
            continue
        for index in range(len(candidates) - 1, -1, -1):  # the variants come last
            variant = candidates[index]
            if not variant.at_rest:
                break
            if replace(variant, at_rest=()) == chosen:  # the same strategy but where its parameters rest
                if _local_cost(problem, choice, op, index) <= _local_cost(problem, choice, op, choice[op]):
                    choice[op], origin[op] = index, origin[op] + ", parameters at rest (no extra cost)"
                break


def _local_cost(problem: SearchProblem, choice: dict[str, int], op: str, index: int) -> float:
    """The cost of `op` running candidate `index` with its neighbours as `choice` has them."""
    def pick(name: str) -> int:
        return index if name == op else choice[name]

    return problem.costs[op].comm[index] + sum(edge.table[pick(edge.producer), pick(edge.consumer)] for edge in problem.incident[op])


def _batch_split(strategy: Strategy, device_num: int) -> bool:
    """Whether `strategy` splits only the first dim of the op's first output, over all devices."""
    outputs = strategy.rule.outputs
    if not outputs or not outputs[0] or math.prod(strategy.splits) != device_num:
        return False
    return math.prod(strategy.split(f) for f in outputs[0][0]) == device_num


def data_parallel(problem: SearchProblem, keep_seeds: bool, seeds_from_one_plan: bool = False) -> Assignment:
    """Every forward op splits its batch dim (its first output's first dim) over all devices; with
    `keep_seeds` (semi_auto_parallel) configured ops keep their strategies; the other ops are
    propagated to from these."""
    choice, origin = {}, {}
    for name, candidates in problem.candidates.items():
        if keep_seeds and problem.graph.ops[name].is_seeded:
            choice[name], origin[name] = 0, SEED
            continue
        found = [i for i, s in enumerate(candidates) if _batch_split(s, problem.device_num)]
        if found and op_phase(name) == "forward":
            choice[name], origin[name] = found[0], DATA_PARALLEL
    # Ops without a batch dim in their output (a loss) and backward ops (whose first output dim
    # is a weight's row as often as the batch) take, in data-flow order, the cheapest candidate
    # given their producers, the synchronisation aside: each computes on the batch slice its
    # inputs hold, and a weight's gradient is a partial sum AllReduced over every replica —
    # data parallel as MindSpore runs it, not a cheaper hybrid the user did not ask for.
    for name in problem.graph.ops:
        if name not in choice:
            choice[name], origin[name] = best_candidate(problem, name, choice, sync=False), DATA_PARALLEL
    return _finish(problem, choice, origin, seeds_from_one_plan)
