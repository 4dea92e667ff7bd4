"""The shortest path over layout states (A* with an admissible bound), one search per pair.

Layers of nodes ``(layer, state)``:

- 0: no permute yet, over the common refinement of both device matrices; when none exists
  (``[2, 3]`` and ``[3, 2]``) layer 0 is the source's prime refinement and layer 1 the
  destination's, reached for free when a relabelling leaves every rank its slice;
- `PERMUTED`: one CollectivePermute has been paid (cost ``s`` where it is taken); states are kept
  up to relabelling, over the last space, since the relabelling is chosen at the end. Under an
  α–β time model there is no such layer: axes of one size may differ in speed, so permutes go to
  real relabellings in their own layer, each timed on the axes it moves, expanded lazily in
  bundles of one link (`Search._timed_permutes`), and every step of a path is timed as the
  plan's step will be.

Priorities are ``(objective + bound, bound, objective, steps, bytes, late, node)``: estimated bytes (or
α–β time in whole nanoseconds, `AlphaBeta.step_nanoseconds`) first, then the node nearest the target by the bound (the bound is tight on many
partial states, and preferring depth keeps A* off those plateaus), then fewer steps, then a
bundle's rest last (`Search._towards`), then the node itself, so ties break the same way on every run. The bound is admissible but not always
consistent, so a state reached more cheaply after it settled is reopened.

Under a time model the bound in bytes (`heuristic.receive_bound`) is timed by `timed.time_floor`.

Towards a partial target, a state splitting every dim as the target does, whose partial axes are
some of the target's, reaches it by one PartialCreate (`moves.creation`; in the permuted layer,
of representatives: both take the lowest ids of each size after the entries). Between two device
matrices, layer-0 states may also create partial values on free axes of the target's partial
sizes, so that a crossing becomes free (`moves.creations`). These edges depend on the target:
they join the shared `expansions` memo's edges, never stored in it.

Without a time model, the exact layer of a one-space problem keeps states up to the relabellings
that fix the target (`moves.fixing_pools`): they preserve every step cost and the target, so the
cost-to-go is the same on a whole class; `paths.real_states` turns the path back into real states.
Under a time model only relabellings within axes it times alike preserve every step's time
(`relabellings.speed_pools`); states, permutes' children included, are kept up to those.

A search for the cost alone may instead keep states up to the relabellings that fix the source
(`cost_search` picks the larger group). Such a relabelling maps a plan from the source to the
target onto a plan from the source to the relabelled target, step for step at the same price:
every step kind is defined alike on every axis of one size, except that a ReduceScatter places
its block in one order, and a block in another order costs exactly what single-axis
ReduceScatters in that order cost (``(1 - 1/(g1·g2))·s`` either way). So the cheapest way to any
relabelling of the target is the cheapest way to the target. The bound must then hold for a
whole class: the size bound does (it sees no positions); the receive bound does not (nor is a
partial target's class kept: `_symmetry`). The path found ends at such a relabelling of the
target; its inverse maps the path onto one to the target itself (`paths.onto_target`).
"""

from __future__ import annotations

import heapq
import math

from autostrat.cost.time_model import ceil_nanoseconds
from autostrat.redistribution.heuristic import receive_bound
from autostrat.redistribution.layers import PERMUTED, Problem, bijections, expansions, permuted_edges
from autostrat.redistribution.moves import (Move, Space, State, canonical, creation, creations, fixing_pools, moves, pool_canonical,
                                            pools_order, relabel, split_signature)
from autostrat.redistribution.paths import onto_target, real_states, unpermute
from autostrat.redistribution.polling import POLL_EVERY, poll
from autostrat.redistribution.relabellings import (ClassLimit, bundle_classes, mapping_link, permute_links, speed_pools,
                                                   towards_target)
from autostrat.redistribution.timed import step_nanoseconds, time_floor, timed_bound

SETTLED_LIMIT = 100_000  # beyond this many settled states the planner falls back to the constructive plan
# Settled nodes within which a timed search proves its optimum, or the planner takes the link plan
# (`planner._timed_plan`): the 7B row's 21 searches past it took 33.5 of its 51.9 s of pricing.
TIMED_BUDGET = 4_000


