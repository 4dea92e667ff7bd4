"""A `SearchProblem` as an `Instance` of the IOPDDL solver, so that `refine="solve"` can run it
on autostrat's own graphs.

Node i is the problem's op i (`problem.candidates` order), its strategies the op's candidates
and its costs the op's own costs (`OpCosts.comm`, in the problem's `unit`). Each `SearchEdge`
adds its full table (every entry priced: `LazyCostTable.full`) between its producer and
consumer; edges of one pair of ops sum, and an op's edge to itself adds its diagonal.

Memory (`memory.tensor_bytes`): each tensor's per-device bytes depend on one op's candidate.
The tensors an op owns that are live over the same steps become one memory node: the op's
strategies, no cost, its bytes as usages, and an edge to the op that forbids every pair but
equal indices (the solver's grouping folds it into the op). Step s is time s; an activation
live from step a to step b (both included, `memory.spans`) has the interval [a, b + 1), and
parameters, constants and optimiser state [0, ops + 1). The limit is the budget.

Exact:
- a choice's memory: the instance's peak (its usage at every interval start) is
  `memory.peak_bytes`, the peak the CP-SAT model's rows (`peaks`) bound;
- a choice's cost with ``shared=False``: `problem.cost(choice, shared=False)` (every edge pays its
  own redistribution), up to float summation of integer costs (exact below 2**53);
- hence with ``shared=True`` too when no two edges read one tensor from one producer
  (`shares_nothing`): then no redistribution can be shared.

Approximated:
- readers of one tensor that want it in one layout share one redistribution in the plan
  (`problem.cost(choice, shared=True)`, what CP-SAT optimises); the pairwise instance counts one per
  reader, an upper bound: its optimum may miss a plan that only sharing makes cheapest, and its
  lower bound does not bound the shared cost;
- CP-SAT's second objective (fewest flops among plans of the fewest bytes) is not modelled.

Relaxed (``relaxed=True``): each of the k edges reading one tensor from one producer adds 1/k
of its table. A tensor's shared cost is at least what its dearest reader's redistribution costs,
so at least the mean over its readers: no choice costs more in the relaxed instance than
`problem.cost(choice, shared=True)`, and the relaxed instance's lower bound bounds the shared
cost (`refinement`).

Unreachable pairs (infinite costs) get `FORBIDDEN_COST`, the contest's convention.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np

from autostrat.search.deadline import Deadline
from autostrat.search.memory import spans, tensor_bytes
from autostrat.search.problem import SearchProblem
from autostrat.search.solve.instance import FORBIDDEN, Instance, _simple_graph

FORBIDDEN_COST = FORBIDDEN * 10  # what the contest's files write for a forbidden choice (about 1e18)
PRICING = "pricing every cost table for the solver's instance"


@dataclass(frozen=True)
class Converted:
    """The instance, the ops its first nodes stand for (node i: `ops[i]`) and, per memory node
    after them, the node of the op it follows."""

    instance: Instance
    ops: tuple[str, ...]
    owners: tuple[int, ...]

    def solution(self, choice: dict[str, int]) -> list[int]:
        """The instance's solution of a choice: each op's index, each memory node its op's."""
        indices = [choice[op] for op in self.ops]
        return indices + [indices[owner] for owner in self.owners]

    @property
    def memory_nodes(self) -> int:
        return len(self.owners)

    def choice(self, solution) -> dict[str, int]:
        """The choice of an instance's solution (its memory nodes follow their ops)."""
        return {op: int(index) for op, index in zip(self.ops, solution)}


