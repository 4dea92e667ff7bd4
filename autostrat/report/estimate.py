"""`autostrat estimate`: the predicted step time, throughput and memory of a given Megatron-style plan.

A config with a ``plan:`` section (and optionally ``global_batch``) names the plan as Megatron-LM
does; the estimate turns it into the search's own inputs and plans it with the same machinery a
search uses (`frontend.run.plan_config`), so a given plan and a searched one are priced by one
model (cases):

- ``tp`` and ``dp``: Megatron's tensor-parallel seeds on every block over ``tp`` devices, the
  activations' rows over ``dp``, the norms, residual adds and biases between the tensor-parallel
  regions whole on the ``tp`` devices (`models.megatron_plan.tensor_parallel_seeds`); the other ops propagate.
- ``cp``: context parallelism, Llama 3's all-gather form: each data-parallel rank's sequence split
  over ``cp`` devices, the products' rows over ``dp · cp``, every fused attention's query rows over
  ``cp`` with K and V gathered (`models.megatron_plan.context_parallel_seeds`); ``device_num`` is
  ``tp · pp · dp · cp``. It needs fused attention and ``micro_batch`` 1 (more sequences per rank
  would put whole sequences, not parts of one, on the ``cp`` devices' rows).
- ``pp``: ``pipeline_stages``, the blocks split over the ``pp · vp`` model stages as Megatron
  splits them, evenly or with fewer on the outermost stages where they do not divide
  (`models.megatron_plan.mark_pipeline_stages`: the embedding on the first,
  the LM head and the loss on the last), given as the blocks' ``pipeline_stage`` (1F1B).
- ``vp``: virtual stages per pipeline rank: Megatron's interleaved 1F1B
  (``pipeline_schedule: interleaved_1f1b``, ``pipeline_interleave_num: vp``); ``pp`` above 1.
- ``micro_batch`` and ``global_batch``: ``global_batch / (dp · micro_batch)`` micro-batches per
  step (gradient accumulation when ``pp`` is 1), each of ``dp · micro_batch`` sequences.
- ``sequence_parallel``: the norms, residual adds and biases between the tensor-parallel regions
  split by rows over ``dp · tp`` devices (`models.megatron_plan.sequence_parallel_seeds`); the
  backward gathers the norms' outputs again for the weight gradients, as Megatron's does
  (``backward_regathers``, `models.megatron_plan.weight_gradient_seeds`).
- ``recompute``: ``none``, ``full`` (every block recomputed in the backward) or ``selective``
  (every block's attention core: `models.megatron_plan.mark_selective_recompute`).
- ``zero``: 0, or 1 (the optimiser state split over the data-parallel replicas, Megatron's
  distributed optimizer; ``enable_parallel_optimizer`` with no size threshold).
- ``ep`` and ``etp``: a mixture of experts' routed experts over ``ep`` devices and each expert's
  FFN width over ``etp`` (default 1, not Megatron's default of ``tp``), folded onto each stage's
  ``dp · tp`` devices (`models.megatron_plan.expert_parallel_seeds`); ``device_num`` stays
  ``tp · pp · dp · cp``. Given for every model with experts (``ep`` 1: every expert on every device).
- What the machinery cannot express yet is a ConfigError naming the key, the value and "not yet
  expressible" (``ep`` or ``etp`` above 1 without experts or with ``cp`` above 1, ``cp`` above 1
  as said, ZeRO 2 and 3), never a number for another plan.
"""

from __future__ import annotations

import json
import warnings
from dataclasses import dataclass, replace

from autostrat.errors import ConfigError
from autostrat.frontend.config import config_from_data, with_recompute
from autostrat.frontend.run import plan_config
from autostrat.frontend.yaml_text import parse_config_text
from autostrat.models.flops import model_flops
from autostrat.models.megatron_plan import (context_parallel_seeds, expert_parallel_seeds, mark_pipeline_stages,
                                            mark_selective_recompute, sequence_parallel_seeds, tensor_parallel_seeds,
                                            weight_gradient_seeds)
from autostrat.reading import read_text
from autostrat.redistribution import collector_paused
from autostrat.search.memory_breakdown import KINDS, memory_breakdowns
from autostrat.search.precision import PRECISION_MEMORY
from autostrat.search.prediction import format_nanoseconds
from autostrat.tables import format_table

# Each plan key and its default.
PLAN_KEYS = {"tp": 1, "pp": 1, "vp": 1, "dp": 1, "cp": 1, "ep": 1, "etp": 1, "sequence_parallel": False, "recompute": "none",
             "zero": 0, "micro_batch": 1}
