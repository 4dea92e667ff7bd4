"""`autostrat search` of a plan-space config: the fastest plan, in Megatron's pieces or the
op-level search's strategies, whose peak fits the device memory.

A plan-space config is an `autostrat estimate` config (`report.estimate`) without ``plan:``:
hardware, precision, model and ``global_batch``, with ``device_num`` (or ``--device-num``) and
optionally ``max_device_memory`` (default: the hardware profile's `device_memory`). The search
(cases):

- Candidates (`plan_candidates`, in this fixed order, which breaks ties): every ``tp`` dividing
  ``device_num`` up to the devices per server, every ``pp`` dividing what is left, up to the
  layers (the estimate splits the blocks over the stages as Megatron does, evenly or with fewer
  on the outermost stages: `models.megatron_plan.stage_layer_counts`), ``dp`` the rest (it must
  divide ``global_batch``), ``vp`` 1 or, with ``pp`` above 1, every count above 1 with
  ``pp · vp`` dividing the layers (Megatron's rule for interleaving; the interleaved schedule
  also runs its micro-batches in groups of ``pp``, `search.schedules`), ``sequence_parallel``
  off then on (on only with ``tp`` above 1), ``recompute`` none, selective, full, ``zero`` 0 then
  1 (1 only with ``dp`` above 1), and every ``micro_batch`` dividing ``global_batch / dp``;
  ``cp`` and ``ep`` stay 1. Values that would give the same plan as an earlier candidate are
  not generated. The op-level search's plan (no seeds: propagation, fitted into the budget by
  `frontend.run.fit_into`, the search's bounded refinement) is the last candidate.
- Memory pruning (`resident_bound`): a candidate whose parameters and optimiser state alone
  need more than the budget on its busiest device is not priced. The bound counts only the
  blocks' weight matrices, which Megatron's seeds split over exactly ``tp`` devices, at the
  bytes that live all step (`RESIDENT_BYTES`: Megatron's distributed optimizer's table without
  the gradients, which a peak need not hold all at once; 2 + 12/d in 16 bits, 4 + 8/d in fp32,
  d the ZeRO shard), spread evenly over the ``pp`` device groups; every stage holds at least that.
  With two micro-batches or more, the gradients too (`ACCUMULATED_BYTES`, 2 bytes each in 16
  bits, 4 in fp32): a step's gradient sums live from the first micro-batch's backward to the
  update (`search.stage_buffers`, case 2), next to the parameters and the optimiser state.
- Branch and bound on the step time (`report.plan_bound`: a lower bound on each candidate's
  predicted step, from its matrix products, tensor-parallel reductions and pipeline): the
  candidates are priced in increasing bound order (candidate order on a tie), and pricing
  stops at the first whose bound exceeds the fastest fitting step found (or equals it, coming
  later in candidate order): no candidate left could be chosen. The rest are pruned, unpriced.
- Pricing: each candidate by `report.estimate.estimate_given`, exactly as ``autostrat
  estimate`` prices the config with that ``plan:``; a candidate the estimate refuses (a ``tp``
  that does not divide the heads) keeps its reason. The op-level search's plan is priced by
  the same `estimate_of`. On several processes (`processes`, `report.plan_pricing`) the
  candidates are priced in the same order, the fastest fitting step found shared; each knows
  it later than one process would, so more may be priced, never fewer, and the branch and
  bound is run again over what was priced: the answer, the counts and the JSON are one
  process's. The op-level search's plan, when it comes first, is priced here while the
  workers price the rest.
- The answer: the candidate with the lowest predicted step time whose peak fits the budget, the
  first in candidate order on a tie: what pricing every candidate would choose; none fits: an
  `InfeasibleError` naming the budget and the smallest peak found, before anything is printed.
"""

from __future__ import annotations

import itertools
import json
import math
import time
from dataclasses import dataclass, replace

