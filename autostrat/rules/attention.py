"""Fused attention: MindSpore's ``FlashAttentionScore`` in the BNSD layout, and its backward.

The subset kept of MindSpore's signature: query [b, n, s, d], key and value [b, n, t, d] (as
many key heads as query heads), ``scale_value``, ``sparse_mode`` 0 (no mask) or 2
(``leftUpCausal``: query row i sees keys 0..i, the mask built from the shapes rather than
passed as MindSpore's compressed ``attn_mask``), and the attention output alone (MindSpore's op
also returns softmax max, sum and out, which its grad takes; here the grads recompute them).
Refused: another ``input_layout``, ``keep_prob`` < 1 (dropout), ``pre_tokens`` and
``next_tokens`` bands, ``inner_precise`` modes, ``head_num`` other than the query's heads, and
grouped key heads.

Batch, heads and the query sequence pass through (a rank holding query rows [lo, hi) learns lo
from its slice context, which the causal mask needs); the key sequence and head_dim stay whole.
Context parallelism (the sequence split over a ``cp`` axis outside attention) takes three forms,
all layouts the planner prices (tests/test_context_parallel.py): query rows split over ``cp``, K
and V all-gathered on it by the edge into the op (Llama 3's form); heads split over ``cp``, an
AllToAll from the sequence split before the op and back after (Ulysses); or ring attention, the
rule's ring pair ``t over s``: K and V stay split like the query rows (strategy tuples with
their sequence cut as the query's, MindSpore's ring-attention strategy), and the op passes
their blocks around the ``cp`` devices, merging them with the running softmax
(`runtime.kernels.ring_attention`, priced by `cost.ring`). Not expressible: Llama 3's causal
load balance (2·cp chunks per sequence, rank i holding chunks i and 2·cp-1-i), since a layout
gives each rank one contiguous block per dim. So the rules' causal pair prices causal attention
as the rank holding the last query rows computes it (`cost.op_cost`): half the score matrix on
one device, and with the rows over cp devices that rank's (cp - 1/2) / cp of a full block row,
which the other ranks wait for.
"""

from __future__ import annotations

from autostrat.errors import RuleError
from autostrat.rules.registry import Example, register
from autostrat.rules.rule import RuleSpec

SPARSE_MODES = {0: "no mask", 2: "leftUpCausal"}
_DEFAULT_TOKENS = 2147483647

_FORWARD = [Example(((2, 2, 6, 4), (2, 2, 6, 4), (2, 2, 6, 4)), {"head_num": 2, "scale_value": 0.5}),
            Example(((2, 3, 8, 4), (2, 3, 8, 4), (2, 3, 8, 4)), {"head_num": 3, "scale_value": 0.5, "sparse_mode": 2}),
            Example(((1, 2, 4, 6), (1, 2, 6, 6), (1, 2, 6, 6)), {"head_num": 2, "sparse_mode": 2})]
_GRAD = [Example(e.shapes + (e.shapes[0],), e.attrs) for e in _FORWARD]


def check_attention(shapes, op_type: str, head_num, keep_prob, pre_tokens, next_tokens, inner_precise, input_layout,
                   sparse_mode) -> None:
    """Check the shapes and attributes against the supported subset (see the module docstring).

    Example:
        >>> check_attention([(2, 2, 6, 4)] * 3, "FlashAttentionScore", 2, 1.0, 2147483647, 2147483647, 0, "BNSD", 2)
    """
    query, key, value = shapes[:3]
    if input_layout != "BNSD":
        raise RuleError(f"{op_type}: only input_layout 'BNSD' is supported, got {input_layout!r}")
    if sparse_mode not in SPARSE_MODES:
        raise RuleError(f"{op_type}: sparse_mode must be 0 (no mask) or 2 (leftUpCausal), got {sparse_mode!r}")
    if keep_prob != 1.0 or (pre_tokens, next_tokens) != (_DEFAULT_TOKENS,) * 2 or inner_precise != 0:
        raise RuleError(f"{op_type}: keep_prob 1.0, no pre_tokens/next_tokens band and inner_precise 0 are supported, "
                        f"got keep_prob {keep_prob!r}, pre_tokens {pre_tokens!r}, next_tokens {next_tokens!r}, "
                        f"inner_precise {inner_precise!r}")
    if len(query) != 4 or key != value or len(key) != 4 or key[:2] != query[:2] or key[3] != query[3]:
        raise RuleError(f"{op_type}: needs query [b, n, s, d] and key, value [b, n, t, d], got {[list(s) for s in shapes[:3]]}")
    if head_num != query[1]:
        raise RuleError(f"{op_type}: head_num must be the query's heads {query[1]}, got {head_num!r}")


