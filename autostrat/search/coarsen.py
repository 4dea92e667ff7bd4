"""Coarsening: a smaller model with the same optimum, solved instead of the whole problem.

Three reductions, in this order:

1. Prune dominated candidates (always exact, memory included). Candidate j of an op is
   dominated by j' when j' is no worse anywhere j shows up: own communication, flops, the bytes
   of every tensor the op owns (see `memory`), and every entry of every incident cost table.
   Any plan using j stays as good with j', so only the undominated candidates remain. Equal
   candidates keep the lower index, which makes the relation a strict order with minimal elements.
2. Share repeated layers (level "layers" only). Ops named ``<prefix>.<i>.<rest>`` (a `CellList`)
   whose layers have equal candidates use the variables of the first such layer. This is a
   restriction: the optimum is the best plan whose repeated layers agree, which the model then
   proves; level "exact" never does this.
3. Eliminate ops with at most two neighbours (exact for bytes). The op's choice becomes the best
   one for each choice of its neighbours: a leaf folds into its neighbour's own costs, an op in a
   chain (BiasAdd, GELU, ...) turns its two edges into one min-plus table. Under a memory budget
   only ops whose tensors have the same bytes in every candidate are eliminated, so that the
   memory constraints stay exact. Among byte-optimal choices the fewest flops win; eliminated
   ops then leave the solver's tie-break.

The result maps the solver's choice (per variable owner, an index into its kept candidates) back
to a candidate of every op with `expand`.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np

from autostrat.errors import ConfigError
from autostrat.search.deadline import Deadline
from autostrat.search.memory import tensor_bytes
from autostrat.search.pricing import price_tables
from autostrat.search.problem import SearchProblem, layers_of
from autostrat.search.sharing import CoarseFanout, Fanout, coarse_fanout, fanouts, merged_fanouts, reader_columns

LEVELS = ("none", "exact", "layers")


@dataclass(frozen=True)
class CoarseEdge:
    """The summed cost tables between two variable owners (rows `first`, columns `second`)."""

    first: str
    second: str
    table: np.ndarray


@dataclass(frozen=True)
class Elimination:
    """An eliminated owner: its best kept index for each choice of its neighbours."""

    owner: str
    neighbours: tuple[str, ...]
    best: np.ndarray


@dataclass(frozen=True)
class Coarsening:
    """The coarse model the solver sees and how to map its answer back.

    `kept[op]`: the op's candidate indices still allowed; `owner[op]`: the op whose variables it
    uses; `unary[owner]` / `flops[owner]`: bytes and flops per kept candidate of the owner,
    summed over the ops it stands for (with eliminated neighbours folded in); `edges`: tables
    between owners that still have a choice; `eliminated`: in elimination order.
    """

    level: str
    kept: dict[str, tuple[int, ...]]
    dominator: dict[str, dict[int, int]]
    owner: dict[str, str]
    unary: dict[str, np.ndarray]
    flops: dict[str, np.ndarray]
    edges: tuple[CoarseEdge, ...]
    eliminated: tuple[Elimination, ...]
    constant: float
    shared_layers: tuple[str, ...]
    fanouts: tuple[CoarseFanout, ...] = ()  # tensors whose readers share redistributions (`sharing`)

    @property
    def variables(self) -> dict[str, int]:
        """Owners the solver decides, with their number of kept candidates."""
        gone = {e.owner for e in self.eliminated}
        return {o: len(self.unary[o]) for o in self.unary if o not in gone and len(self.unary[o]) > 1}

    def literal_index(self, op: str, index: int) -> int | None:
        """The kept index standing for the op's candidate `index`, None if it was pruned."""
        kept = self.kept[op]
        return kept.index(index) if index in kept else None

    def coarse_hint(self, hint: dict[str, int]) -> dict[str, int]:
        """The hint in the coarse model's indices (a pruned choice becomes its dominator); an
        owner whose layers the hint sets apart takes the choice most of them make (the first
        layer's may fit no other: a seeded layer's backward)."""
        votes: dict[str, Counter] = {}
        for op, owner in self.owner.items():
            index = self.dominator[op].get(hint[op], hint[op])
            if index in self.kept[owner]:
                votes.setdefault(owner, Counter())[self.kept[owner].index(index)] += 1
        return {owner: min(count, key=lambda i: (-count[i], i)) for owner, count in votes.items()}

    def expand(self, coarse: dict[str, int]) -> dict[str, int]:
        """A candidate index per op of the problem from a kept index per decided owner."""
        chosen = {o: 0 for o in self.unary}
        chosen.update(coarse)
        for step in reversed(self.eliminated):
            chosen[step.owner] = int(step.best[tuple(chosen[n] for n in step.neighbours)])
        return {op: self.kept[op][chosen[owner]] for op, owner in self.owner.items()}

    def summary(self) -> str:
        total = sum(len(k) for k in self.kept.values())
        pruned = sum(len(d) for d in self.dominator.values())
        merged = [e.owner for e in self.eliminated]
        text = f"coarsened ({self.level}): {pruned} dominated candidate(s) pruned ({total} kept), {len(merged)} op(s) merged into neighbours"
        if self.shared_layers:
            text += f", layers sharing variables: {', '.join(self.shared_layers)}"
        return text


