"""The CP-SAT model of a coarsened problem (see `coarsen`), which `refine` solves.

Per variable owner with more than one kept candidate, one boolean per candidate and exactly one
true (seeded ops have a single candidate and no variable); unreachable pairs of an edge (infinite
cost) are forbidden outright; the memory budget bounds the bytes live at every step that may hold
the peak (`peaks`).

A tensor several ops read (`sharing.CoarseFanout`) is priced as the plan pays it: one
redistribution per layout its readers want, each boolean "this redistribution is paid" implied by
the held layout's boolean and a boolean "some reader wants that layout", which each reader
candidate wanting it implies, and each equal to what the choice implies (so that any solution,
not only the optimum, counts the plan's bytes exactly). A producer
candidate keeping a parameter sharded at rest pays per reader instead.

Other edges use pair variables whose marginals are the two ends' one-hot choices (the local polytope),
the tightest linear relaxation of a pairwise cost: with it the solver proves optimality where a
big-M or enforced-row formulation stalls (measured: a 2-layer GPT under a memory budget went from
a 65 % gap after 60 s to proven optimal in 17 s). Zero-cost pairs get no variable.

Two objectives, solved one after the other (lexicographically, see `refine`): the bytes
(redistribution bytes of every edge plus the ops' own communication), then, among plans of those
bytes, the ops' flops quantised to at most `TIE_LEVELS` levels per op. One weighted sum of both
proved far slower: on a 32-layer training step under a memory budget the bytes alone were proven
optimal in 66 s, the weighted sum still had a 16 % gap after 60 s.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from ortools.sat.python import cp_model

from autostrat.errors import SolverError
from autostrat.search.coarsen import CoarseEdge, Coarsening
from autostrat.search.deadline import Deadline
from autostrat.search.peaks import peak_forms
from autostrat.search.problem import SearchProblem
from autostrat.search.sharing import CoarseFanout

TIE_LEVELS = 64
OBJECTIVE_LIMIT = 2**62  # CP-SAT checks that every sum the objective can reach fits in 64 bits
BUILDING = "building the CP-SAT model (pair variables and shared redistributions)"


@dataclass(frozen=True)
class Objective:
    """The bytes objective: `byte_sum` counts `unit` bytes, on top of `constant` bytes no choice
    changes."""

    byte_sum: object
    unit: int
    constant: int

    def bytes(self, value: float) -> int:
        """Bytes per device of an objective value or bound (a bound rounds up, staying a bound)."""
        return int(math.ceil(value)) * self.unit + self.constant


class SolverModel:
    """One-hot booleans per decided owner, unary bytes, pair variables per coarse edge, and
    linear memory expressions over the booleans; with `priced` False the edges only forbid their
    unreachable pairs (a model that bounds memory and prices nothing needs no pair variables).
    Building checks `deadline` before each edge and each wanted layout of a shared tensor
    (`deadline.TimeRanOut` when it has passed)."""

    def __init__(self, problem: SearchProblem, coarse: Coarsening, priced: bool = True, deadline: Deadline | None = None):
        self.problem, self.coarse = problem, coarse
        self.deadline = deadline or Deadline(float("inf"))
        self.model = cp_model.CpModel()
        self.x = {o: [self.model.NewBoolVar(f"{o}#{i}") for i in range(n)] for o, n in coarse.variables.items()}
        for variables in self.x.values():
            self.model.AddExactlyOne(variables)
        self.byte_terms: list[tuple[int, object]] = []  # (bytes, boolean)
        self.pairs: list[tuple[object, str, int, str, int]] = []  # (pair variable, first, a, second, b)
        self.derived: list[tuple[object, object]] = []  # (boolean, its value from a coarse choice)
        self.true = None  # a boolean fixed true, made when an owner without a choice needs one
        self.constant_bytes = coarse.constant
        gone = {e.owner for e in coarse.eliminated}
        for owner, values in coarse.unary.items():
            if owner not in gone:
                self._unary(owner, values)
        if not np.isfinite(self.constant_bytes):
            raise SolverError("the seeds cannot be connected: some edge between seeded ops has no redistribution")
        for edge in coarse.edges:
            self.deadline.check(BUILDING)
            self._edge(edge, priced)
        for fanout in coarse.fanouts:
            self.deadline.check(BUILDING)
            self._fanout(fanout, priced)

    def _unary(self, owner: str, values: np.ndarray) -> None:
        if owner not in self.x:
            self.constant_bytes += float(values[0])
            return
        for variable, value in zip(self.x[owner], values):
            if not np.isfinite(value):
                self.model.Add(variable == 0)
            elif value:
                self.byte_terms.append((int(value), variable))

    def _edge(self, edge: CoarseEdge, priced: bool) -> None:
        table, first, second = edge.table, self.x[edge.first], self.x[edge.second]
        finite = np.isfinite(table)
        for a, b in zip(*np.nonzero(~finite)):
            self.model.AddBoolOr([first[a].Not(), second[b].Not()])
        values = np.where(finite, table, 0).astype(np.int64)
        if values.max() == 0 or not priced:
            return
        # Pair variables whose marginals are the two ends' one-hot choices: the tightest linear
        # relaxation of a pairwise cost (the local polytope), which lets the solver prove bounds.
        pairs = {}
        for a, b in zip(*np.nonzero(values)):
            pairs[a, b] = self.model.NewBoolVar(f"{edge.first}~{edge.second}#{a},{b}")
            self.byte_terms.append((int(values[a, b]), pairs[a, b]))
            self.pairs.append((pairs[a, b], edge.first, int(a), edge.second, int(b)))
        rows, columns = values.shape
        for a in range(rows):
            free = [second[b] for b in range(columns) if (a, b) not in pairs]
            self._marginal([pairs[a, b] for b in range(columns) if (a, b) in pairs], first[a], free)
        for b in range(columns):
            free = [first[a] for a in range(rows) if (a, b) not in pairs]
            self._marginal([pairs[a, b] for a in range(rows) if (a, b) in pairs], second[b], free)

    def _literal(self, owner: str, index: int):
        """The boolean of `owner`'s kept candidate `index`: an owner without a choice has one."""
        if owner in self.x:
            return self.x[owner][index]
        if self.true is None:
            self.true = self.model.NewBoolVar("true")
            self.model.Add(self.true == 1)
            self.derived.append((self.true, lambda coarse: True))
        return self.true

    def _chosen(self, coarse: dict[str, int], owner: str, index: int) -> bool:
        return coarse.get(owner, 0) == index

    def _fanout(self, fanout: CoarseFanout, priced: bool) -> None:
        held = [self._literal(fanout.producer, i) for i in range(len(fanout.resting))]
        for owner, wants, table in fanout.readers:
            for i, j in zip(*np.nonzero(~np.isfinite(table))):
                self.model.AddBoolOr([held[i].Not(), self._literal(owner, j).Not()])
            for i in np.flatnonzero(fanout.resting) if priced else ():  # gathered per reader
                for j in np.flatnonzero(np.isfinite(table[i]) & (table[i] > 0)):
                    paid = self._implied([held[i], self._literal(owner, j)], f"{owner}@rest#{i},{j}",
                                         self._hint_of([(fanout.producer, i)], [(owner, int(j))]))
                    self.byte_terms.append((int(table[i, j]), paid))
        for target in range(fanout.costs.shape[1]) if priced else ():
            self.deadline.check(BUILDING)
            rows = [i for i in range(len(held)) if not fanout.resting[i] and np.isfinite(fanout.costs[i, target])
                    and fanout.costs[i, target] > 0]
            readers = [(owner, int(j)) for owner, wants, _ in fanout.readers for j in np.flatnonzero(wants == target)]
            if not rows or not readers:
                continue
            wanted = self.model.NewBoolVar(f"{fanout.producer}>{target}")
            literals = [self._literal(owner, j) for owner, j in readers]
            for literal in literals:
                self.model.AddImplication(literal, wanted)
            self.model.AddBoolOr([wanted.Not(), *literals])  # and no higher: every solution's bytes are exact
            self.derived.append((wanted, self._hint_of([], readers)))
            for i in rows:
                paid = self._implied([held[i], wanted], f"{fanout.producer}>{target}#{i}",
                                     self._hint_of([(fanout.producer, i)], readers))
                self.byte_terms.append((int(fanout.costs[i, target]), paid))

    def _hint_of(self, every: list[tuple[str, int]], some: list[tuple[str, int]]):
        """A boolean's value under a coarse choice: every (owner, index) of `every` chosen and
        some of `some`."""
        return lambda coarse: (all(self._chosen(coarse, o, j) for o, j in every)
                               and any(self._chosen(coarse, o, j) for o, j in some))

    def _implied(self, literals: list, name: str, value) -> object:
        """A boolean equal to the conjunction of `literals` (`value(coarse)` for hints): equal,
        not only forced, so that a solution found before the optimum counts its bytes exactly."""
        paid = self.model.NewBoolVar(name)
        self.model.AddBoolOr([literal.Not() for literal in literals] + [paid])
        for literal in literals:
            self.model.AddImplication(paid, literal)
        self.derived.append((paid, value))
        return paid

    def _marginal(self, paired, literal, free) -> None:
        """The pairs of one candidate plus its zero-cost partners sum to the candidate's boolean:
        zero-cost pairs need no variable, the other end's booleans stand in for them."""
        if paired:
            self.model.Add(sum(paired) <= literal)
            self.model.Add(sum(paired) + sum(free) >= literal)

    def memory(self) -> list:
        """The per-device bytes live at each step no other step dominates (`peaks`)."""
        forms = peak_forms(self.problem, self.coarse)
        variables = [self.x[owner][kept] for owner, kept in forms.columns]
        expressions = []
        for constant, used, values in forms.forms:
            terms = cp_model.LinearExpr.WeightedSum([variables[j] for j in used], values.tolist())
            expressions.append(terms + constant)
        return expressions

    def limit_memory(self, budget: int | None) -> None:
        """Every step's live bytes within `budget` (nothing when None)."""
        if budget is not None:
            for expression in self.memory():
                self.model.Add(expression <= int(budget))

    def minimize_bytes(self) -> Objective:
        """Minimise the bytes, in units of the coefficients' greatest common divisor (exact).
        CP-SAT refuses a model whose objective may leave 64 bits (MODEL_INVALID)."""
        coefficients = [c for c, _ in self.byte_terms]
        unit = math.gcd(*coefficients) or 1
        ceiling = sum(coefficients) // unit
        if ceiling >= OBJECTIVE_LIMIT:
            raise SolverError(f"the plan's bytes ({ceiling * unit:,} at most) are too large for CP-SAT's 64-bit objective")
        byte_sum = cp_model.LinearExpr.WeightedSum([v for _, v in self.byte_terms], [c // unit for c in coefficients])
        self.model.Minimize(byte_sum)
        return Objective(byte_sum, unit, int(self.constant_bytes))

    def minimize_flops(self, objective: Objective, byte_sum: int) -> bool:
        """Keep the bytes at `byte_sum` units and minimise the quantised flops instead; False when
        no owner's flops vary (nothing to order)."""
        terms = []
        for owner, variables in self.x.items():
            flops = self.coarse.flops[owner]
            low, high = flops.min(), flops.max()
            if high > low:
                quantised = np.floor((flops - low) / (high - low) * (TIE_LEVELS - 1)).astype(int)
                terms.extend(int(level) * v for level, v in zip(quantised, variables) if level)
        if not terms:
            return False
        self.model.Add(objective.byte_sum <= byte_sum)
        self.model.Minimize(cp_model.LinearExpr.Sum(terms))
        return True

    def hint(self, coarse: dict[str, int]) -> None:
        """Hint a kept index per owner (`Coarsening.coarse_hint`): the owners' booleans and the
        pair variables (a complete hint, which CP-SAT checks at once instead of searching for a
        completion)."""
        self.model.ClearHints()
        for owner, variables in self.x.items():
            for index, variable in enumerate(variables):
                self.model.AddHint(variable, coarse.get(owner) == index)
        for variable, first, a, second, b in self.pairs:
            self.model.AddHint(variable, coarse.get(first) == a and coarse.get(second) == b)
        for variable, value in self.derived:
            self.model.AddHint(variable, bool(value(coarse)))

    def solution(self, solver: cp_model.CpSolver) -> dict[str, int]:
        """The owners' kept indices in the solver's answer."""
        return {owner: next(i for i, v in enumerate(variables) if solver.Value(v)) for owner, variables in self.x.items()}

    def choice(self, solver: cp_model.CpSolver) -> dict[str, int]:
        """The solver's answer as a candidate index per op of the problem."""
        return self.coarse.expand(self.solution(solver))