# Per key, why some of its values are not yet expressible.
NOT_YET = {
    "cp": "context parallelism splits one sequence per data-parallel rank: micro_batch must be 1",
    "ep": "expert parallelism splits whole sequences' tokens: cp must be 1",
    "etp": "expert parallelism splits whole sequences' tokens: cp must be 1",
    "zero": "autostrat's optimiser shard splits the optimiser state only (ZeRO 1); gradients and parameters stay whole",
}
RECOMPUTE = ("none", "full", "selective")
SET_BY_PLAN = ("device_num", "enable_parallel_optimizer", "inputs", "micro_size", "parallel_optimizer_config",
               "pipeline_stage", "pipeline_stages", "recompute", "strategies")  # keys a plan decides itself


@dataclass(frozen=True)
class GivenPlan:
    """A config's ``plan:`` section, checked."""

    tp: int
    pp: int
    dp: int
    recompute: str
    zero: int
    micro_batch: int
    global_batch: int
    sequence_parallel: bool = False
    vp: int = 1  # model stages per pipeline rank (interleaved 1F1B)
    cp: int = 1
    ep: int = 1  # routed experts split over ep devices of a stage's dp · tp, their width over etp
    etp: int = 1

    @property
    def device_num(self) -> int:
        return self.tp * self.pp * self.dp * self.cp

    @property
    def micro_batches(self) -> int:
        return self.global_batch // (self.dp * self.micro_batch)


def read_given_plan(data: dict, path) -> GivenPlan:
    """The checked ``plan`` and ``global_batch`` of a config's YAML `data` (read from `path`).

    Example:
        >>> read_given_plan({"plan": {"tp": 8, "pp": 2}, "global_batch": 4}, "x.yaml").micro_batches
        4
    """
    section = data.get("plan")
    if not isinstance(section, dict):
        raise ConfigError(f"{path}: plan: expected a mapping of {', '.join(PLAN_KEYS)}, got {section!r}")
    unknown = sorted(set(section) - set(PLAN_KEYS))
    if unknown:
        raise ConfigError(f"{path}: plan.{unknown[0]}: unknown key; a plan has {', '.join(PLAN_KEYS)}")
    values = PLAN_KEYS | section
    for key in ("tp", "pp", "vp", "dp", "cp", "ep", "etp", "micro_batch"):
        _positive(values[key], f"{path}: plan.{key}")
    if not isinstance(values["sequence_parallel"], bool):
        raise ConfigError(f"{path}: plan.sequence_parallel: expected true or false, got {values['sequence_parallel']!r}")
    if values["recompute"] not in RECOMPUTE:
        raise ConfigError(f"{path}: plan.recompute: expected one of {', '.join(RECOMPUTE)}, got {values['recompute']!r}")
    if values["zero"] not in (0, 1, 2, 3) or isinstance(values["zero"], bool):
        raise ConfigError(f"{path}: plan.zero: expected a ZeRO level 0, 1, 2 or 3, got {values['zero']!r}")
    blocked = [key for key in ("ep", "etp") if values[key] != 1 and values["cp"] != 1] + ["zero"] * (values["zero"] > 1)
    blocked += ["cp"] * (values["cp"] > 1 and values["micro_batch"] > 1)
    if blocked:
        raise ConfigError(f"{path}: plan.{blocked[0]}: {values[blocked[0]]!r} is not yet expressible ({NOT_YET[blocked[0]]})")
    rows = values["dp"] * values["micro_batch"]
    batch = _positive(data.get("global_batch", rows), f"{path}: global_batch")
    if batch % rows:
        raise ConfigError(f"{path}: global_batch: expected a multiple of dp × micro_batch = {rows}, got {batch}")
    if values["vp"] > 1 and values["pp"] == 1:
        raise ConfigError(f"{path}: plan.vp: virtual stages interleave a pipeline: expected 1 with pp 1, got {values['vp']}")
    return GivenPlan(values["tp"], values["pp"], values["dp"], values["recompute"], values["zero"], values["micro_batch"], batch,
                     values["sequence_parallel"], vp=values["vp"], cp=values["cp"], ep=values["ep"], etp=values["etp"])


def _busiest_group_ns(pipeline) -> int:
    """One micro-batch's work on the busiest device group: the slots of its chunks."""
    groups = [0] * pipeline.devices
    for stage, slot in enumerate(pipeline.split.slot_ns):
        groups[pipeline.device_of(stage)] += slot
    return max(groups)


