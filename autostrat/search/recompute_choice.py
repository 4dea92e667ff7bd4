"""Recompute searched under a memory budget: how many repeated layers to recompute.

Recomputing a layer (`autodiff.recompute`) trades its saved activations for one more forward
of it inside the backward. Repeated layers are alike, so the choice is a count: ``k`` layers,
the first ``k`` in forward order (Megatron's "block" method: the earliest layers hold their
activations longest). Each count is a different training graph, planned by the whole search
(BFS, then CP-SAT under the budget); `choose_recompute` tries counts and keeps the plan with the
lowest predicted cost (step time, or bytes) among those that fit:

1. Without a budget nothing is gained by recomputing: the count is 0.
2. The fewest layers that let a plan fit, by bisection: a plan that fits with ``k`` layers
   recomputed still fits with one more (the same strategies, the new layer's copies following
   its forward ops, hold no more at any step), so whether a count fits is monotone in it.
3. From there, one more layer at a time while the cost does not rise (each count adds
   recompute time but frees memory the solver may spend on faster strategies), stopping at the
   first count that costs more than the best so far; among equal costs the fewest layers win.

The cheapest of every count tried that fits wins (fewest layers on a tie). So the fewest layers
that fit are found exactly, and the cheapest count when the cost over the counts that fit first
falls, then rises (the usual shape: the freed memory buys less and less while each layer's
recompute costs the same); the counts tried and what each gave are kept
(`RecomputeChoice.trials`) for the report.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from autostrat.errors import InfeasibleError, SolverError
from autostrat.search.plan import Plan
from autostrat.search.problem import layers_of


@dataclass(frozen=True)
class RecomputeTrial:
    """One count tried: its plan's cost and peak, or why no plan fits (`refused`)."""

    count: int
    cost: int | None = None
    peak: int | None = None
    refused: str = ""

    def describe(self, unit: str) -> str:
        if self.cost is None:
            return f"{self.count}: no plan ({self.refused})"
        found = f"{self.count}: {self.cost:,} {unit}, peak {self.peak:,} bytes"
        return found + (f" ({self.refused})" if self.refused else "")


@dataclass(frozen=True)
class RecomputeChoice:
    """The recomputed layers chosen among `layers` (forward order) and every count tried."""

    layers: tuple[str, ...]
    count: int
    trials: tuple[RecomputeTrial, ...]
    unit: str = "ns"

    @property
    def cells(self) -> tuple[str, ...]:
        return self.layers[: self.count]

    def to_dict(self) -> dict:
        return {"layers": list(self.layers), "count": self.count, "unit": self.unit,
                "trials": [{"count": t.count, "cost": t.cost, "peak": t.peak, "refused": t.refused} for t in self.trials]}

    def summary(self) -> str:
        """One line for the report.

        Example:
            >>> trials = (RecomputeTrial(0, refused="over budget"), RecomputeTrial(2, 900, 10), RecomputeTrial(1, 800, 12))
            >>> RecomputeChoice(("blocks.0", "blocks.1"), 1, trials).summary()
            'recompute searched: 1 of 2 layers (blocks.0); counts tried: 0: no plan (over budget); 2: 900 ns, peak 10 bytes; 1: 800 ns, peak 12 bytes'
        """
        cells = self.cells
        chosen = "none" if not cells else ", ".join(cells) if len(cells) <= 2 else f"{cells[0]} to {cells[-1]}"
        tried = "; ".join(trial.describe(self.unit) for trial in self.trials)
        return f"recompute searched: {self.count} of {len(self.layers)} layers ({chosen}); counts tried: {tried}"


def repeated_layers(names) -> tuple[str, ...]:
    """The cell paths of the repeated layers (`problem.layers_of`) among the op `names`, in the
    order their first op appears.

    Example:
        >>> repeated_layers(["embed", "blocks.0.mm", "blocks.1.mm", "blocks.0x", "head"])
        ('blocks.0', 'blocks.1')
    """
    names = list(names)
    first = {}
    for prefix, layers in layers_of(names).items():
        for index, ops in layers.items():
            first[f"{prefix}.{index}"] = min(names.index(op) for op in ops.values())
    return tuple(sorted(first, key=first.get))


def plan_cost(plan: Plan) -> int:
    """What the search minimised for `plan`: its predicted step time (ns) or bytes per device."""
    return plan.prediction.step_time_ns if plan.cost_model == "time" else plan.total_bytes


def choose_recompute(plan_with: Callable[[tuple[str, ...]], Plan], layers: tuple[str, ...],
                     budget: int | None) -> tuple[Plan, RecomputeChoice]:
    """The cheapest plan found over recompute counts (see the module), where ``plan_with(cells)``
    plans the training graph with `cells` recomputed; raises the last count's error when no
    count gives a plan that fits `budget`.

    Example (a budget no count can meet, then none at all):
        >>> from autostrat.search.plan import Plan
        >>> def plan_with(cells):
        ...     raise InfeasibleError(f"{len(cells)} recomputed: over budget")
        >>> choose_recompute(plan_with, ("blocks.0", "blocks.1"), 100)
        Traceback (most recent call last):
        autostrat.errors.InfeasibleError: 2 recomputed: over budget
    """
    trials: dict[int, tuple[RecomputeTrial, Plan | None, Exception | None]] = {}

    def attempt(count: int) -> bool:
        if count not in trials:
            try:
                plan = plan_with(layers[:count])
            except InfeasibleError as error:
                trials[count] = (RecomputeTrial(count, refused="proven not to fit"), None, error)
            except SolverError as error:
                trials[count] = (RecomputeTrial(count, refused="none found within the time limit"), None, error)
            else:
                peak = plan.prediction.peak_bytes
                if budget is not None and peak > budget:
                    trials[count] = (RecomputeTrial(count, plan_cost(plan), peak, "over the budget"), None, None)
                else:
                    trials[count] = (RecomputeTrial(count, plan_cost(plan), peak), plan, None)
        return trials[count][1] is not None

    if budget is None:
        fewest = 0 if attempt(0) else None
    else:
        fewest = _fewest_fitting(attempt, len(layers))
    if fewest is None:
        trial, _, error = trials[0 if budget is None else len(layers)]
        raise error or InfeasibleError(f"no plan fits max_device_memory = {budget:,} bytes per device even with all "
                                       f"{len(layers)} repeated layers recomputed: {trial.refused}")
    best = count = fewest
    while budget is not None and count < len(layers):
        count += 1
        if not attempt(count) or trials[count][0].cost > trials[best][0].cost:
            break
        if trials[count][0].cost < trials[best][0].cost:
            best = count
    # Every count tried that fits competes, those the bisection met included (a solver stopped
    # by its time limit does not always give costs that fall, then rise).
    best = min((count for count, (_, plan, _) in trials.items() if plan is not None), key=lambda c: (trials[c][0].cost, c))
    unit = "ns" if trials[best][1].cost_model == "time" else "bytes"
    order = tuple(trial for trial, _, _ in trials.values())
    return trials[best][1], RecomputeChoice(layers, best, order, unit)


def _fewest_fitting(fits: Callable[[int], bool], most: int) -> int | None:
    """The smallest count in ``0..most`` that `fits` (monotone: once true, true above), None if
    even `most` does not."""
    if fits(0):
        return 0
    if not fits(most):
        return None
    low, high = 0, most  # fits(low) is false, fits(high) true
    while high - low > 1:
        middle = (low + high) // 2
        if fits(middle):
            high = middle
        else:
            low = middle
    return high
