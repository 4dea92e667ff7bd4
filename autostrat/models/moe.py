"""A mixture-of-experts FFN (Mixtral's sparse block, GShard's fixed-capacity routing) for the
LLaMA family.

The ``[batch * seq, hidden]`` activations are regrouped ``[groups, seq, hidden]`` (a group is
one sequence); a router ``einsum("gsh,eh->gse")`` gives the logits, `rules.moe`'s ops the
dispatch mask and combine weights ``[g, s, e, c]``; the dispatch ``einsum("gsec,gsh->egch")``
fills each expert's buffer, the experts are SwiGLU FFNs batched over experts
(``egch,ehf->egcf`` twice, SiLU, Mul, ``egcf,efh->egch``), and the combine
``einsum("gsec,egch->gsh")`` weights their outputs back into token order. Expert parallelism
(EP) is a split of ``e`` in the expert ops, expert tensor parallelism (ETP) a split of ``f``;
both are ordinary strategies of the Einsum ops, the dispatch's AllToAll the planner's edge from
a split of ``g`` to a split of ``e``.

The capacity of an expert's buffer per group is ``ceil(capacity_factor * top_k * seq / experts)``,
at most seq; no `capacity_factor` means seq, no token dropped (Mixtral's dropless routing).

DeepSeek's MoE (DeepSeek-AI 2024, "DeepSeek-V3 Technical Report", arXiv 2412.19437, section
2.1.2) adds shared experts, a dense SwiGLU FFN every token passes through (``shared_ffn`` wide:
``n_shared_experts`` experts of ``moe_intermediate_size`` side by side are one FFN of their summed
width), sigmoid gates normalised over the chosen experts, and the routed output scaled by
``routed_scaling_factor`` before the shared experts' output is added.
"""

from __future__ import annotations

import math

import numpy as np

from autostrat import ops
from autostrat.errors import ConfigError
from autostrat.frontend.cell import Cell
from autostrat.frontend.layers import Dense
from autostrat.frontend.tensor import Parameter, Tensor, initializer


def expert_capacity(seq: int, experts: int, top_k: int, capacity_factor: float | None) -> int:
    """Buffer slots per expert and group: GShard's ``ceil(capacity_factor * top_k * seq / experts)``,
    at most `seq` (a token meets an expert once); `capacity_factor` None is `seq` (dropless).

    Example:
        >>> expert_capacity(16, 8, 2, 1.0), expert_capacity(16, 8, 2, None), expert_capacity(16, 8, 2, 9.0)
        (4, 16, 16)
    """
    if capacity_factor is None:
        return seq
    if isinstance(capacity_factor, bool) or not isinstance(capacity_factor, (int, float)) or not capacity_factor > 0:
        raise ConfigError(f"MoE: capacity_factor must be a positive number or null (dropless), got {capacity_factor!r}")
    return min(seq, math.ceil(capacity_factor * top_k * seq / experts))


