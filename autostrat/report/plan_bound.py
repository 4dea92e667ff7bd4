"""A lower bound on the step time `autostrat estimate` predicts for a plan of the ``plan:``
vocabulary, cheap enough to compute for every candidate of a plan-space search before any is
priced (`report.plan_space` prices them in increasing bound order and stops at the first whose
bound cannot beat the fastest fitting plan found: branch and bound, exact).

What the bound counts (cases), each a part of the estimate's step that no strategy, split or
schedule the estimate can choose avoids:

- Matrix products: per block, every 2-D weight multiplies each token of the micro-batch once
  in the forward (``2 · tokens · weights`` flops), attention's two products ``4 · sequences ·
  s² · h`` unfused, at least half that fused (a causal fused attention works on at least half
  its score matrix, `cost.op_cost.causal_work`), the LM head ``2 · tokens · h · V``; the backward twice the
  forward (input and weight gradients); full recompute the block's forward once more,
  selective recompute an unfused attention's scores product again (a fused one is not marked).
  Every op's work is spread over at most the ``tp · dp`` devices of its stage, at the
  precision's rate (`Hardware.compute_nanoseconds`: 16-bit at ``device_flops ·
  matmul_efficiency``, fp32 at half).
- Memory traffic (`Hardware.compute_nanoseconds` adds an op's bytes read and written over
  ``device_memory_bandwidth · memory_efficiency`` to its flops): each product reads its input
  rows and weight and writes its output rows in the forward; its backward reads the output's
  gradient twice, the weight and the input, and writes the input's and the weight's gradients.
  An unfused attention (GPT's, LLaMA's without ``fused_attention``) holds four score-sized
  tensors in the forward (the scores, scaled, masked, softmax), each written once and read at
  least once, and at least two in the backward (the softmax's output gradient and its input
  gradient); selective recompute writes and reads the scores, scaled and masked again and
  writes the softmax. Every element at 2 bytes (4 in fp32), none of the other ops' traffic counted. A
  profile whose `kernel_passes` lets an op move fewer bytes than it holds gets no traffic term.
- Tensor parallelism (``tp`` above 1), at the fastest link: the seeds leave each block's two
  row-split products partial over the ``tp`` devices and their readers (the bias or residual
  add) whole or split by rows, so the forward resolves two partial ``[rows, h]`` tensors per
  block: at least an AllReduce's bytes (or ReduceScatter then AllGather: the same). The
  backward resolves the two column-split products' partial input gradients: AllReduces where
  their readers are whole (no sequence parallelism), at least ReduceScatters where they are
  split by rows (the AllGathers sequence parallelism adds there are not counted). Full
  recompute runs the forward's reductions again.
- The update: every block weight's Adam update reads and writes seven weight-sized tensors
  (the 16-bit parameter, its gradient, the fp32 main parameter and two moments, read; the
  parameter and the moments, written), each counted at 2 bytes, spread over its stage's
  devices; its gradient synchronisation, the weight's slice on a device (split over ``tp`` by
  the seeds) partial over the ``dp`` replicas: at least a ReduceScatter's bytes at the fastest link.
- The pipeline: per model stage ``k`` (`models.megatron_plan.stage_layer_counts`, the embedding on
  the first, the LM head on the last) its forward ``F_k`` and backward ``B_k`` by the two cases
  above; device group ``g`` runs stages ``g, g + p, ...`` (1F1B and Megatron's interleaved
  1F1B) for every micro-batch, cannot start before one micro-batch's forward has crossed the
  stages before ``g``, and its last instruction, a backward (these schedules run the weight
  gradient with it), is followed by that micro-batch's backward through them. So the step is at
  least ``Σ_{k<g} (F_k + B_k) + m · Σ_{k on g} (F_k + B_k)`` for every ``g``, with ``m``
  micro-batches; then the slowest device group's synchronisation and updates
  (`Pipeline.device_once_ns`, run once per step, of every chunk it holds): at least their mean
  over the ``pp · vp`` model stages (a group holds ``vp`` of them, so this is loose by ``vp``).
- The op-level search's plan (one step of the whole batch on every device, no pipeline): its
  products, traffic and updates over all devices, no communication.

A model with mixture-of-experts blocks (each token meets only some of its weights) is bounded
by 0: always priced.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from autostrat.models.megatron_plan import stage_layer_counts

FLOAT_MARGIN = 1 - 1e-9  # the sums below are floats; the estimate's integer nanoseconds round each op up


@dataclass(frozen=True)
class ModelShape:
    """What the bound reads of a GPT or LLaMA net: its blocks, sequence, hidden size, vocabulary,
    the 2-D weight elements of one block, and whether every block is dense (no experts)."""

    layers: int
    seq: int
    hidden: int
    vocab: int
    block_weights: int
    dense: bool
    block_rows: int = 0  # per token, the input and output elements of the block's products (Σ in + out)
    heads: int = 0  # attention heads of an unfused attention (0: fused, no score tensors)

    @classmethod
    def of(cls, net) -> ModelShape:
        """The shape of `net` (its blocks are alike: Megatron's plan pieces place them alike).

        Example:
            >>> from autostrat.models.gpt import GPT
            >>> ModelShape.of(GPT(layers=2, hidden=32, heads=4, seq=8, batch=2, vocab=64))
            ModelShape(layers=2, seq=8, hidden=32, vocab=64, block_weights=12288, dense=True, block_rows=576, heads=4)
        """
        block = net.blocks[0]
        weights = sum(math.prod(parameter.shape) for _, parameter in block.parameters_and_names()
                      if len(parameter.shape) == 2)
        dense = not any(getattr(one, "sparse", False) for one in net.blocks)
        rows = sum(sum(parameter.shape) for _, parameter in block.parameters_and_names() if len(parameter.shape) == 2)
        heads = 0 if getattr(block.attention, "fused", False) else block.attention.heads
        return cls(len(net.blocks), net.seq, net.hidden, net.embedding.embedding_table.shape[0], weights, dense, rows, heads)


def stage_times_bound(shape: ModelShape, given, hardware, precision: str) -> list[tuple[float, float]]:
    """Per model stage of `given` (a `report.estimate.GivenPlan`), lower bounds in nanoseconds
    on one micro-batch's forward and backward there (the module docstring's first three cases).

    Example (2 blocks, tp 2 x pp 2: stage 1 also holds the LM head):
        >>> from autostrat.cost import PROFILES
        >>> from autostrat.report.estimate import GivenPlan
        >>> shape = ModelShape(2, 2048, 6144, 51200, 12 * 6144**2, True, 18 * 6144, 64)
        >>> [tuple(round(t) for t in times) for times in stage_times_bound(
        ...     shape, GivenPlan(2, 2, 1, "none", 0, 1, 4), PROFILES["a100-80gb"], "bf16")]
        [(5488816, 9230054), (8289244, 14830909)]
    """
    forward, backward, head_forward, head_backward = _work_times(
        shape, given.dp * given.micro_batch, given.tp * given.dp, hardware, precision, given.recompute)
    if given.tp > 1:  # two partial [rows, h] tensors per block, each device's rows: micro_batch sequences
        bandwidth = max(hardware.intra_server_bandwidth, hardware.inter_server_bandwidth) * hardware.network_efficiency
        piece = given.micro_batch * shape.seq * shape.hidden * (4 if precision == "fp32" else 2)
        scatter = 2 * (given.tp - 1) / given.tp * piece / bandwidth * 1e9  # two ReduceScatters' bytes
        forward += 2 * scatter
        backward += scatter * (1 if given.sequence_parallel else 2) + 2 * scatter * (given.recompute == "full")
    counts = stage_layer_counts(shape.layers, given.pp * given.vp)
    last = len(counts) - 1
    return [(count * forward + (head_forward if stage == last else 0), count * backward + (head_backward if stage == last else 0))
            for stage, count in enumerate(counts)]


def _work_times(shape: ModelShape, sequences: int, group: int, hardware, precision: str, recompute: str) -> tuple:
    """Nanoseconds at least of one block's forward and backward (with what `recompute` runs
    again: none, selective, full), then the LM head's, on `sequences` sequences spread over
    `group` devices: their products' flops and the traffic the module docstring counts."""
    tokens = sequences * shape.seq
    fastest = max([1.0] + [rate for _, rate in hardware.kernel_rates])  # a kernel faster than the rate: still a floor
    flops = hardware.device_flops * hardware.matmul_efficiency * fastest * (0.5 if precision == "fp32" else 1.0) * group / 1e9
    moved = hardware.device_memory_bandwidth * hardware.memory_efficiency * group / 1e9 / (4 if precision == "fp32" else 2)
    if any(passes < 1 for _, passes in hardware.kernel_passes):
        moved = math.inf  # elements per nanosecond: no traffic term
    scores = sequences * shape.heads * shape.seq**2
    products = 2 * tokens * shape.block_weights + (4 if shape.heads else 2) * sequences * shape.seq**2 * shape.hidden
    forward = products / flops + (tokens * shape.block_rows + shape.block_weights + 8 * scores) / moved
    backward = 2 * products / flops + (2 * tokens * shape.block_rows + 2 * shape.block_weights + 4 * scores) / moved
    head = 2 * tokens * shape.hidden * shape.vocab / flops
    head_moved = (tokens * (shape.hidden + shape.vocab) + shape.hidden * shape.vocab) / moved
    again = {"none": 0.0, "full": forward,
             "selective": (2 * sequences * shape.seq**2 * shape.hidden / flops + 7 * scores / moved) * (shape.heads > 0)}
    return forward, backward + again[recompute], head + head_moved, 2 * (head + head_moved)