def coarsen(problem: SearchProblem, level: str = "exact", budget: bool = False, deadline: Deadline | None = None) -> Coarsening:
    """The coarse model of `problem` (see the module docstring for the reductions).

    `budget`: a memory budget will be imposed, so eliminated ops must have constant memory.
    `deadline`: checked between steps (`deadline.TimeRanOut` when it passes); none by default.

    Example:
        >>> from autostrat.frontend import trace
        >>> from autostrat.models import FFN
        >>> from autostrat.nn import Tensor
        >>> from autostrat.search.problem import build_problem
        >>> problem = build_problem(trace(FFN(), Tensor(shape=(64, 64)), device_num=8), 8)
        >>> coarse = coarsen(problem)
        >>> coarse.variables  # a chain: every op folds into its neighbours, nothing is left to solve
        {}
        >>> coarse.summary()
        'coarsened (exact): 1 dominated candidate(s) pruned (36 kept), 5 op(s) merged into neighbours'
    """
    if level not in LEVELS:
        raise ConfigError(f"coarsen must be one of {', '.join(LEVELS)}; got {level!r}")
    deadline = deadline or Deadline(float("inf"))
    price_tables(problem, deadline)
    owned, groups = _owned_bytes(problem), fanouts(problem)
    kept, dominator = _prune(problem, owned, groups, deadline) if level != "none" else _keep_all(problem)
    owner, shared = share_layers(problem) if level == "layers" else ({op: op for op in problem.candidates}, ())
    if shared:
        kept = _union_kept(kept, owner)
    apart = {id(edge) for group in groups for edge in group.edges}  # priced by the fanouts, not pairwise
    unary, flops, tables, constant = _coarse_graph(problem, kept, owner, apart)
    eliminated: list[Elimination] = []
    if level != "none":
        # A fanout's ops keep their variables: its cost is not a sum of pairwise tables.
        fixed = {owner[op] for group in groups for op in (group.producer, *(e.consumer for e in group.edges))}
        constant += _eliminate(problem, owner, kept, owned, budget, unary, flops, tables, eliminated, fixed, deadline)
    edges = tuple(CoarseEdge(a, b, table) for (a, b), table in tables.items())
    coarse_fanouts = merged_fanouts(tuple(coarse_fanout(group, kept, owner) for group in groups))
    return Coarsening(level, kept, dominator, owner, unary, flops, edges, tuple(eliminated), constant, shared,
                      coarse_fanouts)


def _owned_bytes(problem: SearchProblem) -> dict[str, list[np.ndarray]]:
    """Per op, the per-candidate bytes of each tensor whose memory its choice decides."""
    owned: dict[str, list[np.ndarray]] = {op: [] for op in problem.candidates}
    resident, activations = tensor_bytes(problem)
    for item in resident + activations:
        owned[item.owner].append(np.array(item.bytes, dtype=float))
    return owned


def _keep_all(problem: SearchProblem):
    return {op: tuple(range(len(c))) for op, c in problem.candidates.items()}, {op: {} for op in problem.candidates}