class MoeFeedForward(Cell):
    """The sparse SwiGLU FFN on ``[batch * seq, hidden]`` tokens: `experts` experts of width
    `ffn`, each token routed to `top_k` of them (`gate` softmax or sigmoid, renormalised over the
    chosen when `norm_topk_prob`, as Mixtral and DeepSeek), buffers of `capacity` slots per group;
    the routed output times `routed_scaling` (DeepSeek's factor; 1 leaves it out), plus with
    `shared_ffn` a dense SwiGLU FFN of that width on every token (DeepSeek's shared experts).

    Example:
        >>> moe = MoeFeedForward(seq=8, hidden=16, ffn=24, experts=4, top_k=2, capacity=4, shared_ffn=48)
        >>> moe.w_gate.shape, moe.w_down.shape, moe.dispatch.attrs, moe.shared_down.weight.shape
        ((4, 16, 24), (4, 24, 16), {'equation': 'gsec,gsh->egch'}, (16, 48))
    """

    def __init__(self, seq: int, hidden: int, ffn: int, experts: int, top_k: int, capacity: int, norm_topk_prob: bool = True,
                 gate: str = "softmax", routed_scaling: float = 1.0, shared_ffn: int | None = None):
        super().__init__()
        self.seq, self.hidden = seq, hidden
        self.router = Parameter(initializer("normal", (experts, hidden)))
        self.w_gate = Parameter(initializer("normal", (experts, hidden, ffn)))
        self.w_up = Parameter(initializer("normal", (experts, hidden, ffn)))
        self.w_down = Parameter(initializer("normal", (experts, ffn, hidden)))
        self.to_groups, self.from_groups = ops.Reshape(), ops.Reshape()
        self.route = ops.Einsum("gsh,eh->gse")
        routing = {"top_k": top_k, "capacity": capacity, "gate": gate, "norm_topk_prob": norm_topk_prob}
        self.dispatch_mask, self.combine_weights = ops.MoeDispatchMask(**routing), ops.MoeCombineWeights(**routing)
        self.dispatch = ops.Einsum("gsec,gsh->egch")
        self.expert_gate, self.expert_up = ops.Einsum("egch,ehf->egcf"), ops.Einsum("egch,ehf->egcf")
        self.gate, self.glu = ops.SiLU(), ops.Mul()
        self.expert_down = ops.Einsum("egcf,efh->egch")
        self.combine = ops.Einsum("gsec,egch->gsh")
        self.routed_scaling = None if routed_scaling == 1 else Tensor(np.float32(routed_scaling))
        if self.routed_scaling is not None:
            self.scale_routed = ops.Mul()
        self.shared = shared_ffn is not None
        if self.shared:  # Dense layers, as the dense FFN: Megatron's tensor parallelism splits them alike
            self.shared_gate, self.shared_up = Dense(hidden, shared_ffn, has_bias=False), Dense(hidden, shared_ffn, has_bias=False)
            self.shared_silu, self.shared_glu = ops.SiLU(), ops.Mul()
            self.shared_down = Dense(shared_ffn, hidden, has_bias=False)
            self.add_shared = ops.Add()

    def construct(self, x):
        tokens = self.to_groups(x, (x.shape[0] // self.seq, self.seq, self.hidden))
        logits = self.route((tokens, self.router))
        mask, weights = self.dispatch_mask(logits), self.combine_weights(logits)
        buffers = self.dispatch((mask, tokens))
        hidden = self.glu(self.gate(self.expert_gate((buffers, self.w_gate))), self.expert_up((buffers, self.w_up)))
        out = self.combine((weights, self.expert_down((hidden, self.w_down))))
        out = self.from_groups(out, (x.shape[0], self.hidden))
        if self.routed_scaling is not None:
            out = self.scale_routed(out, self.routed_scaling)
        if self.shared:
            out = self.add_shared(out, self.shared_down(self.shared_glu(self.shared_silu(self.shared_gate(x)), self.shared_up(x))))
        return out


def moe_seeds(layers: int, expert_parallel: int, expert_tensor_parallel: int = 1) -> dict[str, tuple]:
    """Seeds splitting every layer's experts over `expert_parallel` devices and each expert's
    FFN width over `expert_tensor_parallel` (ETP); the search places the rest.

    Example:
        >>> moe_seeds(1, 4, 2)["blocks.0.moe.expert_gate"]
        (((4, 1, 1, 1), (4, 1, 2)), None)
    """
    ep, etp = expert_parallel, expert_tensor_parallel
    per_layer = {"moe.expert_gate": ((ep, 1, 1, 1), (ep, 1, etp)), "moe.expert_up": ((ep, 1, 1, 1), (ep, 1, etp)),
                 "moe.expert_down": ((ep, 1, 1, etp), (ep, etp, 1))}
    return {f"blocks.{i}.{op}": (strategy, None) for i in range(layers) for op, strategy in per_layer.items()}
