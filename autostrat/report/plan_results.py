"""A plan-space search's results (`report.plan_space`): each candidate priced, pruned, refused
or left unpriced at the time limit (`Priced`), and the search's answer (`PlanSearch`), its
text and its JSON."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

from autostrat.errors import InfeasibleError
from autostrat.report.estimate import Estimate, GivenPlan
from autostrat.search.prediction import format_nanoseconds
from autostrat.tables import format_table

OP_LEVEL = "op-level search"
TIME_PRUNED = "pruned: the step takes at least"
NOT_PRICED = "not priced: the time limit"


@dataclass(frozen=True)
class Priced:
    """One candidate: its plan (None: the op-level search's), its resident `bound` (bytes) and
    step-time bound (`time_bound`, nanoseconds), and its estimate, or the reason it has none
    (pruned by a bound, or refused by the estimate)."""

    given: GivenPlan | None
    estimate: Estimate | None = None
    bound: int = 0
    reason: str = ""
    time_bound: int = 0

    @property
    def step_ns(self) -> int | None:
        """The estimate's step in whole nanoseconds (the sum `Estimate.step_time_s` divides)."""
        return None if self.estimate is None else sum(self.estimate.phases_ns.values())

    @property
    def peak_bytes(self) -> int | None:
        return None if self.estimate is None else max(stage.peak_bytes for stage in self.estimate.memory)

    def name(self) -> str:
        given = self.given
        if given is None:
            return OP_LEVEL
        return (f"tp {given.tp} pp {given.pp} vp {given.vp} dp {given.dp}{' sp' if given.sequence_parallel else ''} "
                f"recompute {given.recompute} zero {given.zero} mb {given.micro_batch}")

    def to_dict(self, budget: int) -> dict:
        peak = self.peak_bytes
        status = self.reason or ("fits" if peak <= budget else "over the budget")
        return {"plan": _vocabulary(self.given), "step_time_s": None if self.estimate is None else self.estimate.step_time_s,
                "peak_bytes_per_device": peak, "memory_floor_bytes": self.bound,
                "step_time_bound_s": self.time_bound / 1e9, "status": status}


def _vocabulary(given: GivenPlan | None) -> dict | None:
    """`given` in the ``plan:`` vocabulary (what a config's ``plan:`` section would say)."""
    if given is None:
        return None
    return {"tp": given.tp, "pp": given.pp, "vp": given.vp, "dp": given.dp, "cp": given.cp, "ep": 1,
            "sequence_parallel": given.sequence_parallel, "recompute": given.recompute, "zero": given.zero,
            "micro_batch": given.micro_batch}


@dataclass(frozen=True)
class PlanSearch:
    """A plan-space search's result: the budget and where it came from, every candidate in
    order (`Priced`), the chosen one, the search's wall seconds (not printed: the text and the
    JSON of one config are the same every time) and its time limit (None: none; with one, what
    was priced depends on the machine's speed)."""

    device_num: int
    budget: int
    budget_source: str
    priced: tuple
    best: Priced
    seconds: float
    time_limit: float | None = None

    def unpriced_bound(self) -> int | None:
        """The least step-time bound (ns) of the candidates the time limit left unpriced, or None."""
        bounds = [one.time_bound for one in self.priced if one.reason.startswith(NOT_PRICED)]
        return min(bounds) if bounds else None

    def gap(self) -> float:
        """How far above the fastest fitting plan of the space the chosen one can be, at most
        (0: the chosen plan is the fastest, proven): its step over the least bound left unpriced."""
        bound = self.unpriced_bound()
        return 0.0 if bound is None or bound >= self.best.step_ns else self.best.step_ns / max(bound, 1) - 1

    def counts(self) -> dict:
        """Candidates per outcome: priced (with an estimate), pruned (by either bound; by the
        step-time bound alone in ``pruned_by_time``), refused, over the budget, left unpriced by
        the time limit."""
        estimated = [one for one in self.priced if one.estimate is not None]
        return {"candidates": len(self.priced), "priced": len(estimated),
                "pruned": sum(one.reason.startswith("pruned") for one in self.priced),
                "pruned_by_time": sum(one.reason.startswith(TIME_PRUNED) for one in self.priced),
                "refused": sum(one.reason.startswith("refused") for one in self.priced),
                "over_budget": sum(one.peak_bytes > self.budget for one in estimated),
                "not_priced": sum(one.reason.startswith(NOT_PRICED) for one in self.priced)}

    def to_dict(self) -> dict:
        figures = self.best.estimate.to_dict()
        return figures | {"plan": _vocabulary(self.best.given), "search": {
            "chosen": self.best.name(), "budget_bytes": self.budget, "budget_source": self.budget_source,
            **self.counts(), "time_limit_s": self.time_limit, "gap": self.gap(),
            "candidates_priced": [one.to_dict(self.budget) for one in self.priced]}}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2) + "\n"

    def lines(self, path, shown: int = 10) -> list[str]:
        """The search's summary, the chosen plan's estimate and the `shown` fastest that fit."""
        counts = self.counts()
        lines = [f"{path}: plan-space search on {self.device_num} devices under {self.budget:,} bytes per device "
                 f"({self.budget_source}): {counts['candidates']} candidates, {counts['priced']} priced "
                 f"({counts['over_budget']} over the budget), {counts['pruned'] - counts['pruned_by_time']} pruned by the "
                 f"memory floor, {counts['pruned_by_time']} by the step-time bound, "
                 f"{counts['refused']} refused",
                 f"chosen: {self.best.name()}" + ("" if self.best.given else " (its strategies fit no plan: vocabulary)")]
        if counts["not_priced"]:
            bound = self.unpriced_bound()
            lines.insert(1, f"stopped at the {self.time_limit:g} s time limit: {counts['not_priced']} candidates not priced, "
                            f"their least step-time bound {format_nanoseconds(bound)}: " + (
                                "none can be faster, so the chosen plan is the fastest of the space" if not self.gap() else
                                f"the chosen plan is at most {self.gap():.1%} slower than the fastest of the space"))
        estimate = self.best.estimate.lines(path)
        if self.best.given is None:
            estimate[0] = f"{path}: {self.best.estimate.model} on {self.device_num} devices: the op-level search's strategies"
        fitting = sorted((one for one in self.priced if one.estimate is not None and one.peak_bytes <= self.budget),
                         key=lambda one: one.estimate.step_time_s)
        rows = [[one.name(), format_nanoseconds(round(one.estimate.step_time_s * 1e9)), f"{one.peak_bytes:,}"]
                for one in fitting[:shown]]
        return lines + estimate + [f"the {len(rows)} fastest that fit:",
                                   format_table(["plan", "step", "peak bytes per device"], rows, "  ")]


def best_of(priced: list, budget: int, path) -> Priced:
    """The fastest candidate that fits `budget` (the first on a tie), else the error saying none does."""
    fitting = [one for one in priced if one.estimate is not None and one.peak_bytes <= budget]
    if fitting:
        return min(fitting, key=lambda one: one.estimate.step_time_s)  # min keeps the first of equals
    estimated = [one for one in priced if one.estimate is not None]
    if estimated:
        smallest = min(estimated, key=lambda one: one.peak_bytes)
        found = f"the smallest peak found is {smallest.peak_bytes:,} bytes per device ({smallest.name()})"
    else:
        smallest = min(priced, key=lambda one: one.bound or math.inf)
        found = (f"none could be priced; the smallest memory floor is {smallest.bound:,} bytes ({smallest.name()}), "
                 f"and the {OP_LEVEL} was {priced[-1].reason}")
    unpriced = sum(one.reason.startswith(NOT_PRICED) for one in priced)
    within = f" priced within the time limit ({unpriced} of them not priced)" if unpriced else ""
    raise InfeasibleError(f"{path}: no plan of the {len(priced)} candidates{within} fits {budget:,} bytes per device: {found}")