def _positive(value, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{where}: expected a positive integer, got {value!r}")
    return value


def given_plan_config(path):
    """The config of a YAML file with a ``plan:`` section, as the search takes it (the module
    docstring's cases), and the plan.

    Example:
        >>> config, given = given_plan_config("configs/estimate/gpt_small.yaml")
        >>> config.context.device_num, config.context.pipeline_stages, config.micro_size, len(config.recompute)
        (8, 2, 4, 2)
    """
    text = read_text(path, "config")
    data = parse_config_text(text, path)
    given = read_given_plan(data, path)
    return plan_pieces_config(data, text, path, given), given


def search_keys(data: dict, path, global_batch: int) -> dict:
    """The context and model keys every plan of a config's YAML `data` (read from `path`) is
    searched with: a training step of Adam on `global_batch` sequences, the config's own keys
    (hardware, precision, model) over them; none of the keys a plan decides (`SET_BY_PLAN`).

    Example:
        >>> search_keys({"model": {"name": "GPT"}}, "x.yaml", 8)["model"]
        {'name': 'GPT', 'params': {'batch': 8}}
    """
    taken = sorted(set(data) & set(SET_BY_PLAN))
    if taken:
        raise ConfigError(f"{path}: {taken[0]}: the plan section decides it; leave it out of a config with a plan")
    keys = {"parallel_mode": "auto_parallel", "search_mode": "sharding_propagation", "gradients_mean": True,
            "optimizer": {"name": "adam"}} | {key: value for key, value in data.items() if key not in ("plan", "global_batch")}
    model = data.get("model")
    if isinstance(model, dict):
        params = model.get("params") or {}
        if isinstance(params, dict) and params.get("batch", global_batch) != global_batch:
            raise ConfigError(f"{path}: model.params.batch: the global batch comes from global_batch "
                              f"({global_batch}); got {params['batch']!r}")
        keys["model"] = model | {"params": (params if isinstance(params, dict) else {}) | {"batch": global_batch}}
    return keys


def plan_pieces_config(data: dict, text: str, path, given: GivenPlan):
    """The config the search takes for the plan `given` of a config's YAML `data` (its `text`,
    read from `path`; a ``plan`` key in `data` is ignored): `given_plan_config`'s work, for the
    plans a plan-space search tries too (`report.plan_space`).

    Example: see `given_plan_config`.
    """
    keys = search_keys(data, path, given.global_batch) | {"device_num": given.device_num, "pipeline_stages": given.pp}
    if given.vp > 1:
        keys |= {"pipeline_schedule": "interleaved_1f1b", "pipeline_interleave_num": given.vp}
    if given.zero:
        keys |= {"enable_parallel_optimizer": True, "parallel_optimizer_config": {"parallel_optimizer_threshold": 0}}
    config = config_from_data(keys, text, path, given.micro_batches, example_inputs=True)
    rows = given.dp * given.cp  # the norms' rows: a sequence's parts on cp devices of each data-parallel rank
    seeds = tensor_parallel_seeds(config.net, given.tp, given.dp, f"{path}: plan.tp", given.cp)
    if given.sequence_parallel:  # and the backward gathers the sequence again, as Megatron's does
        seeds |= sequence_parallel_seeds(config.net, given.tp, rows)
        config = replace(config, context=replace(config.context, backward_regathers=True))
    if given.cp > 1:
        seeds |= context_parallel_seeds(config.net, given.tp, given.dp, given.cp, f"{path}: plan.cp")
    if given.ep * given.etp > 1 or any(getattr(block, "sparse", False) for block in config.net.blocks):
        seeds |= expert_parallel_seeds(config.net, given.ep, given.etp, given.dp * given.tp, given.dp, given.dp * given.micro_batch,
                                       f"{path}: plan.{'ep' if given.ep > 1 else 'etp'}")
    if given.sequence_parallel:  # each weight gradient as Megatron's, from the input gathered again
        seeds |= weight_gradient_seeds(config.net, seeds)
    config = replace(config, strategies=seeds)
    if given.pp > 1:  # Megatron's even split of the blocks, given as their pipeline_stage
        mark_pipeline_stages(config.net, given.pp * given.vp, f"{path}: plan.pp")
    if given.recompute == "selective":
        mark_selective_recompute(config.net)  # the net's own marks: planned as Primitive.recompute
    if given.recompute == "full":
        config = with_recompute(config, [f"blocks.{index}" for index in range(len(config.net.blocks))], f"{path}: plan.recompute")
    return config


@dataclass(frozen=True)
class Estimate:
    """A given plan's predicted step: `phases_ns` sum to the step time (a pipeline's: its
    micro-batches' slots, the bubble, the slowest device group's synchronisation and updates), the
    bubble's idle share, the model FLOPs of a step and their formula, and per stage the memory
    one device holds at its peak (`memory_breakdown`); what it reads of its plan (hardware,
    precision, the pipeline's summary) is kept apart, so that an estimate priced in another
    process comes back without the plan (`detached`)."""

    given: GivenPlan
    plan: object  # None once detached
    model: str
    seq: int
    model_flops: int
    formula: str
    phases_ns: dict
    bubble: float
    memory: tuple
    hardware: object
    precision: str
    pipeline_summary: str = ""  # `Pipeline.summary()`; "" without stages

    def detached(self) -> Estimate:
        """This estimate without its plan: its figures, text and JSON are the same, and it
        pickles (a plan holds closures).

        Example:
            >>> found = estimate("configs/estimate/gpt_small.yaml")
            >>> found.detached().plan, found.detached().to_json() == found.to_json()
            (None, True)
        """
        return replace(self, plan=None)

    @property
    def step_time_s(self) -> float:
        return sum(self.phases_ns.values()) / 1e9

    @property
    def tokens_per_s_per_device(self) -> float:
        return self.given.global_batch * self.seq / self.step_time_s / self.given.device_num

    @property
    def model_tflops_per_device(self) -> float:
        return self.model_flops / self.step_time_s / self.given.device_num / 1e12

    @property
    def peak_tflops_per_device(self) -> float:
        """The nominal matrix rate of the plan's precision (fp32 runs at half the 16-bit rate, as
        `Hardware.compute_nanoseconds` charges it), without efficiency factors."""
        full = self.hardware.device_flops / 1e12
        return full if self.precision != "fp32" else full / 2

    @property
    def mfu(self) -> float:
        return self.model_tflops_per_device / self.peak_tflops_per_device

    def to_dict(self) -> dict:
        given = self.given
        return {
            "plan": {"tp": given.tp, "pp": given.pp, "vp": given.vp, "dp": given.dp, "cp": given.cp, "ep": given.ep, "etp": given.etp,
                     "sequence_parallel": given.sequence_parallel,
                     "recompute": given.recompute, "zero": given.zero,
                     "micro_batch": given.micro_batch, "global_batch": given.global_batch,
                     "micro_batches": given.micro_batches},
            "device_num": given.device_num, "hardware": self.hardware.name, "precision": self.precision,
            "step_time_s": self.step_time_s, "phases_s": {name: ns / 1e9 for name, ns in self.phases_ns.items()},
            "bubble": self.bubble, "tokens_per_s_per_device": self.tokens_per_s_per_device,
            "model_flops_per_step": self.model_flops, "model_flops_formula": self.formula,
            "model_tflops_per_device": self.model_tflops_per_device, "peak_tflops_per_device": self.peak_tflops_per_device,
            "mfu": self.mfu, "peak_bytes_per_device": max(stage.peak_bytes for stage in self.memory),
            "stages": [{"stage": index, "peak_bytes": stage.peak_bytes, **stage.bytes_by_kind,
                        "most_activation_bytes": stage.most_activation_bytes} for index, stage in enumerate(self.memory)],
        }

    def lines(self, path) -> list[str]:
        """The human-readable estimate of the config at `path`."""
        given = self.given
        lines = [f"{path}: {self.model} on {given.device_num} devices: tp {given.tp} x pp {given.pp} x dp {given.dp}"
                 f"{f' x cp {given.cp}' if given.cp > 1 else ''}{f', ep {given.ep}' if given.ep > 1 else ''}"
                 f"{f', etp {given.etp}' if given.etp > 1 else ''}, "
                 f"{'sequence parallel, ' if given.sequence_parallel else ''}micro-batch {given.micro_batch}, "
                 f"{given.micro_batches} micro-batch(es) of global batch {given.global_batch}, recompute {given.recompute}, zero {given.zero}; hardware {self.hardware.name or 'given field by field'}, "
                 f"precision {self.precision}"]
        if self.precision != "fp32":
            lines.append(f"precision {self.precision}: {PRECISION_MEMORY}")
        if self.pipeline_summary:
            lines.append(self.pipeline_summary)
        lines.append(f"step time: {format_nanoseconds(round(self.step_time_s * 1e9))}")
        lines += [f"  {name}: {format_nanoseconds(ns)}" for name, ns in self.phases_ns.items()]
        lines.append(f"  bubble: {self.bubble:.1%} of the step idle on average over the stages")
        lines.append(f"tokens/s per device: {self.tokens_per_s_per_device:,.1f}")
        lines.append(f"model TFLOP/s per device: {self.model_tflops_per_device:,.4g}; MFU {self.mfu:.2%} of "
                     f"{self.peak_tflops_per_device:,.1f} TFLOP/s")
        lines.append(f"  model FLOPs per step: {self.model_flops:.4e} = {self.formula}")
        unit, size = next((unit, size) for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10), ("bytes", 1))
                          if max(stage.peak_bytes for stage in self.memory) >= size or size == 1)
        lines.append(f"peak memory per device, by stage ({unit}):")
        headers = ["stage", *(kind.replace("_", " ") for kind in KINDS), "peak", "most activations held"]
        rows = [[str(index), *(f"{stage.bytes_by_kind[kind] / size:,.2f}" for kind in KINDS), f"{stage.peak_bytes / size:,.2f}",
                 f"{stage.most_activation_bytes / size:,.2f}"] for index, stage in enumerate(self.memory)]
        return lines + [format_table(headers, rows, "  ")]

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2) + "\n"


