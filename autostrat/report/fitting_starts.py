"""Known starts for a search whose op-level space fits no budget: Megatron-LM's plan pieces.

`autostrat search` fits a config's plan into its budget (`frontend.run.plan_within_memory`).
The op-level search chooses strategies only: a config without recompute, pipeline stages or
optimiser sharding keeps every activation and parameter its strategies leave it, and the 405B
step keeps more than 80 GiB under every choice (`search.memory.peak_floor`). Before refusing,
the search prices plans of the same model and step known to trade memory away, as Megatron-LM
runs them, and returns the first that fits (cases):

- Applicable: a GPT or LLaMA config (Megatron's pieces are placed on their blocks) that leaves
  to the plan everything a plan decides (no seeds, pipeline, recompute or optimiser sharding
  keys: `report.estimate.SET_BY_PLAN`, nor their command-line options) and plans its model's
  own example inputs (a step of ``model.params.batch`` sequences), searched with the hardware,
  precision and cost model its text gives (the starts are made from it); otherwise no start is
  tried and the refusal stands.
- Starts (`known_starts`, in order): tensor parallelism inside a server (the largest ``tp``
  dividing the server's devices, ``device_num`` and the heads) with sequence parallelism, every
  block recomputed, ZeRO 1 over the data-parallel replicas, micro-batch 1, and every pipeline
  depth ``pp`` from 1 up (at most one stage per block, the blocks split as
  `models.megatron_plan.stage_layer_counts` says) whose ``dp`` divides the batch; a start whose
  parameters, gradients and optimiser state alone (Megatron's table, `_state_bytes`) take more
  than a quarter of the budget is skipped (`STATE_SHARE`).
- Pricing: each start as ``autostrat estimate`` prices that ``plan:`` (`report.estimate`, the
  search's own machinery), under no budget; the first whose exact peak fits is the plan, with a
  note naming the start and why the op-level search gave none. None fits: the op-level
  search's error, with the starts' peaks.
"""

from __future__ import annotations

import math
from dataclasses import replace

from autostrat.errors import AutostratError, InfeasibleError
from autostrat.frontend.yaml_text import parse_config_text
from autostrat.models.gpt import GPT
from autostrat.models.llama import LLaMA
from autostrat.redistribution.memo import clear_memos
from autostrat.report.estimate import SET_BY_PLAN, GivenPlan, estimate_config, plan_pieces_config
from autostrat.report.plan_space import device_splits
from autostrat.search.precision import state_bytes
from autostrat.strategies import divisors

# A start's model state may take at most this share of the budget, the rest left to activations
# and buffers: pricing a start at 16 384 devices takes the most of the search's time, so the
# first one priced should fit. A quarter makes the 405B step's first Llama 3's own plan (tp 8,
# pp 16: 19 GB of state per device; Dubey et al. 2024, Table 4).
STATE_SHARE = (1, 4)


def known_starts(net, device_num: int, devices_per_server: int, precision: str, budget: int) -> list[GivenPlan]:
    """The starts of the module docstring for `net` (a GPT or LLaMA) on `device_num` devices
    under `budget` bytes per device, in the order they are priced.

    Example (a 4-block LLaMA of 4 kv heads on 16 devices, 8 per server: tp 4, then pp 1, 2, 4):
        >>> net = LLaMA(layers=4, hidden=64, heads=8, kv_heads=4, seq=16, batch=8, vocab=128)
        >>> [(start.tp, start.pp, start.dp, start.zero) for start in known_starts(net, 16, 8, "bf16", 2**30)]
        [(4, 1, 4, 1), (4, 2, 2, 1), (4, 4, 1, 0)]
    """
    attention = net.blocks[0].attention
    heads = attention.kv_heads if isinstance(net, LLaMA) else attention.heads
    tp = max(t for t in divisors(min(device_num, devices_per_server)) if device_num % t == 0 and heads % t == 0)
    parameters = sum(math.prod(parameter.shape) for _, parameter in net.parameters_and_names())
    starts = []
    splits = [(pp, dp) for t, pp, dp in device_splits(device_num, net.batch, len(net.blocks), devices_per_server) if t == tp]
    for pp, dp in splits:
        start = GivenPlan(tp, pp, dp, "full", int(dp > 1), 1, net.batch, sequence_parallel=tp > 1)
        if _state_bytes(start, parameters, precision) * STATE_SHARE[1] <= budget * STATE_SHARE[0]:
            starts.append(start)
    return starts


