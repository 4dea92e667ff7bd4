"""Why an op of a plan has its strategy, and what its best alternatives would change.

`explain(plan, op)` answers two questions (`autostrat explain PLAN.json OP`):

- how the op got its strategy: the chain its origin names, hop by hop back to a seed (or to the
  default, or to the CP-SAT refinement that chose it), with the tensors joining each hop and
  the bytes the plan redistributes on them;
- its best alternatives: every other candidate the search could have given it, ranked by the
  LOCAL change in bytes (the redistributions into and out of this op, its neighbours kept),
  the best few evaluated EXACTLY by rebuilding the whole plan with only this op changed, and
  why each lost (or, when it is better in the plan's own cost model, that it is better).

Candidates are the search's (`search.problem`): the splits of the "auto" mesh and of the
seeds; repeated calculation only in auto_parallel (as sharding_propagation weighs it) or when
the op's own strategy repeats. ZeRO-3's at-rest variants are not offered as alternatives.
"""

from __future__ import annotations

import difflib
from dataclasses import asdict, dataclass

from autostrat.errors import ConfigError
from autostrat.report.alternatives import (Alternative, CandidateSpace, by_phase, evaluated_alternative, ranked_alternatives,
                                          signed, signed_time)
from autostrat.search.bounds import CITATION, FLAG, op_bound
from autostrat.search.plan import Plan
from autostrat.search.propagate import SEED
from autostrat.search.search import follow_parameters
from autostrat.tables import format_table

# Origin prefixes (`search.propagate`, `search.follow_parameters`) naming where a strategy came from.
_LEADS = ("propagated from ", "follows ", "backward of ")


@dataclass(frozen=True)
class Hop:
    """One op of a chain: its strategy and origin, and how it joins the next op of the chain
    (`source`, the op it got its strategy from): the tensors between the two and the bytes the
    plan's redistributions of those tensors into either op send (None: the chain ends here)."""

    op: str
    strategy: str
    origin: str
    source: str | None = None
    tensors: tuple[str, ...] = ()
    bytes: int = 0


@dataclass(frozen=True)
class Explanation:
    """Why `op` has `strategy` (`origin`, the `chain` back to its seed) and its `alternatives`
    (the evaluated ones first, in rank order; `candidates` counts every other candidate)."""

    op: str
    op_type: str
    strategy: str
    origin: str
    chain: tuple[Hop, ...]
    alternatives: tuple[Alternative, ...]
    candidates: int
    notes: tuple[str, ...] = ()
    searched: bool = True  # False for an update op, which follows its parameter
    rebuilt: str = ""  # what else a rebuilt plan changes (a training graph's update ops)

    def to_dict(self) -> dict:
        return asdict(self)

    @property
    def text(self) -> str:
        """What `autostrat explain` prints."""
        lines = [f"{self.op}  {self.op_type}  {self.strategy}", f"origin: {self.origin}"]
        if len(self.chain) > 1:
            rows = [[h.op, h.strategy, h.origin, " ".join(h.tensors) or ("-" if h.source else ""),
                     f"{h.bytes:,}" if h.source else ""] for h in self.chain]
            lines += ["how it got its strategy (each op from the next one):",
                      format_table(["op", "strategy", "origin", "via tensors", "bytes"], rows, indent="  ")]
        lines += [f"note: {note}" for note in self.notes]
        evaluated = [a for a in self.alternatives if a.evaluated]
        if not evaluated and self.alternatives:
            rows = [[a.strategy, signed(a.local_bytes)] for a in self.alternatives[:3]]
            lines += [f"best alternatives by the local change in bytes ({len(rows)} of {self.candidates} other candidates):",
                      format_table(["strategy", "local bytes"], rows, indent="  ")]
            return "\n".join(lines)
        if not evaluated:
            why = "no other candidate" if self.searched else "not searched"
            lines.append(f"alternatives: none ({why})")
            return "\n".join(lines)
        lines.append(f"best alternatives ({len(evaluated)} of {self.candidates} other candidates, ranked by the local "
                     f"change in bytes, evaluated by rebuilding the plan with only this op changed{self.rebuilt}):")
        rows = [[a.strategy, signed(a.local_bytes), signed(a.bytes) + by_phase(a.phase_bytes),
                 signed_time(a.step_time_ns), signed(a.peak_bytes)] for a in evaluated]
        lines.append(format_table(["strategy", "local bytes", "bytes per step", "step time", "peak memory"], rows, indent="  "))
        lines += [f"  {a.strategy}: {a.reason}" for a in evaluated]
        return "\n".join(lines)