def estimate(path) -> Estimate:
    """The estimate of the given plan in the config at `path` (see the module docstring).

    Example (2 stages of tp 2 x dp 2, 4 micro-batches: the phases sum to the pipeline's step):
        >>> found = estimate("configs/estimate/gpt_small.yaml")
        >>> sum(found.phases_ns.values()) == found.plan.pipeline.step_time_ns, len(found.memory)
        (True, 2)
    """
    with collector_paused():  # building the config allocates as much as the estimate (`estimate_config`)
        config, given = given_plan_config(path)
        return estimate_config(config, given)


def estimate_given(data: dict, text: str, path, given: GivenPlan) -> Estimate:
    """The estimate of the plan `given` of a config's YAML `data` (its `text`, read from
    `path`): what ``autostrat estimate`` gives for that config with `given` as its ``plan:``,
    for the plans a plan-space search tries (`report.plan_space`, `report.expert_plans`).

    Example (the small GPT's plan, given apart from its config: the same figures):
        >>> text = open("configs/estimate/gpt_small.yaml").read()
        >>> data = parse_config_text(text, "gpt_small.yaml")
        >>> given = read_given_plan(data, "gpt_small.yaml")
        >>> found = estimate_given(data, text, "configs/estimate/gpt_small.yaml", given)
        >>> found.to_json() == estimate("configs/estimate/gpt_small.yaml").to_json()
        True
    """
    with collector_paused():
        return estimate_config(plan_pieces_config(dict(data), text, path, given), given)