from autostrat.errors import AutostratError, ConfigError, InfeasibleError, SolverError
from autostrat.frontend.config import config_from_data
from autostrat.frontend.context import parse_bytes
from autostrat.frontend.run import fit_into, memory_budget, plan_config
from autostrat.frontend.yaml_text import parse_config_text
from autostrat.reading import read_text
from autostrat.redistribution import collector_paused
from autostrat.report.estimate import Estimate, GivenPlan, estimate_of, search_keys
from autostrat.report.plan_pricing import price_plans
from autostrat.report.plan_bound import ModelShape, op_level_bound, step_time_bound
from autostrat.search.prediction import format_nanoseconds
from autostrat.search.schedules import SPLIT_BACKWARD
from autostrat.strategies import divisors
from autostrat.tables import format_table

# Bytes per parameter that live for the whole step, from Megatron-LM's distributed optimizer
# table ("Distributed Optimizer" in its docs: fp16 4 + 16/d, bf16 6 + 12/d, fp32 8 + 8/d) without
# the gradients and fp16's main gradient, which a peak need not hold all at once (a parameter's
# update may run, and free them, before the last gradients exist; measured: four 22B candidates
# at tp 1, pp 4, dp 2 peaked below the table's bytes): (kept on every replica, split over the d
# replicas of the optimiser shard) for the parameter, its fp32 main copy and Adam's two moments.
RESIDENT_BYTES = {"fp16": (2, 12), "bf16": (2, 12), "fp32": (4, 8)}
ACCUMULATED_BYTES = {"fp16": 2, "bf16": 2, "fp32": 4}  # a gradient sum's bytes at least (16-bit or wider)
OP_LEVEL = "op-level search"
TIME_PRUNED = "pruned: the step takes at least"