def step_time_bound(shape: ModelShape, given, hardware, precision: str, split_backward: bool = False) -> int:
    """A lower bound in nanoseconds on the step time the estimate predicts for `given` (the
    module docstring); with `split_backward` (a configured schedule that runs the weight
    gradients apart, `search.schedules.SPLIT_BACKWARD`, whose last instruction on a device may
    be one) without the backward through the stages before a device group.

    Example (22B on 8 devices as tp 8 with full recompute):
        >>> from autostrat.cost import PROFILES
        >>> from autostrat.report.estimate import GivenPlan
        >>> shape = ModelShape(48, 2048, 6144, 51200, 12 * 6144**2, True, 18 * 6144, 64)
        >>> step_time_bound(shape, GivenPlan(8, 1, 1, "full", 0, 4, 4), PROFILES["a100-80gb"], "bf16")
        1109648645
    """
    if not shape.dense:
        return 0
    times = stage_times_bound(shape, given, hardware, precision)
    stages = [forward + backward for forward, backward in times]
    before = [forward if split_backward else forward + backward for forward, backward in times]
    devices = given.pp
    bound = max(sum(before[:group]) + given.micro_batches * sum(stages[group::devices]) for group in range(devices))
    return math.floor((bound + _once_time(shape, given, hardware)) * FLOAT_MARGIN)