def to_instance(problem: SearchProblem, budget: int | None = None, deadline: Deadline | None = None,
                relaxed: bool = False) -> Converted:
    """The instance of `problem` under the per-device memory `budget` (None: no limit), with the
    readers of one tensor sharing its tables when `relaxed` (see the module docstring). Pricing
    the tables checks `deadline` before each edge (`deadline.TimeRanOut`).

    Example:
        >>> from autostrat.frontend import trace
        >>> from autostrat.models import FFN
        >>> from autostrat.nn import Tensor
        >>> from autostrat.search.problem import build_problem
        >>> problem = build_problem(trace(FFN(), Tensor(shape=(64, 64)), device_num=8), 8)
        >>> converted = to_instance(problem, budget=100_000)
        >>> len(converted.ops), converted.memory_nodes, converted.instance.limit
        (5, 10, 100000)
    """
    deadline = deadline or Deadline(float("inf"))
    ops = tuple(problem.candidates)
    position = {op: index for index, op in enumerate(ops)}
    costs = [_finite(problem.costs[op].comm) for op in ops]
    pairs, matrices = [], []
    readers = _readers(problem)
    for edge in problem.edges:
        deadline.check(PRICING)
        pairs.append((position[edge.producer], position[edge.consumer]))
        share = readers[problem.share_group(edge)] if relaxed and not edge.sync else 1
        matrices.append(_finite(np.asarray(edge.table.full(), dtype=np.float64) / share).ravel())
    costs, edge_list, edge_costs = _simple_graph(costs, pairs, matrices)
    usages, intervals, owners = _memory_nodes(problem, position)
    links = [_link(len(costs[owner])) for owner in owners]
    node_count = len(ops)
    memory_edges = np.array([(owner, node_count + k) for k, owner in enumerate(owners)], dtype=np.int64).reshape(-1, 2)
    instance = Instance(
        getattr(problem.graph, "name", "") or "search problem",
        tuple(costs) + tuple(np.zeros(len(costs[owner])) for owner in owners),
        tuple([np.zeros(len(cost), dtype=np.int64) for cost in costs] + usages),
        np.array([(0, 0)] * node_count + intervals, dtype=np.int64).reshape(-1, 2),
        np.concatenate([edge_list, memory_edges]),
        tuple(edge_costs) + tuple(links),
        None if budget is None else int(budget),
    )
    return Converted(instance, ops, tuple(owners))


def shares_nothing(problem: SearchProblem) -> bool:
    """Whether no two priced edges read one tensor from one producer, so that no redistribution
    can be shared and the instance's cost is `problem.cost(choice, shared=True)` exactly.

    Example:
        >>> from autostrat.frontend import trace
        >>> from autostrat.models import FFN
        >>> from autostrat.nn import Tensor
        >>> from autostrat.search.problem import build_problem
        >>> shares_nothing(build_problem(trace(FFN(), Tensor(shape=(64, 64)), device_num=8), 8))
        True
    """
    return all(count == 1 for count in _readers(problem).values())


def _readers(problem: SearchProblem) -> Counter:
    """How many priced edges read each tensor of each share group (`SearchProblem.share_group`;
    gradient synchronisation never shares)."""
    return Counter(problem.share_group(edge) for edge in problem.edges if not edge.sync)


def _finite(values: np.ndarray) -> np.ndarray:
    values = np.asarray(values, dtype=np.float64)
    return np.where(np.isfinite(values), values, FORBIDDEN_COST)


def _memory_nodes(problem: SearchProblem, position: dict[str, int]) -> tuple[list, list, list]:
    """(usages, interval, owning node) per memory node: an op's tensors live over the same
    steps summed into one, tensors of no bytes left out."""
    resident, activations = tensor_bytes(problem)
    everything = len(problem.graph.ops) + 1  # past the last step: parameters are live throughout
    summed: dict[tuple[int, int, int], np.ndarray] = {}
    items = [(item, (0, everything)) for item in resident]
    items += [(item, (start, end + 1)) for item, (start, end) in zip(activations, spans(problem, activations))]
    for item, (start, end) in items:
        key = (position[item.owner], start, end)
        usage = np.asarray(item.bytes, dtype=np.int64)
        summed[key] = summed[key] + usage if key in summed else usage
    kept = [(key, usage) for key, usage in summed.items() if usage.any()]
    return [usage for _, usage in kept], [[start, end] for (_, start, end), _ in kept], [owner for (owner, _, _), _ in kept]


def _link(count: int) -> np.ndarray:
    """An edge that lets a memory node take only its op's index."""
    matrix = np.full((count, count), FORBIDDEN_COST)
    np.fill_diagonal(matrix, 0.0)
    return matrix