def explain(plan: Plan, op: str, alternatives: int = 3) -> Explanation:
    """Why `op` of `plan` has its strategy, and its best `alternatives` (see the module docstring).

    Example (the tutorial FFN: its second matmul follows the seed through ReLU; splitting it
    otherwise sends more):
        >>> from autostrat.models import tutorial_plan
        >>> plan = tutorial_plan()
        >>> why = explain(plan, "dense2.matmul", alternatives=1)
        >>> why.origin, [hop.op for hop in why.chain][-1]
        ('propagated from relu', 'dense1.matmul')
        >>> why.alternatives[0].strategy, why.alternatives[0].bytes
        ('((8, 1), (1, 1))', -3072)
    """
    if op not in plan.ops:
        close = difflib.get_close_matches(op, list(plan.ops), n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise ConfigError(f"the plan has no op named {op!r}{hint}")
    current, space = plan.ops[op], CandidateSpace.of(plan)
    chain = _chain(plan, op)
    notes = _notes(plan, op, space.followers)
    ranked = ranked_alternatives(plan, op, space)
    if plan.pipeline is not None and ranked:
        # Rebuilding a stage's plan with one op changed would need its stage split searched again.
        notes += ("a pipeline plan's alternatives are ranked by the local change in bytes only, not evaluated "
                  "by rebuilding the plan",)
        alternatives = 0
    evaluated = tuple(evaluated_alternative(plan, op, strategy, local) for strategy, local in ranked[:alternatives])
    rest = tuple(Alternative(str(strategy), local) for strategy, local in ranked[alternatives:])
    return Explanation(op, current.op_type, str(current.strategy), _origin(plan, op), chain, evaluated + rest,
                       len(ranked), notes, op not in space.followers,
                       "; backward ops keep theirs, update ops follow their parameters" if plan.graph.updates else "")


def _changed(plan: Plan) -> frozenset[str]:
    return frozenset(plan.refinement.changed) if plan.refinement else frozenset()


def _origin(plan: Plan, op: str) -> str:
    """The op's origin as a person reads it: the search's, or the refinement's (CP-SAT or the IOPDDL solver)."""
    origin = plan.ops[op].origin
    if op not in _changed(plan):
        return origin
    result = plan.refinement.result
    by = "the CP-SAT" if result.solver == "CP-SAT" else result.solver + "'s"
    return (f"chosen by {by} refinement (objective {plan.refinement.before:,} -> {result.objective:,} "
            f"{plan.refinement.unit} per device, {result.status}, gap {result.gap:.2%}); before it: {origin}")


def _notes(plan: Plan, op: str, followers: dict[str, str]) -> tuple[str, ...]:
    notes = []
    if plan.refinement and op not in _changed(plan):
        notes.append(f"the plan was refined by {plan.refinement.result.solver}, which kept this op's strategy")
    if op in followers:
        reader = plan.graph.consumers(followers[op])[0][0]
        notes.append(f"an update op runs in its parameter's layout and is not searched: it changes only with "
                     f"{followers[op]}'s first reader, {reader}")
    elif plan.ops[op].origin == SEED:
        notes.append("a seed fixes this op: the search never changes it; alternatives are what it could have been")
    bound = op_bound(plan, op)
    if bound is not None:
        notes.append(_bound_note(bound))
    return tuple(notes)


def _bound_note(bound) -> str:
    """The op's lower bound against what the plan charges it (`search.bounds`), flagged above FLAG."""
    if bound.ratio is None:
        return (f"lower bound 0 bytes per device ({bound.bound.regime}: {CITATION}); the plan charges this op "
                f"{bound.charged:,} bytes")
    flag = f": above {FLAG}×, flagged" if bound.ratio > FLAG else ""
    return (f"the plan charges this op {bound.charged:,} bytes per device, {bound.ratio:.2f}× its lower bound of "
            f"{bound.bound.bytes:,.0f} ({bound.bound.regime}; {CITATION}){flag}")


def _source(plan: Plan, op: str) -> str | None:
    """The op `op`'s origin names as where its strategy came from (a parameter's first reader
    for an update op), or None when it names none."""
    origin = plan.ops[op].origin.split(", ")[0]
    lead = next((lead for lead in _LEADS if origin.startswith(lead)), None)
    if lead is None:
        return None
    source = origin.removeprefix(lead)
    if source in plan.ops:
        return source
    if source in plan.graph.tensors and plan.graph.consumers(source):
        reader = plan.graph.consumers(source)[0][0]  # an update op follows its parameter's first reader
        return reader if reader != op else None
    return None


def _chain(plan: Plan, op: str) -> tuple[Hop, ...]:
    """From `op` along the sources its origins name, until a seed, the default, an op the
    CP-SAT refinement chose, or an op already on the chain (a cycle)."""
    hops, seen, changed = [], set(), _changed(plan)
    name = op
    while name is not None and name not in seen:
        seen.add(name)
        source = None if name in changed else _source(plan, name)
        tensors = _joining(plan, name, source) if source else ()
        hops.append(Hop(name, str(plan.ops[name].strategy), _origin(plan, name), source, tensors,
                        _bytes_between(plan, name, source, tensors) if source else 0))
        name = source
    return tuple(hops)


def _joining(plan: Plan, first: str, second: str) -> tuple[str, ...]:
    """The tensors one of the two ops produces and the other reads, or both read (a parameter)."""
    ops = plan.graph.ops
    a, b = ops[first], ops[second]
    flowing = [t for t in a.outputs if t in b.inputs] + [t for t in b.outputs if t in a.inputs]
    shared = [t for t in a.inputs if t in b.inputs and plan.graph.tensors[t].producer is None]
    return tuple(dict.fromkeys(flowing + shared))


def _bytes_between(plan: Plan, first: str, second: str, tensors: tuple[str, ...]) -> int:
    return sum(edge.cost for edge in plan.redistributions if edge.tensor in tensors and edge.consumer in (first, second))