def _profile(problem: SearchProblem, op: str, owned, groups: tuple[Fanout, ...]) -> np.ndarray:
    """One row per candidate: everything a dominating candidate must not exceed."""
    costs = problem.costs[op]
    columns = [costs.comm[:, None], costs.flops[:, None], *(b[:, None] for b in owned[op]), *reader_columns(groups, op)]
    for edge in problem.incident[op]:
        table = edge.table.full()  # the solver's model prices every pair
        columns.append(table.T if edge.consumer == op else table)
    return np.hstack(columns)


def _prune(problem: SearchProblem, owned, groups: tuple[Fanout, ...], deadline: Deadline):
    kept, dominator = {}, {}
    for op, candidates in problem.candidates.items():
        deadline.check("pruning dominated candidates")
        if len(candidates) == 1:
            kept[op], dominator[op] = (0,), {}
            continue
        profile = _profile(problem, op, owned, groups)
        no_worse = (profile[:, None, :] <= profile[None, :, :]).all(axis=2)  # [a, b]: a no worse than b
        equal = no_worse & no_worse.T
        order = np.arange(len(candidates))
        dominates = no_worse & (~equal | (order[:, None] < order[None, :]))
        np.fill_diagonal(dominates, False)
        minimal = ~dominates.any(axis=0)
        kept[op] = tuple(int(i) for i in np.flatnonzero(minimal))
        # Every dominated candidate has a minimal dominator: the order is strict and finite.
        dominator[op] = {int(b): int(next(a for a in kept[op] if dominates[a, b])) for b in np.flatnonzero(~minimal)}
    return kept, dominator


def share_layers(problem: SearchProblem) -> tuple[dict[str, str], tuple[str, ...]]:
    """Owner per op (ops of repeated layers with equal candidates point at the first such
    layer), and a description of each group of shared layers (empty when the graph repeats none).

    Layers are grouped by equality, not against the first layer only: a seeded first layer
    (Megatron's seeds on block 0) differs from the others, which still agree among themselves.
    """
    layers = layers_of(problem.candidates)
    owner = {op: op for op in problem.candidates}
    shared = []
    for prefix, by_index in layers.items():
        groups: list[list[int]] = []  # indices of equal layers, the first one owning the variables
        for index in sorted(by_index):
            group = next((g for g in groups if _same_layer(problem, by_index[g[0]], by_index[index])), None)
            if group is None:
                groups.append([index])
            else:
                group.append(index)
        for group in (g for g in groups if len(g) > 1):
            first = by_index[group[0]]
            for index in group[1:]:
                for rest, op in by_index[index].items():
                    owner[op] = first[rest]
            shared.append(f"{prefix}.{_ranges(group)} ({len(group)} layers)")
    return owner, tuple(shared)


def _ranges(indices: list[int]) -> str:
    """Sorted layer indices as ranges: [0, 1, 2, 5] -> "0-2,5"."""
    runs: list[list[int]] = []
    for index in indices:
        if runs and index == runs[-1][-1] + 1:
            runs[-1].append(index)
        else:
            runs.append([index])
    return ",".join(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]) for run in runs)


def _same_layer(problem: SearchProblem, first: dict[str, str], other: dict[str, str]) -> bool:
    return first.keys() == other.keys() and all(
        problem.candidates[first[rest]] == problem.candidates[other[rest]] for rest in first
    )


def _union_kept(kept, owner):
    union: dict[str, set[int]] = {}
    for op, own in owner.items():
        union.setdefault(own, set()).update(kept[op])
    return {op: tuple(sorted(union[owner[op]])) for op in owner}


def _coarse_graph(problem: SearchProblem, kept, owner, apart: set[int]):
    """Unary bytes and flops per owner, summed tables per owner pair (but those of the edges
    whose ids are in `apart`), and the constant bytes."""
    # In graph order, not a set's: the owners' order is the solver's variable order, and a set of
    # strings iterates in a per-process order (hash randomisation), which made the search, its
    # time and the plan among equal ones differ from run to run.
    unary = {o: np.zeros(len(kept[o])) for o in dict.fromkeys(owner.values())}
    flops = {o: np.zeros(len(kept[o])) for o in unary}
    for op, own in owner.items():
        unary[own] += problem.costs[op].comm[list(kept[op])]
        flops[own] += problem.costs[op].flops[list(kept[op])]
    tables: dict[tuple[str, str], np.ndarray] = {}
    constant = 0.0
    for edge in problem.edges:
        if id(edge) in apart:
            continue
        a, b = owner[edge.producer], owner[edge.consumer]
        table = edge.table.full()[np.ix_(kept[edge.producer], kept[edge.consumer])]
        if a == b:
            unary[a] += np.diagonal(table)
        elif len(unary[a]) == 1 or len(unary[b]) == 1:
            if len(unary[a]) == 1 and len(unary[b]) == 1:
                constant += float(table[0, 0])
            elif len(unary[a]) == 1:
                unary[b] += table[0]
            else:
                unary[a] += table[:, 0]
        else:
            _add_table(tables, a, b, table)
    return unary, flops, tables, constant