class Search:
    """A* from `start` to `target` or to its relabelling class in the permuted layer.

    With ``symmetry="source"`` (one space, no time model) states are kept up to the
    relabellings fixing the source (the path is mapped back onto the target, `paths.onto_target`);
    ``"larger"`` takes whichever of the two groups has more relabellings. With
    `unit` (no time model) AllGathers and ReduceScatters take one axis each (`moves.moves`).
    """

    def __init__(self, problem: Problem, start, target, model=None, symmetry: str = "target", unit: bool = False,
                 bound: float = math.inf, limit: int | None = None):
        self.problem, self.model, self.target = problem, model, target
        self.bound = bound  # the objective of some plan: a state whose estimate exceeds it is never kept
        self.limit = limit  # settled nodes after which `settle` stops unfinished (`cut`), if below SETTLED_LIMIT
        self.cut = False
        self.least = 0  # the largest key settled: no path to the target costs less
        self.unit = unit and model is None
        last = problem.spaces[-1]
        self.permuted_target = (PERMUTED, canonical(last.sizes, last.sizes, target[1])[0])
        self.receive = receive_bound(last, target[1])
        self.floor = time_floor(model) if model is not None else None
        self.timed_bound = None if model is None else timed_bound(last, target[1], problem.matrix(target[0]), model)
        self.known = self.receive.memo if model is None else self.timed_bound.memo  # state -> its bound, once computed
        # Relabellings fixing the target (and, without a time model, every cost) map optimal
        # paths to optimal paths, so one search layer keeps states up to them (`paths.real_states` undoes it).
        single = len(problem.spaces) == 1 and model is None
        self.by_source, self.pools = _symmetry(last.sizes, start[1], target[1], symmetry) if single else (False, ())
        if model is not None and len(problem.spaces) == 1:
            # Under a time model only relabellings within axes it times alike keep every step's time.
            self.pools = speed_pools(problem.matrix(0), model, fixing_pools(last.sizes, target[1]))
        self.start, start, self.real_target = start, self._representative(start), target
        if self.by_source:
            self.target = self._representative(target)
        self.bounded_layers = (PERMUTED, target[0])
        self.sized_layers = self.bounded_layers if self.by_source else (PERMUTED,)
        self.best = {start: (0, 0, 0)}  # node -> (objective, steps, bytes)
        self.parent: dict = {start: None}  # node -> (previous node, move)
        self.heap = [(self._bound(start), self._bound(start), 0, 0, 0, False, start, True)]
        self.settled: set = set()
        self.crossings = bijections(problem) if len(problem.spaces) == 2 else []
        self.expanded = expansions(problem, self.pools, model, self.unit)
        self.gave_up = False  # a permute's classes were too many to list (`relabellings.ClassLimit`)

    def _bound(self, node) -> int:
        # Exact layer of the target: what some rank must still receive. Permuted layer, or
        # states kept up to the source's relabellings: the same, knowing only the rank's slice
        # size (it must grow to the target's).
        if node[0] not in self.bounded_layers:
            return 0
        if node[0] in self.sized_layers:
            return self._timed(self.receive.size_bound(node[1]))
        return self.receive(node[1]) if self.timed_bound is None else self.timed_bound(node[1])

    def _estimate(self, node, signature) -> tuple[int, bool]:
        """`_bound(node)` when it is known or cheap, else a cheaper lower bound of it (the size
        bound of `signature`, the node's split signature); and whether it is the bound.
        `settle` computes the bound only for entries it pops."""
        if node[0] not in self.bounded_layers:
            return 0, True
        if node[0] in self.sized_layers or len(node) > 2:  # a bundle or its rest: below each child's bound
            sized = self._timed(self.receive.signature_bound(signature))
            return (max(sized, self._rest_bound(node)) if len(node) == 4 else sized), True
        known = self.known.get(node[1])
        if known is not None:
            return known, True
        return self._timed(self.receive.signature_bound(signature)), False

    def _rest_bound(self, rest) -> int:
        """Below the bound of each child of a bundle's rest on the fastest link
        (`timed.TimedBound.fast_relabellings`), else 0."""
        layer, state, index, _ = rest
        space, matrix = self.problem.space(layer), self.problem.matrix(layer)
        if self.timed_bound is None or layer != self.target[0] or permute_links(space.sizes, matrix, self.model)[index][1][1] < self.floor[1]:
            return 0
        return self.timed_bound.fast_relabellings(state)

    def _timed(self, sent: int) -> int:
        """A bound on bytes as a bound on the objective: itself, or under a time model the
        least time any steps sending that many bytes take (`time_floor`)."""
        if self.floor is None or not sent:
            return sent
        latency, bandwidth = self.floor
        return latency + ceil_nanoseconds(sent, bandwidth)

    def _edges(self, node):
        layer, state = node
        space, last = self.problem.space(layer), self.problem.spaces[-1]
        if layer == PERMUTED:
            yield from permuted_edges(space, state, self.unit)
            return
        for move in moves(space, state, self.unit):
            yield move, self._representative((layer, move.state))
        if self.model is not None:
            yield from self._timed_permutes(layer, state)
            return
        permuted, every_axis = canonical(space.sizes, last.sizes, state)[0], tuple(range(len(space.sizes)))
        yield Move("CollectivePermute", every_axis, (), None, permuted, space.local_bytes(state)), (PERMUTED, permuted)
        for mapping in self.crossings if layer == 0 else ():
            crossed = (1, relabel(state, mapping))
            if self.problem.layout(node).normalized() == self.problem.layout(crossed).normalized():
                yield Move("CollectivePermute", (), (), mapping, crossed[1], 0), crossed

    def _timed_permutes(self, layer: int, state):
        """Permutes under a time model: to every real relabelling, timed on the axes it moves.

        The permuted layer keeps states up to relabelling and chooses the relabelling at the end,
        so the steps after a permute are timed on representative axes; when axes of one size
        differ in speed (inside a server or across), that is the wrong link. Real states keep
        every step's axes (and permutes may repeat), at the price of one child per class of
        relabelled state (up to `self.pools`): few where axes share roles (10 prime axes of 2
        handing a partial sum between two 8-device axes: 3 classes of 3 628 799 relabellings),
        up to every relabelling where the target pins each axis (720 over six axes of one size).
        The classes are found without listing the relabellings (`relabellings.first_relabellings`).
        The children wait in bundles, one per link the permute may span (all its relabellings
        take the same time): a bundle node ``(layer, state, link)`` enters the heap at its time
        plus the size bound, which no child beats, and only a bundle popped before the target
        is expanded: first to the relabelling nearest the target's order, then, if its rest is
        popped too, to every class (`_towards`, `_bundle_edges`).
        """
        space = self.problem.space(layer)
        sent = space.local_bytes(state)
        for index, (moved, _) in enumerate(permute_links(space.sizes, self.problem.matrix(layer), self.model)):
            yield Move("CollectivePermute", moved, (), None, state, sent), (layer, state, index)
        every_axis = tuple(range(len(space.sizes)))
        for mapping in self.crossings if layer == 0 else ():
            crossed = (1, relabel(state, mapping))
            free = self.problem.layout((layer, state)).normalized() == self.problem.layout(crossed).normalized()
            yield Move("CollectivePermute", () if free else every_axis, (), mapping, crossed[1], 0 if free else sent), crossed

    def _bundle_edges(self, bundle):
        """The permutes of one bundle (their time was paid on entering it): one per class of
        child, the first relabelling reaching it."""
        layer, state, index = bundle
        space = self.problem.space(layer)
        sent, used = space.local_bytes(state), tuple(axis for entry in state[0] for axis in entry)
        bounds, start = [], 0
        for entry in state[0]:
            bounds.append((start, start + len(entry)))
            start += len(entry)
        for mapping, moved, images, key in bundle_classes(space.sizes, self.problem.matrix(layer), self.model, index,
                                                           self.pools, used, state[1]):
            # Cut the axes into dims; the child's partial axes are sorted already, its representative's may not be.
            child = tuple(tuple(images[a:b]) for a, b in bounds), tuple(images[start:])
            kept = tuple(tuple(key[a:b]) for a, b in bounds), tuple(sorted(key[start:]))
            yield Move("CollectivePermute", moved, (), mapping, child, sent), (layer, kept)

    def _representative(self, node):
        if not self.pools or node[0] == PERMUTED:
            return node
        return node[0], pool_canonical(self.pools, len(self.problem.space(node[0]).sizes), node[1])[0]

    def _expand(self, node) -> tuple:
        if len(node) == 3:
            return self._towards(node)
        key = node[:3]  # a bundle's rest is memoised as its bundle: the classes depend on no target
        found = self.expanded.get(key)
        if found is None:
            if len(node) == 4:  # a bundle's rest: its permutes' time and bytes were charged on entering the bundle
                # A relabelling keeps every dim's split: the children share the state's signature.
                signature = split_signature(self.problem.space(node[0]), node[1])
                found = tuple((child, 0, 0, signature, move) for move, child in self._bundle_edges(key))
            else:
                found = tuple(
                    (child, self._weight(node[0], move), move.bytes, split_signature(self.problem.space(child[0]), child[1]), move)
                    for move, child in self._edges(node)
                )
            self.expanded[key] = found
        return found

    def _towards(self, bundle) -> tuple:
        """A popped bundle's edges: its permute to the relabelling nearest the target's order
        (`relabellings.towards_target`) when that relabelling spans the bundle's link, then the
        bundle's rest ``(layer, state, index, True)``, which holds every class of child
        (`_bundle_edges`) and enters the heap at the bundle's key.

        Exact: the rest's key is below each of its children's, so A* pops it before any child
        it hides could be settled; only at equal keys it comes last (``late`` in the heap's
        entries), so a target reached by the nearest relabelling ends the search without
        listing the classes (n! where the target pins each of n axes of one size).
        """
        layer, state, index = bundle
        space = self.problem.space(layer)
        signature = split_signature(space, state)
        rest = ((layer, state, index, True), 0, 0, signature, None)
        if layer != self.target[0]:
            return (rest,)
        matrix = self.problem.matrix(layer)
        mapping = towards_target(space.sizes, state, self.target[1])
        if mapping_link(space.sizes, matrix, self.model, mapping) != permute_links(space.sizes, matrix, self.model)[index][1]:
            return (rest,)
        child = relabel(state, mapping)
        moved = tuple(axis for axis, image in enumerate(mapping) if image != axis)
        move = Move("CollectivePermute", moved, (), mapping, child, space.local_bytes(state))
        return ((self._representative((layer, child)), 0, 0, signature, move), rest)

    def _creation(self, node) -> tuple:
        """The target-dependent edges of `_expand`: a PartialCreate into the target (exact
        layer) or its representative (permuted layer), or before a crossing (layer 0 of two),
        as ``(child, 0, 0, signature, move)``."""
        if len(node) > 2 or not self.target[1][1]:
            return ()
        space = self.problem.space(node[0])
        if node[0] == 0 and self.crossings:
            wanted = tuple(self.problem.spaces[1].sizes[axis] for axis in self.target[1][1])
            return tuple(((0, move.state), 0, 0, split_signature(space, move.state), move) for move in creations(space.sizes, node[1], wanted))
        target = self.permuted_target if node[0] == PERMUTED else self.target
        move = creation(node[1], target[1]) if node[0] == target[0] else None
        return () if move is None else ((target, 0, 0, split_signature(space, target[1]), move),)

    def _weight(self, layer: int, move: Move):
        if self.model is None:
            return move.bytes
        return step_nanoseconds(self.model, move.kind, self.problem.matrix(layer), move.axes, move.bytes)

    def settle(self):
        """Run until a target is settled; returns it, or None (unreachable or limit hit).

        An entry pushed with an estimate below its bound is requeued with the bound when popped:
        its key only grows, and an entry is expanded only when its real key is the least in the
        heap, so nodes are expanded in the same order (and the same plan found) as with bounds
        computed up front, without computing them for the many children never popped.
        """
        targets, heap, best, parent, settled = (self.target, self.permuted_target), self.heap, self.best, self.parent, self.settled
        push, pop, estimate_of, limit = heapq.heappush, heapq.heappop, self._estimate, self.bound
        cap = SETTLED_LIMIT if self.limit is None else min(self.limit, SETTLED_LIMIT)
        while heap and len(settled) < cap:
            key, estimate, objective, steps, sent, late, node, exact = pop(heap)
            if (objective, steps, sent) != best[node]:
                continue  # a stale entry: the node was reached more cheaply since
            if not exact and (bound := self._bound(node)) != estimate:
                push(heap, (objective + bound, bound, objective, steps, sent, late, node, True))
                continue
            if key > self.least:  # the least key left bounds every path not yet settled (admissible bounds)
                self.least = key
            settled.add(node)
            if node in targets:
                return node
            if not len(settled) % POLL_EVERY:
                poll()  # a caller bounded in time may stop a long search here (`polling`)
            steps += len(node) == 2  # a bundle's permute was counted on entering it
            try:
                edges = self._expand(node) + self._creation(node)
            except ClassLimit:
                self.gave_up = True  # as at the state limit: the planner's fallback answers
                return None
            for child, weight, moved, signature, move in edges:
                reached, known = objective + weight, best.get(child)
                # Most children were reached more cheaply already: compare objectives first.
                if known is not None and (known[0] < reached or (known[0] == reached and known[1:] <= (steps, sent + moved))):
                    continue
                estimate, exact = estimate_of(child, signature)
                if reached + estimate > limit:  # every path through it costs more than a plan known
                    continue
                best[child], parent[child] = (reached, steps, sent + moved), (node, move)
                push(heap, (reached + estimate, estimate, reached, steps, sent + moved, len(child) == 4, child, exact))
        self.cut = bool(heap) and cap < SETTLED_LIMIT
        return None

    @property
    def exhausted(self) -> bool:
        return not self.heap and not self.gave_up

    def reached_best(self):
        """The target node reached most cheaply so far (settled or not), or None."""
        return min((node for node in (self.target, self.permuted_target) if node in self.best), key=self.best.__getitem__,
                   default=None)

    def path(self, reached) -> list[tuple]:
        """The ``(node, move, child)`` triples of real steps from the start to the target."""
        found = []
        while self.parent[reached] is not None:
            node, move = self.parent[reached]
            while len(node) > 2:  # a bundle of permutes (and its rest) stand between its state's node and the child
                node = self.parent[node][0]
            found.append((node, move, reached))
            reached = node
        permuted = bool(found) and found[0][2][0] == PERMUTED
        count = len(self.problem.spaces[0].sizes)
        found = real_states(self.pools, count, self.start[1], found[::-1], PERMUTED)
        if permuted:  # the permute's relabelling is chosen to end at the target itself
            return unpermute(self.problem, found, self.real_target, PERMUTED)
        return onto_target(self.pools, count, self.real_target[1], found) if self.by_source else found