def estimate_config(config, given: GivenPlan) -> Estimate:
    """The estimate of `config`, the search's config of the plan `given` (`plan_pieces_config`).

    The collector is paused throughout, as `search.search` pauses it: a pipeline's schedule
    simulation and memory replay allocate millions of small objects next to the memos, none in
    a cycle, and the collector's passes over them were 29 % of DeepSeek-V3's search (its five
    estimates: 37.2 s with the collector on, 26.4 s with it off throughout)."""
    with warnings.catch_warnings(), collector_paused():
        # The seeds disagree by design: a row-split product's partial output is resolved for the
        # ops after it, an AllReduce (whole on the tp devices) or a ReduceScatter (sequence parallel).
        warnings.filterwarnings("ignore", message="seeds of .* disagree on .*: a redistribution")
        plan, _ = plan_config(config)
        return estimate_of(plan, config.net, given)


def estimate_of(plan, net, given: GivenPlan) -> Estimate:
    """The `Estimate` of `plan` (a plan of `net`, given or searched, in `given`'s terms): the
    figures the search's prediction of it gives.

    Example: see `estimate`.
    """
    flops, formula = model_flops(net, given.global_batch)
    if plan.pipeline:
        pipeline = plan.pipeline
        busy = given.micro_batches * _busiest_group_ns(pipeline)
        phases = {f"forward and backward of {given.micro_batches} micro-batch(es)": busy,
                  "pipeline fill and drain (bubble)": pipeline.split.step_time_ns - busy,
                  "gradient synchronisation and update (slowest device group)": max(pipeline.device_once_ns, default=0)}
        bubble = pipeline.split.bubble
    else:
        phases, bubble = {name: phase.time_ns for name, phase in plan.prediction.phases.items()}, 0.0
    return Estimate(given, plan, type(net).__name__, net.seq, flops, formula, phases, bubble, memory_breakdowns(plan),
                    plan.hardware, plan.precision, plan.pipeline.summary() if plan.pipeline else "")
