"""The MindSpore-style parallel context: the only global state in autostrat.

`set_auto_parallel_context` validates and stores keys; everything below the front end receives
`current_context()`, a frozen snapshot, so a search never reads global state.

A path set from Python may be anywhere; a path read from a config file (`keys_from_file`, for the
config loader) is relative to the file's folder, and the checkpoint path it writes must stay in
that folder: the context records the file (`output_paths_from`), and the writer checks again.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, fields, replace

from autostrat.cost import DEFAULT_PROFILE, Hardware
from autostrat.cost.overlap import check_bucket_bytes
from autostrat.errors import ConfigError
from autostrat.frontend.hardware_file import hardware_number, resolve_hardware
from autostrat.io import OutputPath
from autostrat.search import SearchOptions
from autostrat.search.coarsen import LEVELS as COARSEN_LEVELS
from autostrat.search.optimizer_shard import OptimizerShard
from autostrat.search.precision import PRECISIONS, check_loss_scale
from autostrat.frontend.mindspore_keys import NO_EFFECT, UNSUPPORTED, mindspore_only, warn_once
from autostrat.frontend.pipeline_keys import schedule_and_chunks
from autostrat.search.options import COST_MODELS, MODES as PARALLEL_MODES, REFINERS, SEARCH_MODES
from autostrat.strategies import check_mesh
PHASES = ("predict", "train")
MAX_DEVICE_NUM = 2**20  # far beyond any cluster; larger counts only exhaust memory in the search
_UNITS = {"": 1, "B": 1, "KB": 2**10, "MB": 2**20, "GB": 2**30, "TB": 2**40}
# The keys that each set one field of the hardware profile, over the profile's own value.
HARDWARE_KEYS = ("device_flops", "device_memory_bandwidth", "intra_server_bandwidth", "inter_server_bandwidth",
                 "intra_server_latency", "inter_server_latency", "devices_per_server")


def parse_bytes(value, key: str = "max_device_memory") -> int | None:
    """Bytes from an integer or a string such as "16GB", "512 MB" (binary units); None stays None.

    Example:
        >>> parse_bytes("16GB"), parse_bytes(1024), parse_bytes("1.5 KB")
        (17179869184, 1024, 1536)
    """
    if value is None or (isinstance(value, int) and not isinstance(value, bool) and value > 0):
        return value
    if isinstance(value, str):
        match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([KMGT]?B?)\s*", value.upper())
        if match and float(match.group(1)) > 0:
            return int(float(match.group(1)) * _UNITS[match.group(2)])
    raise ConfigError(f"{key} must be a positive number of bytes or a string such as '16GB', got {value!r}")


@dataclass(frozen=True)
class ParallelContext:
    """A validated snapshot of the parallel context.

    - `parallel_mode`: stand_alone (one device), data_parallel (split every op's batch dim),
      semi_auto_parallel (configured strategies, data parallel for the rest), auto_parallel
      (search, as `search_mode` says).
    - `fully_use_devices`: False lets candidates use fewer devices (repeated calculation), True
      forbids it; None (default) allows it in sharding_propagation, where a propagated layout may
      be replicated over some devices (Megatron's LayerNorm), and forbids it elsewhere.
    - `follow_layers`: in sharding_propagation, unseeded layers of a `CellList` take the
      strategies of the seeded layer they repeat (default True).
    - `full_batch`: every rank loads the whole batch (True) or only its own share (False).
    - `search_mode`: sharding_propagation (BFS from the seeds) or integer_programming (fully
      automatic: no seeds needed, every op uses every device, CP-SAT finds the optimum).
    - `refine`: None, "cpsat" (refine the BFS plan to the proven optimum) or "solve" (the IOPDDL
      solver: never worse than the BFS plan, not proven; for graphs too large to prove), with
      `refine_time_limit` seconds for the whole search; `max_device_memory`: per-device bytes (or "16GB") the plan's
      peak must fit in (implies refinement); `coarsen`: how the solver's model is reduced first —
      "exact" (prune dominated candidates, merge chains; the optimum is unchanged), "layers"
      (also one set of variables for identical repeated layers: the optimum among plans whose
      repeated layers agree), or "none"; None (default): "layers" in integer_programming,
      "exact" when refining sharding_propagation's plan.
    - `mesh`: the logical mesh candidates are split over: "auto" (every divisor of device_num
      up to 16 devices, beyond that servers x 8 devices per server), "full" (every divisor), or
      its axis sizes, outer first, e.g. ``[128, 8]`` (see `autostrat.strategies`).
    - `phase`: "predict" plans the forward graph; "train" plans a training step (forward, loss,
      backward, gradient synchronisation and the optimiser's updates), so the search weighs
      what training communicates. A `TrainOneStepCell` is always planned for training.
    - `gradients_mean`: how a parameter's gradient combines over the devices that hold the same
      slice of it (its replicas, `Plan.replicas`). False (the default, as in MindSpore): the sum
      of the replicas' gradients — with a batch-mean loss, r times the stand-alone gradient on
      a parameter held by r devices (each replica's own batch-mean loss, summed). True: their
      mean, the gradient one device computes over the whole batch. The run is checked against
      one device either way: the stand-alone reference sums as many copies of each gradient
      as the plan has replicas of its parameter (`runtime.training.reference_graph`).
    - `enable_parallel_optimizer`: MindSpore's parallel optimizer (ZeRO): each parameter's
      optimiser state and update split over the devices holding the same slice of it
      (`search.optimizer_shard`); `parallel_optimizer_config` takes MindSpore's keys
      ``optimizer_level`` ("level1"/"level2"; "level3": the search may also keep each
      parameter sharded at rest, gathered per use, where a memory budget needs it),
      ``optimizer_weight_shard_size`` (-1: all replicas) and ``parallel_optimizer_threshold``
      (KB; default 64).
    - `auto_recompute` (autostrat's own): when training under `max_device_memory`, the search
      chooses how many repeated layers to recompute (`search.recompute_choice`), besides the
      cells marked with `Cell.recompute`; the plan with the lowest predicted cost that fits wins.
    - `pipeline_stages`: the devices in this many equal groups, each running a contiguous
      part of the model's layers on micro-batches (`search.pipeline`); the part each group runs
      is searched unless cells set ``pipeline_stage``, and the micro-batches come from
      `nn.PipelineCell`'s ``micro_size``. `pipeline_schedule` (autostrat's own) orders each
      group's work (`search.schedules`): "1f1b" (default), "gpipe", "interleaved_1f1b"
      (Megatron's virtual stages), "zero_bubble_h1" or "zbv" (zero bubble, the backward split
      into input and weight gradients); `pipeline_interleave_num` is the model stages each group
      holds (interleaved_1f1b: any, default 2; zbv: 2; else 1). "auto" lets the search choose
      the schedule and its model stages per group with the split (`search.schedule_split`):
      the fastest predicted under max_device_memory. MindSpore's `pipeline_config`
      maps onto them: ``pipeline_scheduler`` ("1f1b", "gpipe", "zero_bubble_v" or any of
      autostrat's names) and ``pipeline_interleave`` (True: 1F1B interleaved); naming another
      schedule than `pipeline_schedule` is refused, naming both keys.
    - MindSpore's `dataset_strategy` ("data_parallel" or "full_batch", which sets `full_batch`),
      `strategy_ckpt_config` (``save_file``, ``load_file``: the two checkpoint paths;
      ``only_trainable_params`` accepted) and `parameter_broadcast` (every rank starts from the
      same values anyway: they are made from one seed). `parallel_mode` also takes MindSpore's
      upper-case spellings ("AUTO_PARALLEL"), and `search_mode` its deprecated name
      ``auto_parallel_search_mode``. MindSpore's compiler and fusion knobs (`NO_EFFECT`:
      ``comm_fusion``, ``gradient_fp32_sync``...) are accepted with one warning each; keys whose
      meaning is not built (`UNSUPPORTED`: ``grad_accumulation_step``, ``auto_pipeline``) are refused.
      ``comm_fusion`` by size (``{"allreduce": {"mode": "size", "config": MB}}``) sets `bucket_bytes`.
    - `bucket_bytes`: gradient synchronisation in buckets of this many gradient bytes per device,
      started as each bucket's gradients are final and overlapped with the rest of the backward
      (PyTorch DDP's buckets; `runtime.stream`), and priced so (`search.SearchOptions`); 0
      (default): every gradient synchronised after the backward.
    - `backward_regathers` (autostrat's own): True makes the backward redistribute the
      forward's tensors it reads itself, when it reads them, instead of keeping the copies the
      forward's redistributions made (`plan.EdgeRedistribution`): fewer bytes held, more sent.
      Megatron's sequence parallelism gathers the norms' outputs again so, and a plan with
      ``sequence_parallel`` sets it (`report.estimate`); False (default): the copies are kept.
    - `pricing_processes` (autostrat's own): above 1, the processes that price the refinement's
      cost tables, this one among them (`redistribution.parallel`): the same prices, so the
      same plan, sooner on a machine with cores to spare; 0 (default): this process alone.
    - `cost_model`: what the search minimises: "bytes" (default) sent per device, or "time",
      the predicted step time. Every plan reports both, with its peak memory per device.
    - `precision`: "fp32" (default), "fp16" or "bf16": what the search's memory counts — in
      16 bits, parameters and activations at 2 bytes, gradients at 2 (fp16) or 4 (bf16), fp32
      main copies beside the optimiser state, as Megatron's distributed optimizer keeps them
      (`search.precision`); time is priced in it too (16-bit peak; activations move in 16 bits,
      gradients as kept: fp16 in fp16, bf16 in fp32). Runs execute it (`runtime.sixteen_bit`),
      checked against JAX's mixed-precision step (`runtime.reference_mixed`).
    - `loss_scale`: the static loss scale of a 16-bit run (1: none, the default): the backward
      starts from this many times the loss's gradient, and every update divides its fp32 gradient
      by it, so that small fp16 gradients stay above float16's subnormals. A run in fp16 needs
      one above 1 (a power of two keeps the scaling exact); fp32 takes none.
    - The hardware the step time is predicted on: `hardware`, a profile (sources in
      `autostrat.cost.hardware`): "h100-sxm-80gb" (default, one 8 x H100 SXM5 server),
      "a100-80gb" (one 8 x A100 SXM4 80GB server), a ``.yaml`` file of a profile's fields
      (`frontend.hardware_file`; in a config, relative to its folder) or a `Hardware` value.
      Each of the keys `device_flops` (FLOP/s at 16 bits; 32-bit ops run at half),
      `device_memory_bandwidth` (bytes/s), `intra_server_bandwidth` and
      `inter_server_bandwidth` (bytes/s each device sends), `intra_server_latency` and
      `inter_server_latency` (seconds per message) and `devices_per_server` (a rank table's
      servers set it under `autostrat run`; rank tables carry no speeds) overrides that one
      field of the profile, whichever order they are given in; None (default) keeps the
      profile's. `hardware_profile()` is the result; `get_auto_parallel_context` gives the
      profile read (a `Hardware`) for `hardware`, and that result's field for a hardware key.
      Numbers may be given as strings ("989.4e12": YAML reads ``989.4e12`` as a string).
    - `output_paths_from` (no context key: set by the config loader, `frontend.config`): the
      config file `strategy_ckpt_save_file` was read from, whose folder it must stay in (see
      `autostrat.io`); "" when a Python call or the command line gave it: any path.
    """

    parallel_mode: str = "stand_alone"
    search_mode: str = "sharding_propagation"
    device_num: int = 1
    global_rank: int = 0
    full_batch: bool = False
    fully_use_devices: bool | None = None
    follow_layers: bool = True
    strategy_ckpt_save_file: str = ""
    strategy_ckpt_load_file: str = ""
    refine: str | None = None
    refine_time_limit: float = 60.0
    max_device_memory: int | None = None
    coarsen: str | None = None
    mesh: str | tuple[int, ...] = "auto"
    phase: str = "predict"
    gradients_mean: bool = False
    cost_model: str = "bytes"
    precision: str = "fp32"
    loss_scale: float = 1.0
    enable_parallel_optimizer: bool = False
    parallel_optimizer_config: dict | None = None
    auto_recompute: bool = False
    pipeline_stages: int = 1
    pipeline_config: dict | None = None
    pipeline_schedule: str | None = None
    pipeline_interleave_num: int | None = None
    dataset_strategy: str = "data_parallel"
    strategy_ckpt_config: dict | None = None
    parameter_broadcast: bool = False
    hardware: str | Hardware = DEFAULT_PROFILE
    device_flops: float | None = None
    device_memory_bandwidth: float | None = None
    intra_server_bandwidth: float | None = None
    inter_server_bandwidth: float | None = None
    intra_server_latency: float | None = None
    inter_server_latency: float | None = None
    devices_per_server: int | None = None
    bucket_bytes: int = 0
    pricing_processes: int = 0
    output_paths_from: str = ""
    backward_regathers: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.parallel_mode, str):
            object.__setattr__(self, "parallel_mode", self.parallel_mode.lower())
        self._mindspore_keys()
        _check_choice("cost_model", self.cost_model, COST_MODELS)
        _check_choice("precision", self.precision, PRECISIONS)
        object.__setattr__(self, "loss_scale", check_loss_scale(self.loss_scale, self.precision))
        object.__setattr__(self, "hardware", resolve_hardware(self.hardware))  # read once: the context is a value
        for key in HARDWARE_KEYS:
            object.__setattr__(self, key, hardware_number(key, getattr(self, key)))
        self.hardware_profile()  # validates every value, naming its key
        _check_choice("parallel_mode", self.parallel_mode, PARALLEL_MODES)
        _check_choice("phase", self.phase, PHASES)
        _check_choice("search_mode", self.search_mode, SEARCH_MODES)
        _check_choice("refine", self.refine, REFINERS)
        if self.coarsen is not None:  # None: chosen by the search mode
            _check_choice("coarsen", self.coarsen, COARSEN_LEVELS)
        limit = self.refine_time_limit
        if isinstance(limit, bool) or not isinstance(limit, (int, float)) or not limit > 0:  # NaN too
            raise ConfigError(f"refine_time_limit must be a positive number of seconds, got {limit!r}")
        object.__setattr__(self, "max_device_memory", parse_bytes(self.max_device_memory))
        object.__setattr__(self, "mesh", check_mesh(self.mesh))
        for key in ("device_num", "global_rank"):
            value = getattr(self, key)
            if not isinstance(value, int) or isinstance(value, bool) or value < (1 if key == "device_num" else 0):
                bound = "a positive integer" if key == "device_num" else "a non-negative integer"
                raise ConfigError(f"{key} must be {bound}, got {value!r}")
        if self.device_num > MAX_DEVICE_NUM:
            raise ConfigError(f"device_num must be at most {MAX_DEVICE_NUM:,} devices, got {self.device_num:,}")
        if self.global_rank >= self.device_num:
            raise ConfigError(f"global_rank {self.global_rank} must be below device_num {self.device_num}")
        self.optimizer_shard()  # validates parallel_optimizer_config, naming the key
        processes = self.pricing_processes
        if isinstance(processes, bool) or not isinstance(processes, int) or processes < 0:
            raise ConfigError(f"pricing_processes must be a whole number of processes (0: price in this one), got {processes!r}")
        check_bucket_bytes(self.bucket_bytes)
        stages = self.pipeline_stages
        if isinstance(stages, bool) or not isinstance(stages, int) or stages < 1:  # dividing device_num: checked when planning
            raise ConfigError(f"pipeline_stages must be a positive integer, got {stages!r}")
        self.pipeline_schedule_chunks()  # validates pipeline_config, pipeline_schedule and pipeline_interleave_num
        for key in ("full_batch", "fully_use_devices", "gradients_mean", "follow_layers", "enable_parallel_optimizer",
                    "auto_recompute", "parameter_broadcast", "backward_regathers"):
            value = getattr(self, key)
            if not isinstance(value, bool) and not (key == "fully_use_devices" and value is None):
                raise ConfigError(f"{key} must be True or False, got {value!r}")
        for key in ("strategy_ckpt_save_file", "strategy_ckpt_load_file"):
            if not isinstance(getattr(self, key), str):
                raise ConfigError(f"{key} must be a file path string, got {getattr(self, key)!r}")

    def strategy_output(self) -> OutputPath | None:
        """Where the strategy checkpoint goes (None: nowhere), with the config that chose it.

        Example:
            >>> ParallelContext(strategy_ckpt_save_file="s.json").strategy_output()
            OutputPath(path='s.json', role='strategy_ckpt_save_file', config='', stdout=False)
        """
        if not self.strategy_ckpt_save_file:
            return None
        return OutputPath(self.strategy_ckpt_save_file, "strategy_ckpt_save_file", self.output_paths_from)

    def search_options(self, workers: int = 0):
        """The options the search layer takes (it never reads the context itself)."""
        options = SearchOptions(
            mode=self.parallel_mode,
            search_mode=self.search_mode,
            allow_repeated=None if self.fully_use_devices is None else not self.fully_use_devices,
            follow_layers=self.follow_layers,
            refine=self.refine,
            refine_time_limit=self.refine_time_limit,
            max_device_memory=self.max_device_memory,
            coarsen=self.coarsen,
            mesh=self.mesh,
            workers=workers,
            cost_model=self.cost_model,
            precision=self.precision,
            bucket_bytes=self.bucket_bytes,
            backward_regathers=self.backward_regathers,
            pricing_processes=self.pricing_processes,
            hardware=self.hardware_profile(),
            optimizer_shard=self.optimizer_shard() if self.enable_parallel_optimizer else None,
            seeds_from_one_plan=bool(self.strategy_ckpt_load_file),
        )
        if self.pricing_processes > 1 and not options.refines:
            warn_once("pricing_processes", f"pricing_processes={self.pricing_processes} has no effect: only a refining search "
                                           f"(refine, max_device_memory or integer_programming) prices cost tables up front",
                      stacklevel=3)
        return options

    def _mindspore_keys(self) -> None:
        """`dataset_strategy` and `strategy_ckpt_config` onto the keys that act on them."""
        if self.dataset_strategy not in ("data_parallel", "full_batch"):
            raise ConfigError(f"dataset_strategy must be 'data_parallel' or 'full_batch' (a per-input strategy tuple is not "
                              f"supported), got {self.dataset_strategy!r}")
        if self.dataset_strategy == "full_batch":
            object.__setattr__(self, "full_batch", True)
        config = self.strategy_ckpt_config
        if config is None:
            return
        if not isinstance(config, dict) or set(config) - {"save_file", "load_file", "only_trainable_params"}:
            raise ConfigError(f"strategy_ckpt_config takes the keys save_file, load_file and only_trainable_params, got {config!r}")
        for key, field in (("save_file", "strategy_ckpt_save_file"), ("load_file", "strategy_ckpt_load_file")):
            if config.get(key):
                object.__setattr__(self, field, config[key])

    def pipeline_schedule_chunks(self) -> tuple[str, int]:
        """The pipeline's schedule and model stages per device group (`pipeline_keys`).

        Example:
            >>> ParallelContext(pipeline_config={"pipeline_interleave": True}).pipeline_schedule_chunks()
            ('interleaved_1f1b', 2)
        """
        return schedule_and_chunks(self.pipeline_schedule, self.pipeline_interleave_num, self.pipeline_config)

    def optimizer_shard(self) -> OptimizerShard:
        """`parallel_optimizer_config` as the value the search takes."""
        return OptimizerShard.from_config(self.parallel_optimizer_config)

    def hardware_profile(self) -> Hardware:
        """The `hardware` profile with the hardware keys that were given over its fields, as the
        search takes it; its name says which fields were overridden.

        Example:
            >>> ParallelContext(hardware="a100-80gb", devices_per_server=4).hardware_profile().name
            'a100-80gb (devices_per_server overridden)'
        """
        given = {key: getattr(self, key) for key in HARDWARE_KEYS if getattr(self, key) is not None}
        if not given:
            return self.hardware
        name = f"{self.hardware.name} ({', '.join(given)} overridden)" if self.hardware.name else ""
        return replace(self.hardware, **given, name=name)


def _check_choice(key: str, value, choices: tuple) -> None:
    if value not in choices:
        raise ConfigError(f"{key} must be one of {', '.join(map(str, choices))}; got {value!r}")


def _check_keys(keys) -> None:
    for key in keys:
        if key in UNSUPPORTED:
            raise ConfigError(f"auto-parallel context key {key!r} is not supported: {UNSUPPORTED[key]}")
    unknown = sorted(set(keys) - set(KEYS) - set(NO_EFFECT) - {"auto_parallel_search_mode"})
    if unknown:
        raise ConfigError(f"unknown auto-parallel context key {unknown[0]!r}; valid keys: {', '.join(KEYS)}")


# The context keys a user sets (Python or YAML); where a path came from is the loader's to say.
KEYS = tuple(f.name for f in fields(ParallelContext) if f.name != "output_paths_from")
_context = ParallelContext()


def set_auto_parallel_context(**kwargs) -> None:
    """Set context keys, MindSpore style; unknown keys or values raise `ConfigError`.

    Example:
        >>> set_auto_parallel_context(parallel_mode="auto_parallel", device_num=8)
        >>> get_auto_parallel_context("device_num")
        8
        >>> reset_auto_parallel_context()
    """
    global _context
    _check_keys(kwargs)
    _context = replace(_context, **mindspore_only(kwargs))


def get_auto_parallel_context(key: str):
    _check_keys([key])
    if key in NO_EFFECT:
        raise ConfigError(f"auto-parallel context key {key!r} has no effect in autostrat and is not kept")
    if key in HARDWARE_KEYS:  # the value the profile and the key give
        return getattr(_context.hardware_profile(), key)
    return getattr(_context, "search_mode" if key == "auto_parallel_search_mode" else key)


def reset_auto_parallel_context() -> None:
    global _context
    _context = ParallelContext()


def current_context() -> ParallelContext:
    """The frozen context that searches and runs receive."""
    return _context