def _symmetry(sizes, start: State, target: State, symmetry: str) -> tuple[bool, tuple]:
    """Whether states are kept up to the source's relabellings, and the pools kept (never
    towards a partial target: its PartialCreate is defined on the target's own axes)."""
    if symmetry == "target" or target[1]:
        return False, fixing_pools(sizes, target)
    source = fixing_pools(sizes, start)
    if symmetry == "source":
        return True, source
    by_target = fixing_pools(sizes, target)
    return (True, source) if pools_order(source) > pools_order(by_target) else (False, by_target)


def search(problem: Problem, start, target, model=None, symmetry: str = "target", unit: bool = False,
           bound: float = math.inf, limit: int | None = None) -> tuple[Search, object]:
    """A search of `problem` from `start` to `target`, run, and the node it reached (or None).
    `bound`, the objective of a plan known (never below the optimum), keeps only states whose
    estimate stays within it: the same optimum, far fewer states held (`planner._coarse_bound`);
    `limit` settled nodes, below `SETTLED_LIMIT`, end it unfinished (`Search.cut`)."""
    found = Search(problem, start, target, model, symmetry, unit, bound, limit)
    return found, found.settle()


def cost_search(problem: Problem, start, target, model=None, bound: float = math.inf) -> tuple[Search, object]:
    """`search` for the cost alone, up to the larger group of relabellings: those fixing the
    source or those fixing the target. Fewer classes mean fewer states to settle; a source
    with many partial axes of one size (a reduction split many ways) has thousands of
    interleavings of its reductions that only differ by such a relabelling. Without a time
    model, gathers and scatters of blocks are left to their axes one by one (``unit``).

    Example (16 contributions on 16 ranks, resolved by one ReduceScatter of the whole tensor):
        >>> space = Space((2, 2, 2, 2), (64, 64), 4)
        >>> found, reached = cost_search(Problem((space,), "sum"), (0, (((), ()), (0, 1, 2, 3))), (0, (((3, 2, 1, 0), ()), ())))
        >>> found.by_source, found.best[reached][0]
        (True, 15360)
    """
    return search(problem, start, target, model, "larger", unit=True, bound=bound)