def _update_time(shape: ModelShape, device_num: int, hardware) -> float:
    """Nanoseconds at least of every block weight's update spread over `device_num` devices."""
    if any(passes < 1 for _, passes in hardware.kernel_passes):
        return 0.0
    moved = 7 * 2 * shape.layers * shape.block_weights  # bytes
    return moved / (hardware.device_memory_bandwidth * hardware.memory_efficiency * device_num) * 1e9


def _once_time(shape: ModelShape, given, hardware) -> float:
    """Nanoseconds at least of the slowest model stage's once-a-step work: the mean over the
    ``pp · vp`` model stages of the updates on each stage's ``tp · dp`` devices, and of the
    gradient synchronisation (each device's ``1 / tp`` of its stage's block weights, partial over
    ``dp``: at least a ReduceScatter's bytes, 2 each, at the fastest link)."""
    stages, group = given.pp * given.vp, given.tp * given.dp
    bandwidth = max(hardware.intra_server_bandwidth, hardware.inter_server_bandwidth) * hardware.network_efficiency
    scatter = shape.layers * shape.block_weights / given.tp * 2 * (given.dp - 1) / given.dp / bandwidth * 1e9
    return (_update_time(shape, group, hardware) + scatter) / stages


def op_level_bound(shape: ModelShape, device_num: int, global_batch: int, hardware, precision: str) -> int:
    """A lower bound in nanoseconds on the op-level search's plan of the whole `global_batch`
    on `device_num` devices: every block's and the LM head's forward and backward
    (`_work_times`) spread over every device (no recompute: the op-level search recomputes
    nothing it is not told to), no communication.

    Example:
        >>> from autostrat.cost import PROFILES
        >>> shape = ModelShape(48, 2048, 6144, 51200, 12 * 6144**2, True, 18 * 6144, 64)
        >>> op_level_bound(shape, 8, 4, PROFILES["a100-80gb"], "bf16")
        693121958
    """
    if not shape.dense:
        return 0
    forward, backward, head_forward, head_backward = _work_times(shape, global_batch, device_num, hardware, precision, "none")
    work = shape.layers * (forward + backward) + head_forward + head_backward + _update_time(shape, device_num, hardware)
    return math.floor(work * FLOAT_MARGIN)
