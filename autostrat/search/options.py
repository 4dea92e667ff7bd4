"""How to search (`SearchOptions`): MindSpore's parallel modes and search modes, the refinement,
its time limit and memory budget, the cost model, and what a training step holds.
"""

from __future__ import annotations

from dataclasses import dataclass

from autostrat.cost import Hardware
from autostrat.cost.overlap import check_bucket_bytes
from autostrat.errors import ConfigError
from autostrat.search.coarsen import LEVELS
from autostrat.search.optimizer_shard import OptimizerShard
from autostrat.search.precision import check_precision
from autostrat.strategies import check_mesh

MODES = ("auto_parallel", "data_parallel", "semi_auto_parallel", "stand_alone")
SEARCH_MODES = ("integer_programming", "sharding_propagation")
REFINERS = (None, "cpsat", "solve")
COST_MODELS = ("bytes", "time")

@dataclass(frozen=True)
class SearchOptions:
    """How to search.

    - `mode`: auto_parallel searches as `search_mode` says; semi_auto_parallel keeps the seeds
      and splits every other op's batch dim; data_parallel ignores seeds and splits every batch
      dim; stand_alone plans for one device.
    - `search_mode`: sharding_propagation propagates the seeds by BFS; integer_programming is
      fully automatic: it needs no seeds, every op uses every device (no all-ones or repeated
      candidates where a full split exists), and CP-SAT finds the optimum (it implies `refine`).
    - `refine`: "cpsat" refines the BFS plan to the proven optimum of the same cost model (at
      coarsening "exact", when CP-SAT proves nothing within two thirds of the time, the IOPDDL
      solver improves its plan in the rest: `solve.untied`);
      "solve" runs the IOPDDL solver (`solve.refinement`) instead, for graphs too large to prove:
      a plan never worse than the BFS one, FEASIBLE, not proven. A budget alone means "cpsat".
    - `refine_time_limit`: seconds a refining search may take, from its start: the problem and
      the propagation (which do not look at the clock: their plan is the floor) and then the
      extra starts, cost tables, coarsening, model building, solves and retries (`deadline`),
      which end three times the start plan's build time early, so that the plan of what they found is
      built within the limit; when they run out before the solve, the plan is the best start
      and its summary says so.
    - `max_device_memory`: per-device bytes the refined plan's peak must fit in.
    - `workers`: CP-SAT's workers (0: one, and the plan byte-identical run to run; more race,
      and of equal plans any may win).
    - `pricing_processes`: above 1, the processes that price the refinement's cost tables, this
      one among them (`redistribution.parallel`): the same prices, so the same plans, sooner.
    - `coarsen`: how the solver's model is reduced (`coarsen.LEVELS`): "exact" keeps the
      optimum, "layers" also shares the variables of identical repeated layers (the optimum
      among plans whose repeated layers agree, as Megatron's and Alpa's layer clustering
      have). None (`coarsening`): "layers" in integer_programming, whose model covers every
      op of a deep network, "exact" for a refinement of sharding_propagation's plan.
    - `allow_repeated`: whether candidates may use fewer devices (repeated calculation); None
      allows it in sharding_propagation (a propagated layout may be replicated) only.
    - `follow_layers`: sharding_propagation copies a seeded layer's strategies to the unseeded
      layers repeating it (`propagate.seeded_layers`) when that plan is cheaper than
      propagating them (`propagate.propagate`).
    - `mesh`: the logical mesh candidates are split over (`strategies.mesh_axes`): "auto"
      (every divisor up to 16 devices, servers x 8 devices beyond), "full" (every divisor), or
      its axis sizes, outer first, e.g. ``(128, 8)``.
    - `cost_model`: what the search minimises: "bytes" sent per device, or "time", the step
      time predicted on `hardware` (compute per op, α–β time per redistribution). Plans report
      both either way.
    - `optimizer_shard`: MindSpore's parallel optimizer (`optimizer_shard.OptimizerShard`):
      parameters' optimiser state and updates split over their replicas; None: off.
    - `precision`: what memory counts per trained parameter (`precision.PRECISIONS`; fp32 by
      default, 16-bit as Megatron's distributed optimizer keeps it: `search.precision`).
    - `seeds_from_one_plan`: the seeds were read from one saved plan (a strategy checkpoint), so
      a redistribution between two of them is not a disagreement to warn about.
    - `micro_batches`: how many micro-batches a step runs the graph for (a pipeline's
      micro-batch graph, `pipeline.plan_pipeline`): what runs once per step (gradient
      synchronisation, updates) weighs ``1 / micro_batches`` against what every micro-batch
      pays (`problem.build_problem`).
    - `bucket_bytes`: gradient synchronisation in buckets of this many gradient bytes per
      device, overlapped with the backward, a bucket's AllReduces over one group fused into one
      (MindSpore's ``comm_fusion`` by size, `search.fusion`): every plan's
      predicted step is the two-stream schedule (`prediction.sync_schedule`), so plans are
      compared on the overlapped time, and runs overlap it (`runtime.stream`); 0: after the backward.
    """

    mode: str = "auto_parallel"
    search_mode: str = "sharding_propagation"
    allow_repeated: bool | None = None
    follow_layers: bool = True
    refine: str | None = None
    refine_time_limit: float = 60.0
    max_device_memory: int | None = None
    workers: int = 0
    pricing_processes: int = 0
    coarsen: str | None = None
    mesh: str | tuple[int, ...] = "auto"
    cost_model: str = "bytes"
    hardware: Hardware = Hardware()
    optimizer_shard: OptimizerShard | None = None
    seeds_from_one_plan: bool = False
    precision: str = "fp32"
    micro_batches: int = 1
    bucket_bytes: int = 0
    backward_regathers: bool = False

    def __post_init__(self) -> None:
        for key, value, valid in (("parallel_mode", self.mode, MODES), ("search_mode", self.search_mode, SEARCH_MODES),
                                  ("refine", self.refine, REFINERS), ("coarsen", "exact" if self.coarsen is None else self.coarsen, LEVELS),
                                  ("cost_model", self.cost_model, COST_MODELS)):
            if value not in valid:
                raise ConfigError(f"{key} must be one of {', '.join(map(str, valid))}; got {value!r}")
        object.__setattr__(self, "mesh", check_mesh(self.mesh))
        if isinstance(self.micro_batches, bool) or not isinstance(self.micro_batches, int) or self.micro_batches < 1:
            raise ConfigError(f"micro_batches must be a positive integer, got {self.micro_batches!r}")
        if isinstance(self.pricing_processes, bool) or not isinstance(self.pricing_processes, int) or self.pricing_processes < 0:
            raise ConfigError(f"pricing_processes must be a whole number of processes (0: price in this one), "
                              f"got {self.pricing_processes!r}")
        check_precision(self.precision)
        check_bucket_bytes(self.bucket_bytes)

    @property
    def automatic(self) -> bool:
        return self.mode == "auto_parallel" and self.search_mode == "integer_programming"

    @property
    def refines(self) -> bool:
        """Whether the search refines its propagated plan (and so prices its cost tables up front)."""
        return self.refine is not None or self.automatic or self.max_device_memory is not None

    @property
    def coarsening(self) -> str:
        """The coarsening level the refinement uses (`coarsen`, resolved)."""
        if self.coarsen is not None:
            return self.coarsen
        return "layers" if self.automatic else "exact"

    @property
    def repeated(self) -> bool:
        """Whether candidates may repeat work (`allow_repeated`, resolved)."""
        if self.allow_repeated is not None:
            return self.allow_repeated
        return self.mode == "auto_parallel" and self.search_mode == "sharding_propagation"