def plan_candidates(device_num: int, global_batch: int, layers: int, devices_per_server: int) -> list[GivenPlan]:
    """Every plan of the ``plan:`` vocabulary on `device_num` devices (the module docstring's
    candidates, in its order).

    Example (4 devices, 2 layers, global batch 2: dp 4 does not divide the batch, pp 4 the layers):
        >>> plans = plan_candidates(4, 2, 2, 8)
        >>> len(plans), sorted({(plan.tp, plan.pp, plan.dp) for plan in plans})
        (42, [(1, 2, 2), (2, 1, 2), (2, 2, 1), (4, 1, 1)])
    """
    plans = []
    for tp, pp, dp in device_splits(device_num, global_batch, layers, devices_per_server):
        interleaves = [1] + [vp for vp in range(2, layers + 1) if pp > 1 and layers % (pp * vp) == 0]
        for vp, sequence_parallel, recompute, zero in itertools.product(
                interleaves, (False, True)[:1 + (tp > 1)], ("none", "selective", "full"), (0, 1)[:1 + (dp > 1)]):
            plans += [GivenPlan(tp, pp, dp, recompute, zero, micro_batch, global_batch, sequence_parallel, vp)
                      for micro_batch in divisors(global_batch // dp)
                      if vp == 1 or global_batch // (dp * micro_batch) % pp == 0]
    return plans


def device_splits(device_num: int, global_batch: int, layers: int, devices_per_server: int) -> list[tuple]:
    """Every ``(tp, pp, dp)`` with product `device_num`: tp up to a server, pp at most the
    layers (an uneven split holds fewer on the outermost stages), dp dividing the global batch;
    by tp, then pp, ascending.

    Example (8 devices, 4 per server, 2 layers, a batch of 4):
        >>> device_splits(8, 4, 2, 4)
        [(1, 2, 4), (2, 1, 4), (2, 2, 2), (4, 1, 2), (4, 2, 1)]
    """
    return [(tp, pp, device_num // (tp * pp)) for tp in divisors(min(device_num, devices_per_server))
            if device_num % tp == 0 for pp in divisors(device_num // tp)
            if pp <= layers and global_batch % (device_num // (tp * pp)) == 0]


def resident_bound(given: GivenPlan, matrix_parameters: int, precision: str) -> int:
    """A lower bound on the peak bytes per device of `given`: the parameters and optimiser
    state of the blocks' `matrix_parameters` weight elements (`RESIDENT_BYTES`), and their
    gradient sums with two micro-batches or more (`ACCUMULATED_BYTES`), split over ``tp``
    devices and evenly over the ``pp`` device groups.

    Example (22B's 21.7e9 block weights in fp16 on tp 8: 14 bytes each over 8 devices, 16 with
    4 micro-batches):
        >>> [resident_bound(GivenPlan(8, 1, 1, "full", 0, micro_batch, 4), 21_743_271_936, "fp16") for micro_batch in (4, 1)]
        [38050725888, 43486543872]
    """
    whole, sharded = RESIDENT_BYTES[precision]
    whole += ACCUMULATED_BYTES[precision] if given.micro_batches > 1 else 0
    shard = given.dp if given.zero else 1
    return math.ceil(matrix_parameters * (whole + sharded / shard) / (given.tp * given.pp))


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
                "peak_bytes_per_device": peak, "resident_bound_bytes": self.bound,
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
    order (`Priced`), the chosen one and the search's wall seconds (not printed: the text and the
    JSON of one config are the same every time)."""

    device_num: int
    budget: int
    budget_source: str
    priced: tuple
    best: Priced
    seconds: float

    def counts(self) -> dict:
        """Candidates per outcome: priced (with an estimate), pruned (by either bound; by the
        step-time bound alone in ``pruned_by_time``), refused, over the budget."""
        estimated = [one for one in self.priced if one.estimate is not None]
        return {"candidates": len(self.priced), "priced": len(estimated),
                "pruned": sum(one.reason.startswith("pruned") for one in self.priced),
                "pruned_by_time": sum(one.reason.startswith(TIME_PRUNED) for one in self.priced),
                "refused": sum(one.estimate is None and not one.reason.startswith("pruned") for one in self.priced),
                "over_budget": sum(one.peak_bytes > self.budget for one in estimated)}

    def to_dict(self) -> dict:
        figures = self.best.estimate.to_dict()
        return figures | {"plan": _vocabulary(self.best.given), "search": {
            "chosen": self.best.name(), "budget_bytes": self.budget, "budget_source": self.budget_source,
            **self.counts(), "candidates_priced": [one.to_dict(self.budget) for one in self.priced]}}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2) + "\n"

    def lines(self, path, shown: int = 10) -> list[str]:
        """The search's summary, the chosen plan's estimate and the `shown` fastest that fit."""
        counts = self.counts()
        lines = [f"{path}: plan-space search on {self.device_num} devices under {self.budget:,} bytes per device "
                 f"({self.budget_source}): {counts['candidates']} candidates, {counts['priced']} priced "
                 f"({counts['over_budget']} over the budget), {counts['pruned'] - counts['pruned_by_time']} pruned by the "
                 f"resident bound, {counts['pruned_by_time']} by the step-time bound, "
                 f"{counts['refused']} refused",
                 f"chosen: {self.best.name()}" + ("" if self.best.given else " (its strategies fit no plan: vocabulary)")]
        estimate = self.best.estimate.lines(path)
        if self.best.given is None:
            estimate[0] = f"{path}: {self.best.estimate.model} on {self.device_num} devices: the op-level search's strategies"
        fitting = sorted((one for one in self.priced if one.estimate is not None and one.peak_bytes <= self.budget),
                         key=lambda one: one.estimate.step_time_s)
        rows = [[one.name(), format_nanoseconds(round(one.estimate.step_time_s * 1e9)), f"{one.peak_bytes:,}"]
                for one in fitting[:shown]]
        return lines + estimate + [f"the {len(rows)} fastest that fit:",
                                   format_table(["plan", "step", "peak bytes per device"], rows, "  ")]


@collector_paused()  # one collection after the search, not one per estimate (`report.estimate.estimate_given`)
def search_plan_space(path, device_num: int | None = None, max_device_memory=None, progress=None,
                      processes: int = 1) -> PlanSearch:
    """The plan-space search of the config at `path` (the module docstring), on `device_num`
    devices (default: the config's) under `max_device_memory` bytes (default: the config's,
    else the hardware profile's memory), its candidates priced on `processes` processes (the
    same answer on any number: `report.plan_pricing`); `progress(done, total)` is called after
    each candidate is priced, and once all are priced or pruned.

    Example (a 2-layer GPT on 1 device: the fastest fitting plan is no slower than any priced):
        >>> found = search_plan_space("configs/estimate/gpt_small_search.yaml", device_num=1)
        >>> all(found.best.estimate.step_time_s <= one.estimate.step_time_s for one in found.priced
        ...     if one.estimate is not None and one.peak_bytes <= found.budget)
        True
    """
    started = time.perf_counter()
    text = read_text(path, "config")
    data, device_num, budget, global_batch = _search_values(parse_config_text(text, path), path, device_num,
                                                            max_device_memory)
    op_level = config_from_data(search_keys(data, path, global_batch) | {"device_num": device_num}, text, path, 1,
                                example_inputs=True)
    hardware, precision = op_level.context.hardware_profile(), op_level.context.precision
    budget, source = memory_budget(op_level.context, budget)
    matrices = sum(math.prod(parameter.shape) for block in op_level.net.blocks
                   for _, parameter in block.parameters_and_names() if len(parameter.shape) == 2)
    shape = ModelShape.of(op_level.net)
    candidates = plan_candidates(device_num, global_batch, shape.layers, hardware.devices_per_server)
    split = op_level.context.pipeline_schedule_chunks()[0] in SPLIT_BACKWARD  # the config's schedule, where vp is 1
    bounds = [step_time_bound(shape, given, hardware, precision, split and given.vp == 1) for given in candidates]
    bounds.append(op_level_bound(shape, device_num, global_batch, hardware, precision))
    order = sorted(range(len(bounds)), key=lambda index: (bounds[index], index))
    residents = [resident_bound(given, matrices, precision) for given in candidates]

    def op_level_plan() -> Priced:
        return _op_level(op_level, budget, device_num, global_batch)

    results, first = _priced_candidates(data, text, path, candidates, bounds, order, residents, budget, processes,
                                        progress, op_level_plan)
    priced, best = [None] * len(bounds), None  # best: (step ns, candidate index) of the fastest fitting so far
    for index in order:  # branch and bound again over what was priced: the answer of one process, whatever the count
        if best is not None and (bounds[index], index) > best:  # it, and every one after it, cannot be chosen
            priced[index] = _pruned(candidates, index, bounds[index], best, matrices, precision)
        elif index == len(candidates):
            priced[index] = replace(first[0] if first else op_level_plan(), time_bound=bounds[index])
        else:
            priced[index] = _candidate(candidates[index], residents[index], results, index, bounds[index])
        one = priced[index]
        if one.estimate is not None and one.peak_bytes <= budget and (best is None or (one.step_ns, index) < best):
            best = (one.step_ns, index)
    if progress is not None:
        progress(len(bounds), len(bounds))
    return PlanSearch(device_num, budget, source, tuple(priced), _best(priced, budget, path), time.perf_counter() - started)


def _pruned(candidates: list, index: int, bound: int, best: tuple, matrices: int, precision: str) -> Priced:
    """Candidate `index` (the op-level search's past the end of `candidates`), unpriced: its
    step-time `bound` already exceeds the fastest fitting step found (`best`: ns and index)."""
    given = candidates[index] if index < len(candidates) else None
    resident = resident_bound(given, matrices, precision) if given is not None else 0
    return Priced(given, bound=resident, time_bound=bound,
                  reason=f"{TIME_PRUNED} {format_nanoseconds(bound)}, no faster than the chosen "
                         f"{format_nanoseconds(best[0])}" + (" (which comes first)" if bound == best[0] else ""))


def _search_values(data: dict, path, device_num: int | None, max_device_memory) -> tuple:
    """A plan-space config's YAML `data` without the keys the search reads itself, and those:
    the device count (`device_num` over the config's), the budget in bytes (`max_device_memory`
    over the config's; None: the profile's) and the global batch, each checked."""
    if "plan" in data:
        raise ConfigError(f"{path}: plan: a config with a plan is estimated (autostrat estimate), not searched; "
                          f"leave plan out to search its plans")
    device_num = device_num or data.pop("device_num", None)
    data.pop("device_num", None)
    if isinstance(device_num, bool) or not isinstance(device_num, int) or device_num < 1:
        raise ConfigError(f"{path}: device_num: expected a positive integer (or --device-num), got {device_num!r}")
    budget = parse_bytes(max_device_memory if max_device_memory is not None else data.pop("max_device_memory", None))
    data.pop("max_device_memory", None)
    global_batch = data.get("global_batch")
    if isinstance(global_batch, bool) or not isinstance(global_batch, int) or global_batch < 1:
        raise ConfigError(f"{path}: global_batch: expected a positive integer, got {global_batch!r}")
    return data, device_num, budget, global_batch


def _priced_candidates(data: dict, text: str, path, candidates: list, bounds: list, order: list, residents: list,
                       budget: int, processes: int, progress, op_level_plan) -> tuple[dict, list]:
    """The candidates within the budget by their resident bound, priced by branch and bound in
    `order` on `processes` processes (`price_plans`): {candidate index: estimate, reason, or None
    where unpriced}; and the op-level search's plan in a list when it comes first, priced here
    (`op_level_plan`) while the workers price the rest (else an empty list)."""
    op_index, first = len(candidates), []

    def op_level_first() -> tuple | None:
        first.append(op_level_plan())
        fits = first[0].estimate is not None and first[0].peak_bytes <= budget
        return (first[0].step_ns, op_index) if fits else None

    done = itertools.count(1)

    def heard(given, found) -> None:
        if progress is not None:
            progress(next(done), len(bounds))

    wanted = [index for index in order if index != op_index and residents[index] <= budget]
    found = price_plans(data, text, path, [candidates[index] for index in wanted], processes, heard,
                        [(bounds[index], index) for index in wanted], budget, op_level_first if order[0] == op_index else None)
    return dict(zip(wanted, found)), first


def _candidate(given: GivenPlan, resident: int, results: dict, index: int, time_bound: int) -> Priced:
    """Candidate `index`, pruned by its `resident` bound, or as `price_plans` priced it
    (`results`: its detached estimate, or the estimate's reason to refuse it)."""
    if index not in results:
        return Priced(given, bound=resident, time_bound=time_bound,
                      reason=f"pruned: parameters and optimiser state need at least {resident:,} bytes")
    found = results[index]
    if found is None:  # `price_plans` prices every candidate one process would
        raise AssertionError(f"candidate {index} was not priced, though branch and bound needs it")
    if isinstance(found, str):
        return Priced(given, bound=resident, time_bound=time_bound, reason=f"refused: {found}")
    return Priced(given, found, resident, time_bound=time_bound)


def _op_level(config, budget: int, device_num: int, global_batch: int) -> Priced:
    """The op-level search's plan of `config` (no seeds) as a candidate: the unbounded plan, or
    the one searched under `budget` when that one peaks over (`frontend.run.fit_into`; when
    none is found, proven or within the refinement's time limit, the unbounded one, over the
    budget)."""
    given = GivenPlan(1, 1, device_num, "none", 0, 1, global_batch)  # only its device and batch counts are read
    try:
        plan, notes = plan_config(config)
    except AutostratError as error:
        return Priced(None, reason=f"refused: {error}")
    try:
        plan, _ = fit_into(config, plan, notes, budget=budget)
    except (InfeasibleError, SolverError):  # none found under the budget (proven, or not within the time limit)
        pass  # priced as it is: over the budget, its peak among those the error names
    return Priced(None, estimate_of(plan, config.net, given))


def _best(priced: list, budget: int, path) -> Priced:
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
        found = (f"none could be priced; the smallest resident bound is {smallest.bound:,} bytes ({smallest.name()}), "
                 f"and the {OP_LEVEL} was {priced[-1].reason}")
    raise InfeasibleError(f"{path}: no plan of the {len(priced)} candidates fits {budget:,} bytes per device: {found}")