@register("FlashAttentionScore", examples=_FORWARD)
def flash_attention_score(shapes, head_num=None, keep_prob: float = 1.0, scale_value: float = 1.0,
                          pre_tokens: int = _DEFAULT_TOKENS, next_tokens: int = _DEFAULT_TOKENS, inner_precise: int = 0,
                          input_layout: str = "BNSD", sparse_mode: int = 0) -> RuleSpec:
    """``softmax(query @ key^T * scale_value + mask) @ value`` per batch and head."""
    check_attention(shapes, "FlashAttentionScore", head_num, keep_prob, pre_tokens, next_tokens, inner_precise,
                   input_layout, sparse_mode)
    return RuleSpec("b n s d, b n t d, b n t d -> b n s d", need_replication="t d", ring="t s",
                    causal=_causal(sparse_mode))


@register("FlashAttentionScoreQueryGrad", examples=_GRAD)
def flash_attention_score_query_grad(shapes, head_num=None, keep_prob: float = 1.0, scale_value: float = 1.0,
                                     pre_tokens: int = _DEFAULT_TOKENS, next_tokens: int = _DEFAULT_TOKENS,
                                     inner_precise: int = 0, input_layout: str = "BNSD", sparse_mode: int = 0) -> RuleSpec:
    """Inputs query, key, value, dy; output dquery. Each query row's gradient needs only its own
    row of the attention, so the query sequence passes through as forward."""
    check_attention(shapes, "FlashAttentionScoreQueryGrad", head_num, keep_prob, pre_tokens, next_tokens,
                   inner_precise, input_layout, sparse_mode)
    _check_dy(shapes, "FlashAttentionScoreQueryGrad")
    return RuleSpec("b n s d, b n t d, b n t d, b n s d -> b n s d", need_replication="t d", ring="t s",
                    causal=_causal(sparse_mode))


@register("FlashAttentionScoreKeyValueGrad", examples=_GRAD)
def flash_attention_score_key_value_grad(shapes, head_num=None, keep_prob: float = 1.0, scale_value: float = 1.0,
                                         pre_tokens: int = _DEFAULT_TOKENS, next_tokens: int = _DEFAULT_TOKENS,
                                         inner_precise: int = 0, input_layout: str = "BNSD",
                                         sparse_mode: int = 0) -> RuleSpec:
    """Inputs query, key, value, dy; outputs dkey and dvalue, sums over the query rows: a split
    query sequence leaves them partial (a reduction), apart from dquery, whose op keeps it split
    (MindSpore's one FlashAttentionScoreGrad is two ops here for that reason)."""
    check_attention(shapes, "FlashAttentionScoreKeyValueGrad", head_num, keep_prob, pre_tokens, next_tokens,
                   inner_precise, input_layout, sparse_mode)
    _check_dy(shapes, "FlashAttentionScoreKeyValueGrad")
    return RuleSpec("b n s d, b n t d, b n t d, b n s d -> b n t d, b n t d", need_replication="t d", ring="t s",
                    causal=_causal(sparse_mode))


def _causal(sparse_mode: int) -> str:
    # leftUpCausal: query row i sees keys 0..i, the rest of the score matrix is never computed.
    return "s t" if sparse_mode == 2 else ""


def _check_dy(shapes, op_type: str) -> None:
    if len(shapes) != 4 or shapes[3] != shapes[0]:
        raise RuleError(f"{op_type}: needs dy of the query's shape {list(shapes[0])}, got {[list(s) for s in shapes[3:]]}")