def _state_bytes(start: GivenPlan, parameters: int, precision: str) -> int:
    """Megatron's table's bytes per device for `parameters` split over ``tp · pp`` devices."""
    whole, split = state_bytes(precision)
    return math.ceil(parameters * (whole + split / (start.dp if start.zero else 1)) / (start.tp * start.pp))


def start_name(start: GivenPlan) -> str:
    """A start in the ``plan:`` vocabulary, as a note names it."""
    return (f"tp {start.tp} x pp {start.pp} x dp {start.dp}{', sequence parallel' if start.sequence_parallel else ''}, "
            f"recompute {start.recompute}, zero {start.zero}, micro-batch {start.micro_batch}")


def applicable(config) -> bool:
    """Whether `config` takes the starts (the module docstring's first case)."""
    if not isinstance(config.net, (GPT, LLaMA)) or not config.text or config.optimizer is None:
        return False
    data = parse_config_text(config.text, config.path)
    if set(data) & (set(SET_BY_PLAN) - {"device_num", "inputs"}) or config.strategies or config.recompute:
        return False
    context = config.context  # command-line options that decide what a plan decides
    if context.pipeline_stages > 1 or context.enable_parallel_optimizer or config.micro_size > 1 or context.auto_recompute:
        return False
    return [tensor.shape for tensor in config.inputs] == [tensor.shape for tensor in config.net.example_inputs()]


def _priced_alike(start, context) -> bool:
    """Whether a start's context, made from the config's text, prices as the search's `context`
    does (a command-line --hardware, --precision or --cost-model it would not see: no start)."""
    return (start.hardware_profile() == context.hardware_profile() and start.precision == context.precision
            and start.cost_model == context.cost_model)


def plan_from_starts(config, device_num: int, budget: int, refusal: AutostratError) -> tuple:
    """The plan of the first start (`known_starts`) of `config` on `device_num` devices whose
    peak fits `budget` bytes per device, and the note saying so; `refusal` (why the op-level
    search gave none) raised again, with the starts' peaks, when none fits or none applies.

    Example: see tests/test_fitting_starts.py (a tiny LLaMA under a budget its strategies alone never fit).
    """
    if not applicable(config):
        raise refusal
    data = {key: value for key, value in parse_config_text(config.text, config.path).items()
            if key not in ("device_num", "inputs", "max_device_memory")}
    hardware = config.context.hardware_profile()
    # The op-level search's redistribution memos are of layouts over every device; a start's
    # searches are over one stage's devices and share none of them: freed, they add nothing to
    # the starts' peak (memos only: a plan is the same with them or without).
    clear_memos()
    tried = []
    for start in known_starts(config.net, device_num, hardware.devices_per_server, config.context.precision, budget):
        pieces = plan_pieces_config(dict(data), config.text, config.path, start)
        if not _priced_alike(pieces.context, config.context):
            raise refusal
        estimate = estimate_config(pieces, start)
        peak = max(stage.peak_bytes for stage in estimate.memory)
        if peak <= budget:
            note = (f"{config.path}: the op-level search found no plan within {budget:,} bytes per device ({refusal}); "
                    f"the plan is the first known start that fits, Megatron-LM's {start_name(start)}, peak {peak:,} bytes"
                    + (f" (priced before it: {'; '.join(tried)})" if tried else ""))
            return estimate.plan, [note]
        tried.append(f"{start_name(start)}: peak {peak:,} bytes")
    found = f"; the known starts peak over it too: {'; '.join(tried)}" if tried else "; no known start's model state takes a quarter of it or less"
    raise type(refusal)(f"{refusal}{found}") from None