def _add_table(tables, a: str, b: str, table: np.ndarray) -> None:
    if (b, a) in tables:
        a, b, table = b, a, table.T
    tables[a, b] = tables[a, b] + table if (a, b) in tables else table


def _best(total: np.ndarray, flops: np.ndarray, axis: int) -> tuple[np.ndarray, np.ndarray]:
    """Minimum of `total` along `axis` and its argmin, ties going to fewer flops, then lower index."""
    low = total.min(axis=axis, keepdims=True)
    shape = [1] * total.ndim
    shape[axis] = -1
    tied = np.where(total == low, np.broadcast_to(flops.reshape(shape), total.shape), np.inf)
    return np.squeeze(low, axis=axis), np.argmin(tied, axis=axis)


def _eliminate(problem, owner, kept, owned, budget, unary, flops, tables, eliminated, fixed: set[str],
               deadline: Deadline) -> float:
    """Eliminate owners of degree 0, 1 or 2 (not those `fixed`) until none is left; returns the
    constant bytes."""
    constant = 0.0
    order = {o: problem.graph.op_index(o) for o in unary}
    eligible = {o for o in unary if len(unary[o]) > 1 and o not in fixed
                and (not budget or _constant_memory(o, owner, kept, owned))}
    rank = {key: index for index, key in enumerate(tables)}  # the tables' order, new keys last
    incident: dict[str, set] = {o: set() for o in unary}
    for key in tables:
        incident[key[0]].add(key)
        incident[key[1]].add(key)
    changed = True
    while changed:
        changed = False
        for node in sorted(eligible, key=order.get):
            if len(incident[node]) > 2:
                continue
            deadline.check("merging ops into their neighbours")
            touching = sorted(incident[node], key=rank.get)  # as the tables list them
            for key in touching:
                incident[key[0]].discard(key)
                incident[key[1]].discard(key)
            constant += _eliminate_one(node, touching, unary, flops, tables, eliminated)
            if len(touching) == 2:  # the node's two ends are joined by a table, perhaps a new one
                first, second = (a if b == node else b for a, b in touching)
                key = (first, second) if (first, second) in tables else (second, first)
                if key not in rank:
                    rank[key] = len(rank)
                    incident[first].add(key)
                    incident[second].add(key)
            eligible.discard(node)
            changed = True
    return constant


def _constant_memory(own: str, owner, kept, owned) -> bool:
    ops = [op for op, o in owner.items() if o == own]
    return all(np.all(b[list(kept[op])] == b[kept[op][0]]) for op in ops for b in owned[op])


def _oriented(tables, node: str, key) -> tuple[str, np.ndarray]:
    """The other end of an edge and its table with `node`'s candidates on axis 0."""
    table = tables.pop(key)
    return (key[1], table) if key[0] == node else (key[0], table.T)


def _eliminate_one(node: str, touching, unary, flops, tables, eliminated) -> float:
    own = unary[node]
    if not touching:
        low, best = _best(own, flops[node], 0)
        eliminated.append(Elimination(node, (), np.asarray(best)))
        return float(low)
    ends = [_oriented(tables, node, key) for key in touching]
    if len(ends) == 1:
        (other, table), = ends
        low, best = _best(table.T + own[None, :], flops[node], 1)
        unary[other] = unary[other] + low
        eliminated.append(Elimination(node, (other,), best))
        return 0.0
    (first, left), (second, right) = ends
    # total[i, j, k]: first's i, node's j, second's k.
    total = left.T[:, :, None] + own[None, :, None] + right[None, :, :]
    low, best = _best(total, flops[node], 1)
    eliminated.append(Elimination(node, (first, second), best))
    _add_table(tables, first, second, low)
    return 0.0
