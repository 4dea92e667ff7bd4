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
- Memory pruning (`report.memory_floor.peak_floor`): a candidate whose memory floor exceeds the
  budget is not priced. The floor is a lower bound on the estimate's peak on each device group:
  the blocks' weights there at the bytes that live all step (Megatron's distributed optimizer's
  table without the gradients), their gradient sums once a micro-batch's backward has made
  them, and the activations the micro-batches in flight in the schedule keep for their backward.
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
- A time limit (``time_limit``, ``autostrat search --time-limit``): no candidate is claimed
  after it (the estimates under way then end; the workers' are dropped), and the op-level
  search's plan comes last, its refinement within what is left. The answer is the fastest
  fitting plan priced; the candidates left unpriced say so, and the least of their step-time
  bounds says how much faster than the answer the space's fastest plan can be (`PlanSearch.gap`:
  0 when none can be faster, which is then proven). The bound order finds fast plans early (22B
  of the published runs: the fastest at the 18th of 129 candidates priced), and the rest of a
  full search proves it. What is priced within a limit depends on the machine's speed, so the
  answer may too.
"""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import replace

from autostrat.errors import AutostratError, ConfigError, InfeasibleError, SolverError
from autostrat.frontend.config import config_from_data
from autostrat.frontend.context import parse_bytes
from autostrat.frontend.run import fit_into, memory_budget, plan_config
from autostrat.frontend.yaml_text import parse_config_text
from autostrat.reading import read_text
from autostrat.redistribution import collector_paused
from autostrat.report.estimate import GivenPlan, estimate_of, search_keys
from autostrat.report.plan_pricing import price_plans
from autostrat.report.plan_results import NOT_PRICED, TIME_PRUNED, PlanSearch, Priced, best_of
from autostrat.report.memory_floor import LayerActivations, block_weights, peak_floor
from autostrat.report.plan_bound import ModelShape, op_level_bound, step_time_bound
from autostrat.search.prediction import format_nanoseconds
from autostrat.search.schedules import SPLIT_BACKWARD
from autostrat.strategies import divisors

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


@collector_paused()  # one collection after the search, not one per estimate (`report.estimate.estimate_given`)
def search_plan_space(path, device_num: int | None = None, max_device_memory=None, progress=None,
                      processes: int = 1, time_limit: float | None = None) -> PlanSearch:
    """The plan-space search of the config at `path` (the module docstring), on `device_num`
    devices (default: the config's) under `max_device_memory` bytes (default: the config's,
    else the hardware profile's memory), its candidates priced on `processes` processes (the
    same answer on any number: `report.plan_pricing`), within `time_limit` seconds if given
    (the module docstring's last case); `progress(done, total)` is called after each candidate
    is priced, and once all are priced or pruned.

    Example (a 2-layer GPT on 1 device: the fastest fitting plan is no slower than any priced):
        >>> found = search_plan_space("configs/estimate/gpt_small_search.yaml", device_num=1)
        >>> all(found.best.estimate.step_time_s <= one.estimate.step_time_s for one in found.priced
        ...     if one.estimate is not None and one.peak_bytes <= found.budget)
        True
    """
    started, deadline = time.perf_counter(), None if time_limit is None else time.time() + time_limit
    text = read_text(path, "config")
    data, device_num, budget, global_batch = _search_values(parse_config_text(text, path), path, device_num,
                                                            max_device_memory)
    op_level = config_from_data(search_keys(data, path, global_batch) | {"device_num": device_num}, text, path, 1,
                                example_inputs=True)
    hardware, precision = op_level.context.hardware_profile(), op_level.context.precision
    budget, source = memory_budget(op_level.context, budget)
    weights = block_weights(op_level.net)
    shape = ModelShape.of(op_level.net)
    candidates = plan_candidates(device_num, global_batch, shape.layers, hardware.devices_per_server)
    schedule = op_level.context.pipeline_schedule_chunks()[0]  # the config's, where vp is 1
    split = schedule in SPLIT_BACKWARD
    bounds = [step_time_bound(shape, given, hardware, precision, split and given.vp == 1) for given in candidates]
    bounds.append(op_level_bound(shape, device_num, global_batch, hardware, precision))
    order = sorted(range(len(bounds)), key=lambda index: (bounds[index], index))
    activations = LayerActivations.of(op_level.net)
    floors = [peak_floor(given, weights, precision, activations, shape.seq, schedule) for given in candidates]

    def op_level_plan() -> Priced | None:  # with a time limit: its refinement within what is left, if anything is (else None)
        left = math.inf if deadline is None else deadline - time.time()
        if left <= 0:
            return None
        limited = replace(op_level.context, refine_time_limit=min(op_level.context.refine_time_limit, left))
        return _op_level(replace(op_level, context=limited), budget, device_num, global_batch)

    results, first = _priced_candidates(data, text, path, candidates, bounds, order, floors, budget, processes,
                                        progress, op_level_plan, deadline)
    priced = _bound_again(candidates, bounds, order, floors, results, first, op_level_plan, budget, deadline)
    if progress is not None:
        progress(len(bounds), len(bounds))
    return PlanSearch(device_num, budget, source, tuple(priced), best_of(priced, budget, path), time.perf_counter() - started,
                      time_limit)


def _bound_again(candidates: list, bounds: list, order: list, floors: list, results: dict, first: list,
                 op_level_plan, budget: int, deadline: float | None) -> list[Priced]:
    """Every candidate, as branch and bound in `order` leaves it over what was priced (`results`;
    the op-level search's plan in `first`, else priced at its turn by `op_level_plan`, or left
    unpriced when the time limit has passed): the answer of one process, whatever the count."""
    priced, best = [None] * len(bounds), None  # best: (step ns, candidate index) of the fastest fitting so far
    for index in order:
        if best is not None and (bounds[index], index) > best:  # it, and every one after it, cannot be chosen
            priced[index] = _pruned(candidates, floors, index, bounds[index], best)
        elif index == len(candidates):
            one = first[0] if first else op_level_plan() or Priced(None, reason=NOT_PRICED)
            priced[index] = replace(one, time_bound=bounds[index])
        else:
            priced[index] = _candidate(candidates[index], floors[index], results, index, bounds[index], deadline)
        one = priced[index]
        if one.estimate is not None and one.peak_bytes <= budget and (best is None or (one.step_ns, index) < best):
            best = (one.step_ns, index)
    return priced


def _pruned(candidates: list, floors: list, index: int, bound: int, best: tuple) -> Priced:
    """Candidate `index` (the op-level search's past the end of `candidates`), unpriced: its
    step-time `bound` already exceeds the fastest fitting step found (`best`: ns and index)."""
    given = candidates[index] if index < len(candidates) else None
    return Priced(given, bound=floors[index] if given is not None else 0, time_bound=bound,
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


def _priced_candidates(data: dict, text: str, path, candidates: list, bounds: list, order: list, floors: list,
                       budget: int, processes: int, progress, op_level_plan, deadline: float | None) -> tuple[dict, list]:
    """The candidates within the budget by their memory floor, priced by branch and bound in
    `order` on `processes` processes until `deadline` (`price_plans`): {candidate index:
    estimate, reason, or None where unpriced}; and the op-level search's plan in a list when it
    comes first without a deadline, priced here (`op_level_plan`) while the workers price the
    rest (else an empty list)."""
    op_index, first = len(candidates), []

    def op_level_first() -> tuple | None:
        first.append(op_level_plan())
        fits = first[0].estimate is not None and first[0].peak_bytes <= budget
        return (first[0].step_ns, op_index) if fits else None

    done = itertools.count(1)

    def heard(given, found) -> None:
        if progress is not None:
            progress(next(done), len(bounds))

    wanted = [index for index in order if index != op_index and floors[index] <= budget]
    found = price_plans(data, text, path, [candidates[index] for index in wanted], processes, heard,
                        [(bounds[index], index) for index in wanted], budget,
                        op_level_first if order[0] == op_index and deadline is None else None, deadline)
    return dict(zip(wanted, found)), first


def _candidate(given: GivenPlan, floor: int, results: dict, index: int, time_bound: int,
               deadline: float | None = None) -> Priced:
    """Candidate `index`, pruned by its memory `floor`, or as `price_plans` priced it
    (`results`: its detached estimate, the estimate's reason to refuse it, or None: left
    unpriced by the time limit, `deadline`)."""
    if index not in results:
        return Priced(given, bound=floor, time_bound=time_bound,
                      reason=f"pruned: its memory floor is {floor:,} bytes")
    found = results[index]
    if found is None and deadline is not None:
        return Priced(given, bound=floor, time_bound=time_bound, reason=NOT_PRICED)
    if found is None:  # `price_plans` prices every candidate one process would
        raise AssertionError(f"candidate {index} was not priced, though branch and bound needs it")
    if isinstance(found, str):
        return Priced(given, bound=floor, time_bound=time_bound, reason=f"refused: {found}")
    return Priced(given, found, floor, time_bound=time_bound)


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
