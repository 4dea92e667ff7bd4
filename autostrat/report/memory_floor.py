"""A lower bound on the peak bytes per device `autostrat estimate` predicts for a plan of the
``plan:`` vocabulary, activations included, cheap enough for every candidate of a plan-space
search (`report.plan_space` leaves a candidate whose bound exceeds the budget unpriced).

The estimate's peak per device group is the most its memory replay holds at any instant
(`search.stage_buffers`). This bound picks instants of device group ``g``'s order in the
plan's pipeline schedule (`search.schedules.schedule_orders`; one micro-batch at a time
without a pipeline) and counts what the replay certainly holds then (cases):

- Loaded all step: the parameters and optimiser state of the blocks on ``g``'s model stages
  (`RESIDENT_BYTES` per weight element of their 2-D weights, split over ``tp``; the
  embedding and the LM head are not counted).
- The gradient sums of a model stage, from the end of its first backward (its first W where
  the schedule splits the backward) to the start of its last, with two micro-batches or more
  (`ACCUMULATED_BYTES`; the replay adds each micro-batch's gradients into the first one's;
  after the last, a sum may be reduced, or updated, before the others are). Under ZeRO a sum
  may be of a gradient the backward already reduced to its shard (propagation may choose so),
  so it counts split over ``dp``; but with sequence parallelism a dense block's products have
  their weight gradients seeded whole over ``dp`` (partial there,
  `models.megatron_plan.weight_gradient_seeds`), reduced in the update: their sums count whole.
- Just before each backward instruction: every micro-batch whose forward on a stage is done
  and whose backward there has not started holds what its backward reads there, for each of
  the stage's blocks (`LayerActivations`): per token, the tensors a backward of that block
  must read, which the replay keeps from the forward that writes them until the backward
  that reads them last (`cost.live_bytes`'s rule). ``benchmarks/activation_terms.py`` finds
  each of them among a layer's kept tensors. Counted where Megatron's seeds place them
  (`models.megatron_plan`): the residual stream's tensors at a ``tp``-th with sequence
  parallelism, whole without; the tensors of the tensor-parallel regions at a ``tp``-th:
    - the two norms' inputs (their backward reads them) and, with hidden dropout, the two
      1-byte masks of the dropouts before the residual adds;
    - the two norms' outputs, each a weight product's input, which its weight gradient
      reads (with sequence parallelism the backward gathers the part kept again, as
      Megatron's does: `plan.EdgeRedistribution`);
    - Q, K and V (the attention products', or the fused attention's, inputs) and the
      projection's input, at their widths (GQA's K and V at the key-value heads' width);
    - an unfused attention without recompute: the softmax's output (its backward reads it),
      and with attention dropout its mask (1 byte) and output (·V's input);
    - the MLP: GPT's GeLU input and output (the GeLU's backward reads its input, the last
      product's weight gradient its output), LLaMA's gate and up outputs (SwiGLU's backward
      reads both) and their product (the last product's input).
  Selective recompute computes the attention core again: no score tensor is kept. Full
  recompute keeps only each block's input (the residual stream's width).

A net whose blocks are not dense GPT or LLaMA blocks (experts, low-rank attention) gets no
activation term, and neither does a schedule whose model chunks per device differ from the
plan's ``vp`` (zbv).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

from autostrat.models.megatron_plan import stage_layer_counts
from autostrat.search.schedules import SPLIT_BACKWARD, schedule_orders

# Bytes per parameter that live for the whole step, from Megatron-LM's distributed optimizer
# table ("Distributed Optimizer" in its docs: fp16 4 + 16/d, bf16 6 + 12/d, fp32 8 + 8/d) without
# the gradients and fp16's main gradient, which a peak need not hold all at once (a parameter's
# update may run, and free them, before the last gradients exist; measured: four 22B candidates
# at tp 1, pp 4, dp 2 peaked below the table's bytes): (kept on every replica, split over the d
# replicas of the optimiser shard) for the parameter, its fp32 main copy and Adam's two moments.
RESIDENT_BYTES = {"fp16": (2, 12), "bf16": (2, 12), "fp32": (4, 8)}
# A gradient sum's bytes: fp16's own, bf16's fp32 gradient buffer (`search.precision.TensorSizes`).
ACCUMULATED_BYTES = {"fp16": 2, "bf16": 4, "fp32": 4}


@dataclass(frozen=True)
class LayerActivations:
    """Per token of one block, the elements of the tensors its backward reads (the module
    docstring's last case): `stream` the residual stream's width, `heads` Q, K, V and the
    projection's input together, `mlp` the MLP's kept tensors together, `scores` an unfused
    attention's score elements (heads x sequence; 0 fused), and whether the attention
    probabilities and the hidden states are dropped out."""

    stream: int
    heads: int
    mlp: int
    scores: int
    attention_dropout: bool
    hidden_dropout: bool

    @classmethod
    def of(cls, net) -> LayerActivations | None:
        """The blocks' activations of a dense GPT or LLaMA `net` (alike: Megatron's pieces
        place them alike); None for other blocks.

        Example (GPT: Q, K, V and the projection's input 32 each, the GeLU's input and output 128 each):
            >>> from autostrat.models.gpt import GPT
            >>> LayerActivations.of(GPT(layers=2, hidden=32, heads=4, seq=8, batch=2, vocab=64))
            LayerActivations(stream=32, heads=128, mlp=256, scores=32, attention_dropout=False, hidden_dropout=False)
        """
        block = net.blocks[0]
        attention = getattr(block, "attention", None)
        if any(getattr(one, "sparse", False) for one in net.blocks) or attention is None \
                or getattr(attention, "low_rank_query", False) or getattr(attention, "low_rank_kv", False):
            return None
        widths = [_width(getattr(attention, name)) for name in ("query", "key", "value")]
        heads = sum(width for width, _ in widths) + _width(attention.projection)[1]
        if hasattr(block, "ffn1"):  # GPT: the GeLU's input and output
            mlp = 2 * _width(block.ffn1)[0]
        elif hasattr(block, "ffn_up"):  # LLaMA: the gate's and up's outputs, their product
            mlp = 2 * _width(block.ffn_up)[0] + _width(block.ffn_down)[1]
        else:
            return None
        scores = 0 if getattr(attention, "fused", False) else attention.heads * attention.seq
        return cls(net.hidden, heads, mlp, scores, getattr(attention, "probs_dropout", None) is not None,
                   getattr(block, "dropout1", None) is not None)

    def kept_bytes(self, tokens: int, tp: int, sequence_parallel: bool, recompute: str, precision: str) -> int:
        """Bytes at least that one block keeps on a device for its backward, for `tokens` of a
        micro-batch on the device, split over `tp` devices (`sequence_parallel`: the residual
        stream too), under `recompute` (none, selective, full).

        Example (tp 2, no sequence parallelism, bf16: the stream's 4 tensors whole, the rest halved):
            >>> layer = LayerActivations(32, 128, 256, 32, False, False)
            >>> [layer.kept_bytes(16, 2, False, recompute, "bf16") for recompute in ("none", "selective", "full")]
            [10752, 10240, 1024]
        """
        size, stream = (4 if precision == "fp32" else 2), tokens * self.stream // (tp if sequence_parallel else 1)
        if recompute == "full":
            return stream * size
        kept = (4 * stream + tokens * (self.heads + self.mlp) // tp) * size + 2 * stream * self.hidden_dropout
        if recompute == "none":
            scores = tokens * self.scores // tp
            kept += scores * size + scores * (size + 1) * self.attention_dropout
        return kept


def _width(dense) -> tuple[int, int]:
    """A Dense cell's (output, input) widths (its weight is ``[out, in]``)."""
    return tuple(dense.weight.shape)


def block_weights(net) -> list[int]:
    """The 2-D weight elements of each of `net`'s blocks, in order: what `peak_floor` counts.

    Example (a GPT block: Q, K, V and the projection 32 x 32 each, the MLP 2 x 32 x 128):
        >>> from autostrat.models.gpt import GPT
        >>> block_weights(GPT(layers=2, hidden=32, heads=4, seq=8, batch=2, vocab=64))
        [12288, 12288]
    """
    return [sum(math.prod(parameter.shape) for _, parameter in block.parameters_and_names() if len(parameter.shape) == 2)
            for block in net.blocks]


def peak_floor(given, block_weights: list[int], precision: str, activations: LayerActivations | None, seq: int,
               schedule: str = "1f1b") -> int:
    """A lower bound on the most bytes a device of `given` (a `report.estimate.GivenPlan`)
    holds (the module docstring): over its device groups and their instants, for blocks of
    `block_weights` 2-D weight elements each, in order, sequences of `seq` tokens, `schedule`
    the pipeline's where ``vp`` is 1 (interleaved 1F1B where it is above 1).

    Example (2 GPT blocks on tp 2, pp 2, 4 micro-batches of 1: device group 0 holds 2 in flight):
        >>> from autostrat.report.estimate import GivenPlan
        >>> layer = LayerActivations(32, 128, 256, 32, False, False)
        >>> peak_floor(GivenPlan(2, 2, 1, "none", 0, 1, 4), [12288, 12288], "bf16", layer, 16)
        132096
    """
    counts = stage_layer_counts(len(block_weights), given.pp * given.vp)
    starts = [sum(counts[:stage]) for stage in range(len(counts))]
    weights = [sum(block_weights[start:start + count]) // given.tp for start, count in zip(starts, counts)]
    states = _instants("interleaved_1f1b" if given.vp > 1 else schedule, given.pp, given.micro_batches, given.vp)
    if states is None:  # the schedule's chunks are not the plan's: loads and sums alone
        states, activations = _instants("1f1b", given.pp, given.micro_batches, 1), None
    whole, sharded = RESIDENT_BYTES[precision]
    shards = given.dp if given.zero else 1
    summed = ACCUMULATED_BYTES[precision] * (given.micro_batches > 1)
    # A dense block's weight gradients seeded (sequence parallelism): summed whole, under ZeRO too.
    summed_shards = 1 if activations is not None and given.sequence_parallel else shards
    kept = 0 if activations is None else activations.kept_bytes(
        given.micro_batch * seq, given.tp, given.sequence_parallel, given.recompute, precision)
    most = 0
    for device, device_states in enumerate(states):
        stages = [chunk * given.pp + device for chunk in range(given.vp)]
        loaded = sum(weights[stage] * whole + weights[stage] * sharded // shards for stage in stages)
        for in_flight, summing in device_states:
            held = [flying * counts[stage] * kept + done * summed * weights[stage] // summed_shards
                    for stage, flying, done in zip(stages, in_flight, summing)]
            most = max(most, loaded + sum(held))
    return most


@functools.lru_cache(maxsize=1024)  # a search asks for the same few (schedule, pp, micro-batches, vp)
def _instants(name: str, devices: int, micro_batches: int, chunks: int) -> tuple | None:
    """Per device of the schedule, the distinct states just before each of its backward
    instructions and at its end: (micro-batches in flight per chunk, whether the chunk's
    gradient sums exist: some of its micro-batches' backward has added into them, not all);
    one device running micro-batch after micro-batch without a pipeline; None where the
    schedule's chunks per device are not `chunks`."""
    if devices == 1:
        return ((((1,), (False,)),) + ((((1,), (True,)),) if micro_batches > 1 else ()),)
    schedule = schedule_orders(name, devices, micro_batches, chunks if name == "interleaved_1f1b" else None)
    if schedule.chunks != chunks:
        return None
    summing_kind = "W" if name in SPLIT_BACKWARD else "B"
    found = []
    for order in schedule.orders:
        in_flight, summed, states = [0] * chunks, [0] * chunks, set()
        for instruction in order:
            if instruction.kind == "B":
                states.add((tuple(in_flight), tuple(0 < count < micro_batches for count in summed)))
                in_flight[instruction.chunk] -= 1
            elif instruction.kind == "F":
                in_flight[instruction.chunk] += 1
            if instruction.kind == summing_kind:
                summed[instruction.chunk] += 1
        states.add((tuple(in_flight), (False,) * chunks))
        found.append(tuple(sorted(states)))
    return tuple(found)
