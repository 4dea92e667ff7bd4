"""The plan-space search of a mixture of experts: Megatron's plan pieces with expert parallelism
(``ep``), each candidate priced by `autostrat estimate`'s machinery, the fastest that fits.

`report.plan_space` searches the ``plan:`` vocabulary with ``ep`` 1; a mixture of experts whose
experts fit only when split (DeepSeek-V3's 656B expert weights on 1 024 devices) needs ``ep`` as
a dimension of the search. The search (cases):

- Candidates (`expert_plan_candidates`, in this fixed order): every ``tp`` up to a server
  dividing the key-value heads, every ``pp`` dividing what is left and at most the layers (the
  estimate's uneven split where it does not divide them), ``dp`` the rest (dividing the global
  batch), every ``ep`` dividing a stage's ``dp · tp`` devices and the experts, ``recompute``
  none then full (with fused attention selective recompute is none); ``sequence_parallel`` on
  with ``tp`` above 1, ``zero`` 1 with ``dp`` above 1, ``micro_batch`` 1, ``etp`` 1, ``vp`` 1.
- Pruning (`resident_floor`): a candidate whose matrix weights' parameters and optimiser state
  (`report.memory_floor.RESIDENT_BYTES`) need more than the budget on average over its stages is
  not priced: the dense weights split over ``tp`` devices at most and sharded over ``dp · tp``,
  the routed experts' over ``ep`` devices and sharded over ``dp · tp / ep``, each at most; the
  busiest device holds at least the average.
- Start: the config's own ``plan:``, when it has one, is priced first (the incumbent, as a
  solver's hint: the answer is never slower than it).
- Order (`pricing_order`): the rest by how many of ``tp``, ``pp``, ``ep``, ``recompute`` differ
  from the start (a local search around it; all equal without one), then by an optimistic share
  of the step, recompute's extra forward (a third of a step without it) times the 1F1B bubble's
  ``1 + (pp - 1) / micro-batches``, then candidate order; priced in that order, at most `limit` of
  them (a full search prices all). The order is a heuristic, not a bound: a truncated search is
  not exhaustive, and says how many it priced of how many.
- The answer: the fastest priced plan that fits the budget (the first on a tie); none fits:
  an `InfeasibleError` naming the budget and the smallest peak priced.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from autostrat.errors import ConfigError, InfeasibleError
from autostrat.frontend.config import config_from_data
from autostrat.frontend.run import memory_budget
from autostrat.frontend.yaml_text import parse_config_text
from autostrat.reading import read_text
from autostrat.redistribution import collector_paused
from autostrat.report.estimate import Estimate, GivenPlan, read_given_plan, search_keys
from autostrat.report.plan_pricing import price_plans
from autostrat.report.memory_floor import RESIDENT_BYTES
from autostrat.report.plan_space import device_splits
from autostrat.strategies import divisors

RECOMPUTE = ("none", "full")


def expert_plan_candidates(device_num: int, global_batch: int, layers: int, kv_heads: int, experts: int,
                           devices_per_server: int) -> list[GivenPlan]:
    """Every candidate plan with expert parallelism on `device_num` devices (the module
    docstring's candidates, in its order).

    Example (8 devices, 2 layers, 4 kv heads, 8 experts, global batch 8):
        >>> plans = expert_plan_candidates(8, 8, 2, 4, 8, 8)
        >>> len(plans), sorted({(plan.tp, plan.pp, plan.dp, plan.ep) for plan in plans})[:4]
        (42, [(1, 1, 8, 1), (1, 1, 8, 2), (1, 1, 8, 4), (1, 1, 8, 8)])
    """
    plans = []
    for tp, pp, dp in device_splits(device_num, global_batch, layers, devices_per_server):
        if kv_heads % tp == 0:
            plans += [GivenPlan(tp, pp, dp, recompute, int(dp > 1), 1, global_batch, tp > 1, ep=ep)
                      for ep in divisors(dp * tp) if experts % ep == 0 for recompute in RECOMPUTE]
    return plans


def resident_floor(given: GivenPlan, dense_weights: int, expert_weights: int, precision: str) -> int:
    """A lower bound on the peak bytes per device of `given` (the module docstring's pruning):
    `dense_weights` matrix elements over ``tp · pp`` devices, `expert_weights` over ``ep · pp``.

    Example (1 000 dense and 8 000 expert elements in bf16 on tp 2, ep 4, dp 4: 2 + 12/8 and 2 + 12/2 bytes):
        >>> resident_floor(GivenPlan(2, 1, 4, "full", 1, 1, 8, ep=4), 1000, 8000, "bf16")
        17750
    """
    whole, sharded = RESIDENT_BYTES[precision]
    stage = given.dp * given.tp
    dense = dense_weights * (whole + sharded / (stage if given.zero else 1)) / (given.tp * given.pp)
    experts = expert_weights * (whole + sharded / (stage // given.ep if given.zero else 1)) / (given.ep * given.pp)
    return math.ceil(dense + experts)


def pricing_order(candidates: list[GivenPlan], start: GivenPlan | None = None) -> list[GivenPlan]:
    """`candidates` by their distance from `start`, then the optimistic share of the step (the
    module docstring's order).

    Example (8 micro-batches: pp 1 before pp 2, both before recompute; from a start of pp 2 with
    recompute, the plans one key away first):
        >>> a, b, c = (GivenPlan(1, pp, 8, recompute, 1, 1, 64) for pp, recompute in ((2, "none"), (1, "full"), (1, "none")))
        >>> [(plan.pp, plan.recompute) for plan in pricing_order([a, b, c])]
        [(1, 'none'), (2, 'none'), (1, 'full')]
        >>> [(plan.pp, plan.recompute) for plan in pricing_order([a, b, c], GivenPlan(1, 2, 8, "full", 1, 1, 64))]
        [(2, 'none'), (1, 'full'), (1, 'none')]
    """
    def key(given: GivenPlan) -> tuple:
        distance = 0 if start is None else sum(getattr(given, name) != getattr(start, name) for name in ("tp", "pp", "ep", "recompute"))
        return distance, (4 / 3 if given.recompute == "full" else 1) * (1 + (given.pp - 1) / given.micro_batches)
    return sorted(candidates, key=key)  # sorted is stable: candidate order breaks ties


@dataclass(frozen=True)
class ExpertPlanSearch:
    """The search's result: the budget, how many candidates there were, were pruned and were
    priced (each priced one with its estimate, or None where the estimate refused it), the
    chosen one and the search's wall seconds."""

    budget: int
    candidates: int
    pruned: int
    priced: tuple  # (GivenPlan, Estimate | None): the start first, then in pricing order
    best: Estimate
    seconds: float

    def summary(self) -> str:
        fitting = sum(1 for _, found in self.priced if found is not None and _peak(found) <= self.budget)
        return (f"{self.candidates} candidates, {self.pruned} pruned by their resident floor, {len(self.priced)} priced "
                f"({fitting} fit {self.budget / 2**30:.0f} GiB)")


def _peak(found: Estimate) -> int:
    return max(stage.peak_bytes for stage in found.memory)


@collector_paused()  # one collection after the search, not one per estimate (`report.estimate.estimate_given`)
def search_expert_plans(path, device_num: int | None = None, limit: int | None = None, max_device_memory=None,
                        progress=None, processes: int = 1) -> ExpertPlanSearch:
    """The search of the estimate config at `path` on `device_num` devices (default: its
    ``plan:``'s), from its ``plan:`` if it has one for those devices, pricing at most `limit`
    candidates besides it (None: every one not pruned) under `max_device_memory` bytes (None:
    the profile's memory), on `processes` processes (`report.plan_pricing`: the same answer on
    any number); `progress(given, estimate)` is called after each is priced.

    Example (the tiny DeepSeek on its 8 devices: its plan and two candidates priced):
        >>> found = search_expert_plans("configs/estimate/deepseek_tiny.yaml", limit=2)
        >>> len(found.priced), found.best.step_time_s <= found.priced[0][1].step_time_s
        (3, True)
    """
    started = time.perf_counter()
    text = read_text(path, "config")
    data = parse_config_text(text, path)
    start = read_given_plan(data, path) if "plan" in data else None
    data = {key: value for key, value in data.items() if key != "plan"}
    device_num = device_num or (start.device_num if start else None)
    if isinstance(device_num, bool) or not isinstance(device_num, int) or device_num < 1:
        raise ConfigError(f"{path}: device_num: expected a positive integer (or a plan: section to take it from), got {device_num!r}")
    if start is not None and start.device_num != device_num:
        start = None  # a plan for other devices is no start
    global_batch = data.get("global_batch")
    if isinstance(global_batch, bool) or not isinstance(global_batch, int) or global_batch < 1:
        raise ConfigError(f"{path}: global_batch: expected a positive integer, got {global_batch!r}")
    config = config_from_data(search_keys(data, path, global_batch) | {"device_num": device_num}, text, path, 1, example_inputs=True)
    budget, _ = memory_budget(config.context, max_device_memory)
    net, precision = config.net, config.context.precision
    sparse = [block for block in net.blocks if getattr(block, "sparse", False)]
    if not sparse:
        raise ConfigError(f"{path}: model: the expert plan search needs a mixture-of-experts model, got {type(net).__name__} without experts")
    dense, experts = _weights(net)
    candidates = expert_plan_candidates(device_num, global_batch, len(net.blocks), net.blocks[0].attention.kv_heads,
                                        sparse[0].moe.w_gate.shape[0], config.context.hardware_profile().devices_per_server)
    kept = [given for given in candidates if resident_floor(given, dense, experts, precision) <= budget]
    chosen = ([start] if start is not None else []) + [given for given in pricing_order(kept, start) if given != start][:limit]
    found = price_plans(data, text, path, chosen, processes, progress)
    priced = [(given, one if isinstance(one, Estimate) else None) for given, one in zip(chosen, found)]
    fitting = [found for _, found in priced if found is not None and _peak(found) <= budget]
    if not fitting:
        peaks = [_peak(found) for _, found in priced if found is not None]
        smallest = f"the smallest peak priced is {min(peaks):,} bytes" if peaks else "none was priced"
        raise InfeasibleError(f"{path}: no plan priced fits {budget:,} bytes per device ({smallest})")
    best = min(fitting, key=lambda found: found.step_time_s)
    return ExpertPlanSearch(budget, len(candidates), len(candidates) - len(kept), tuple(priced), best, time.perf_counter() - started)


def _weights(net) -> tuple[int, int]:
    """The blocks' dense matrix elements (2-D weights) and routed experts' elements (3-D)."""
    sizes = {2: 0, 3: 0}
    for block in net.blocks:
        for _, parameter in block.parameters_and_names():
            if len(parameter.shape) in sizes:
                sizes[len(parameter.shape)] += math.prod(parameter.shape)
    return sizes[2], sizes[3]

