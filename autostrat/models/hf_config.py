"""Models from a HuggingFace ``config.json``: the LLaMA family (model_type llama, mistral, qwen2,
and the mixtures of experts mixtral, deepseek_v3 and gpt_oss) becomes `LLaMA`, GPT-2 (gpt2) becomes `GPT`.

The file is data (`reading.read_json`, never code). Each model_type lists the fields it reads,
the fields whose value changes what the model computes (each must hold a value autostrat
computes: ``hidden_act: silu``, ``rope_scaling: null``...), and the fields that
only describe the checkpoint (token ids, torch_dtype...), which are ignored. An absent field
takes HuggingFace's default for its model_type, which is then checked as if written. Anything
else, an unknown model_type or field, or a value autostrat cannot honour is a `ConfigError`
naming the file, the field and the value.

The training sequence length and batch are no part of a config.json: ``seq`` defaults to
``max_position_embeddings`` (gpt2: ``n_positions``) and may not exceed it; ``batch`` to 1.
GPT's learned positions are a ``[seq, hidden]`` table (GPT-2's holds ``n_positions`` rows).
gpt2's ``attn_pdrop``, ``resid_pdrop`` and ``embd_pdrop`` (HuggingFace's default 0.1 each) build
Dropout ops where GPT-2 and Megatron-LM drop (`models.gpt.GPT`), the LLaMA family's
``attention_dropout`` one on the attention probabilities (not with ``fused_attention``); 0 builds none.
Nor is an expert's capacity (Mixtral routes without dropping): ``capacity_factor`` defaults to
null, dropless (`models.moe.expert_capacity`), and is refused for a model without experts.

deepseek_v3 (DeepSeek-V3's released config.json and HuggingFace's ``DeepseekV3Config``):
``n_routed_experts`` experts of ``moe_intermediate_size`` chosen ``num_experts_per_tok`` per token
by sigmoid gates, ``n_shared_experts`` shared experts, the first ``first_k_dense_replace`` blocks
dense FFNs of ``intermediate_size``, ``routed_scaling_factor``; its attention by MLA's shapes
(`models.llama`'s docstring: ``q_lora_rank``, ``kv_lora_rank``, one head size
``qk_nope_head_dim + qk_rope_head_dim``, ``v_head_dim`` at most that and modelled at it). Routing
is over all experts: ``n_group`` and ``topk_group`` must be 1, ``topk_method`` greedy (noaux_tc's
correction bias is not computed), no multi-token prediction (``num_nextn_predict_layers`` 0).
gpt_oss (HuggingFace's ``GptOssConfig``): Mixtral's routing (a softmax over the top-k logits is
the softmax renormalised over the chosen) with its own ``head_dim`` and ``attention_bias`` on Q,
K, V and the output; full causal attention (every ``layer_types`` entry full, or a
``sliding_window`` of at least seq) and ``swiglu_limit`` null. What no field says is not computed
either: GPT-OSS's attention sinks, its experts' and router's biases and its SwiGLU's
``(up + 1) · gate · sigmoid(1.702 · gate)``; the shapes and the costs are its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from autostrat.errors import ConfigError
from autostrat.models.gpt import GPT, is_probability
from autostrat.models.llama import LLaMA
from autostrat.reading import read_json

# Fields that describe the checkpoint or the tokenizer, not the computation.
DESCRIPTIVE = frozenset({"_name_or_path", "architectures", "bos_token_id", "eos_token_id", "initializer_range", "pad_token_id",
                         "torch_dtype", "transformers_version", "use_cache"})


@dataclass(frozen=True)
class Family:
    """One model_type: its read fields with HuggingFace's defaults (None: required), the fields
    that must hold one of the listed values (with their defaults), and its extra descriptive fields."""

    read: dict
    fixed: dict  # field -> (default, accepted values, what autostrat computes)
    descriptive: frozenset = frozenset()


_LLAMA_READ = {"hidden_size": None, "intermediate_size": None, "num_hidden_layers": None, "num_attention_heads": None,
               "num_key_value_heads": None, "vocab_size": None, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
               "tie_word_embeddings": False, "max_position_embeddings": 2048, "attention_dropout": 0.0}
_LLAMA_FIXED = {"hidden_act": ("silu", ("silu",), "the SwiGLU gate SiLU"), "rope_scaling": (None, (None,), "unscaled rotary frequencies"),
                "mlp_bias": (False, (False,), "an FFN without biases")}

FAMILIES = {
    "gpt2": Family(
        read={"n_embd": 768, "n_layer": 12, "n_head": 12, "n_positions": 1024, "vocab_size": 50257, "layer_norm_epsilon": 1e-5,
              "tie_word_embeddings": True, "n_inner": None, "attn_pdrop": 0.1, "resid_pdrop": 0.1, "embd_pdrop": 0.1},
        fixed={"activation_function": ("gelu_new", ("gelu",), "the exact (erf) GeLU, 'gelu'"),
               "scale_attn_weights": (True, (True,), "scores scaled by 1/sqrt(head size)"),
               "scale_attn_by_inverse_layer_idx": (False, (False,), "no per-layer score scaling"),
               "reorder_and_upcast_attn": (False, (False,), "attention in the model's dtype")},
        descriptive=frozenset({"n_ctx", "summary_activation", "summary_first_dropout", "summary_proj_to_labels", "summary_type",
                               "summary_use_proj", "task_specific_params"})),
    "llama": Family(read=_LLAMA_READ | {"attention_bias": False, "head_dim": None}, fixed=_LLAMA_FIXED,
                    descriptive=frozenset({"pretraining_tp"})),
    "mistral": Family(read=_LLAMA_READ | {"max_position_embeddings": 4096 * 32, "head_dim": None, "sliding_window": 4096},
                      fixed=_LLAMA_FIXED),
    "mixtral": Family(read=_LLAMA_READ | {"max_position_embeddings": 4096 * 32, "head_dim": None, "sliding_window": None,
                                          "num_local_experts": 8, "num_experts_per_tok": 2},
                      fixed=_LLAMA_FIXED | {"output_router_logits": (False, (False,), "no auxiliary load-balancing loss"),
                                            "router_jitter_noise": (0.0, (0, 0.0), "no router jitter")},
                      descriptive=frozenset({"router_aux_loss_coef"})),  # read by HuggingFace only with output_router_logits
    "deepseek_v3": Family(
        read={"hidden_size": None, "intermediate_size": None, "moe_intermediate_size": None, "num_hidden_layers": None,
              "num_attention_heads": None, "num_key_value_heads": None, "n_shared_experts": 1, "n_routed_experts": None,
              "num_experts_per_tok": None, "first_k_dense_replace": 3, "routed_scaling_factor": 2.5, "norm_topk_prob": True,
              "kv_lora_rank": 512, "q_lora_rank": 1536, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
              "vocab_size": None, "max_position_embeddings": 4096, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
              "tie_word_embeddings": False, "attention_dropout": 0.0},
        fixed=_LLAMA_FIXED | {"attention_bias": (False, (False,), "projections without biases"),
                              "n_group": (8, (1,), "top-k over all experts (no group-limited routing)"),
                              "topk_group": (4, (1,), "top-k over all experts (no group-limited routing)"),
                              "topk_method": ("greedy", ("greedy",), "the top-k of the gates (no correction bias)"),
                              "scoring_func": ("sigmoid", ("sigmoid",), "sigmoid gates"),
                              "moe_layer_freq": (1, (1,), "experts in every block after the first dense ones"),
                              "num_nextn_predict_layers": (0, (0,), "no multi-token prediction module")},
        # aux_loss_alpha and seq_aux: read by no released training code; ep_size: inference's
        # expert split; rope_interleave: the rotary pairing, modelled (the module docstring).
        descriptive=frozenset({"auto_map", "aux_loss_alpha", "ep_size", "pretraining_tp", "quantization_config", "rope_interleave",
                               "seq_aux"})),
    "gpt_oss": Family(
        read=_LLAMA_READ | {"max_position_embeddings": 131072, "head_dim": 64, "num_local_experts": 128, "num_experts_per_tok": 4,
                            "experts_per_token": None, "attention_bias": True, "sliding_window": 128, "layer_types": None},
        fixed=_LLAMA_FIXED | {"swiglu_limit": (7.0, (None,), "an unclamped SwiGLU"),
                              "output_router_logits": (False, (False,), "no auxiliary load-balancing loss")},
        descriptive=frozenset({"initial_context_length", "quantization_config", "router_aux_loss_coef"})),
    "qwen2": Family(read=_LLAMA_READ | {"max_position_embeddings": 32768, "sliding_window": 4096},
                    fixed=_LLAMA_FIXED | {"use_sliding_window": (False, (False,), "full causal attention")},
                    descriptive=frozenset({"max_window_layers"})),
}


MIXTURES = ("deepseek_v3", "gpt_oss", "mixtral")  # the model_types with experts


def from_hf_config(path, seq: int | None = None, batch: int = 1, capacity_factor: float | None = None,
                   fused_attention: bool = False):
    """The model a HuggingFace ``config.json`` describes, for `batch` sequences of `seq` tokens
    (and a mixture of experts' `capacity_factor`; `fused_attention`: the LLaMA family's attention
    as one ``FlashAttentionScore``, as `LLaMA` takes it).

    Example:
        >>> net = from_hf_config("configs/models/llama-tiny.json", seq=8, batch=2)
        >>> type(net).__name__, net.blocks[0].attention.kv_heads, net.blocks[0].ln1.rms_norm.attrs
        ('LLaMA', 4, {'epsilon': 1e-05})
        >>> from_hf_config("configs/models/llama-2-7b.json").seq
        4096
    """
    path = Path(path)
    data = read_json(path, "HuggingFace config")
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a JSON object of config fields, got {type(data).__name__}")
    model_type = data.get("model_type")
    if model_type not in FAMILIES:
        raise ConfigError(f"{path}: model_type: expected one of {', '.join(sorted(FAMILIES))}, got {model_type!r}")
    family = FAMILIES[model_type]
    known = {"model_type"} | set(family.read) | set(family.fixed) | DESCRIPTIVE | family.descriptive
    unknown = sorted(set(data) - known)
    if unknown:
        raise ConfigError(f"{path}: {unknown[0]}: unknown field for model_type {model_type} (value {data[unknown[0]]!r}); "
                          f"autostrat reads {', '.join(sorted(family.read))}")
    for field, (default, accepted, meaning) in family.fixed.items():
        value = data.get(field, default)
        if not any(value is a or (type(value) is type(a) and value == a) for a in accepted):
            absent = "" if field in data else " (HuggingFace's default: the field is absent)"
            raise ConfigError(f"{path}: {field}: autostrat computes {meaning}; cannot honour {value!r}{absent}")
    fields = {field: data.get(field, default) for field, default in family.read.items()}
    if model_type not in MIXTURES and capacity_factor is not None:
        raise ConfigError(f"{path}: capacity_factor applies to a mixture of experts (model_type {', '.join(MIXTURES)}), "
                          f"got {capacity_factor!r} for model_type {model_type}")
    if not isinstance(fused_attention, bool) or (fused_attention and model_type == "gpt2"):
        raise ConfigError(f"{path}: fused_attention: expected true or false, and false for model_type gpt2 (autostrat's GPT "
                          f"computes its attention unfused), got {fused_attention!r} for model_type {model_type}")
    if model_type == "gpt2":
        return _gpt(_Fields(path, fields), model_type, seq, batch)
    if model_type == "deepseek_v3":
        return _deepseek(_Fields(path, fields), seq, batch, capacity_factor, fused_attention)
    return _llama(_Fields(path, fields), model_type, seq, batch, capacity_factor, fused_attention)


class _Fields:
    """Typed reads of a config's fields, each error naming the file and the field."""

    def __init__(self, path: Path, values: dict):
        self.path, self.values = path, values

    def fail(self, field: str, message: str) -> ConfigError:
        return ConfigError(f"{self.path}: {field}: {message}, got {self.values[field]!r}")

    def integer(self, field: str, absent: int | None = None) -> int:
        """The field's positive integer; `absent` stands in for a missing or null field, which is
        otherwise required."""
        value = self.values[field]
        if value is None and absent is not None:
            return absent
        if value is None:
            raise ConfigError(f"{self.path}: {field}: a required field is missing")
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise self.fail(field, "expected a positive integer")
        return value

    def number(self, field: str) -> float:
        value = self.values[field]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise self.fail(field, "expected a positive number")
        return float(value)

    def probability(self, field: str) -> float:
        value = self.values[field]
        if not is_probability(value):
            raise self.fail(field, "expected a dropout probability in [0, 1)")
        return float(value)

    def flag(self, field: str) -> bool:
        if not isinstance(self.values[field], bool):
            raise self.fail(field, "expected true or false")
        return self.values[field]

    def seq(self, limit_field: str, seq) -> int:
        limit = self.integer(limit_field)
        if seq is None:
            return limit
        if isinstance(seq, bool) or not isinstance(seq, int) or not 1 <= seq <= limit:
            raise ConfigError(f"{self.path}: seq must be a positive integer up to {limit_field} {limit}, got {seq!r}")
        return seq


def _llama(fields: _Fields, model_type: str, seq, batch, capacity_factor=None, fused_attention: bool = False):
    hidden, heads = fields.integer("hidden_size"), fields.integer("num_attention_heads")
    kv_heads = fields.integer("num_key_value_heads", absent=heads)  # HuggingFace: multi-head attention
    if hidden % heads:
        raise fields.fail("num_attention_heads", f"expected a divisor of hidden_size {hidden}")
    if heads % kv_heads:
        raise fields.fail("num_key_value_heads", f"expected a divisor of num_attention_heads {heads}")
    attention = {}
    if model_type == "gpt_oss":  # its own head size (64 heads of 64 on a hidden of 2880)
        attention = {"head_size": fields.integer("head_dim")}
    elif fields.values.get("head_dim") not in (None, hidden // heads):
        raise fields.fail("head_dim", f"autostrat's head size is hidden_size / num_attention_heads = {hidden // heads}")
    seq = fields.seq("max_position_embeddings", seq)
    _check_full_attention(fields, model_type, seq)
    bias = fields.flag("attention_bias") if model_type in ("gpt_oss", "llama") else False
    return LLaMA(layers=fields.integer("num_hidden_layers"), hidden=hidden, ffn=fields.integer("intermediate_size"), heads=heads,
                 kv_heads=kv_heads, seq=seq, batch=batch, vocab=fields.integer("vocab_size"), epsilon=fields.number("rms_norm_eps"),
                 rope_theta=fields.number("rope_theta"), tie_embeddings=fields.flag("tie_word_embeddings"),
                 qkv_bias=bias or model_type == "qwen2", output_bias=bias, attention=attention, fused_attention=fused_attention,
                 attention_dropout=_attention_dropout(fields, fused_attention), **_experts(fields, model_type, capacity_factor))


def _attention_dropout(fields: _Fields, fused_attention: bool) -> float:
    """The LLaMA family's attention_dropout: a probability, 0 with the fused attention (which keeps every probability)."""
    dropout = fields.probability("attention_dropout")
    if dropout and fused_attention:
        raise fields.fail("attention_dropout", "the fused attention (fused_attention: true) drops nothing: expected 0")
    return dropout


def _check_full_attention(fields: _Fields, model_type: str, seq: int) -> None:
    """A sliding window is full causal attention when it spans the sequence: null or at least `seq`."""
    window = fields.values.get("sliding_window")
    if model_type in ("gpt_oss", "mistral", "mixtral") and window is not None and (
            isinstance(window, bool) or not isinstance(window, int) or window < seq):
        raise fields.fail("sliding_window", f"autostrat computes full causal attention: expected null or at least seq {seq}")
    layer_types = fields.values.get("layer_types")
    if model_type == "gpt_oss" and layer_types is not None:
        layers = fields.integer("num_hidden_layers")
        if not isinstance(layer_types, list) or len(layer_types) != layers or not set(layer_types) <= {"full_attention", "sliding_attention"}:
            raise fields.fail("layer_types", f"expected null or a list of {layers} entries full_attention or sliding_attention")


def _deepseek(fields: _Fields, seq, batch, capacity_factor, fused_attention: bool):
    """DeepSeek-V3's `LLaMA`: MLA's shapes, shared and routed experts after the first dense blocks."""
    heads, kv_heads = fields.integer("num_attention_heads"), fields.integer("num_key_value_heads")
    if heads != kv_heads:  # MLA makes every head's key and value from the latent
        raise fields.fail("num_key_value_heads", f"expected num_attention_heads {heads} (MLA has no grouped keys)")
    head_size = fields.integer("qk_nope_head_dim") + fields.integer("qk_rope_head_dim")
    if fields.integer("v_head_dim") > head_size:
        raise fields.fail("v_head_dim", f"expected at most qk_nope_head_dim + qk_rope_head_dim = {head_size} (values are modelled at that size)")
    dense = fields.values["first_k_dense_replace"]
    if isinstance(dense, bool) or not isinstance(dense, int) or dense < 0:
        raise fields.fail("first_k_dense_replace", "expected a count of blocks (0 or more)")
    experts, top_k, width = fields.integer("n_routed_experts"), fields.integer("num_experts_per_tok"), fields.integer("moe_intermediate_size")
    if top_k > experts:
        raise fields.fail("num_experts_per_tok", f"expected at most n_routed_experts {experts}")
    shared = fields.values["n_shared_experts"]
    if isinstance(shared, bool) or not isinstance(shared, int) or shared < 0:
        raise fields.fail("n_shared_experts", "expected a count of experts (0 or more)")
    moe = {"ffn": width, "shared_ffn": shared * width or None, "dense_layers": dense, "gate": "sigmoid",
           "norm_topk_prob": fields.flag("norm_topk_prob"), "routed_scaling": fields.number("routed_scaling_factor")}
    attention = {"head_size": head_size, "q_rank": fields.integer("q_lora_rank", absent=0) or None,
                 "kv_rank": fields.integer("kv_lora_rank")}
    return LLaMA(layers=fields.integer("num_hidden_layers"), hidden=fields.integer("hidden_size"), ffn=fields.integer("intermediate_size"),
                 heads=heads, kv_heads=kv_heads, seq=fields.seq("max_position_embeddings", seq), batch=batch,
                 vocab=fields.integer("vocab_size"), epsilon=fields.number("rms_norm_eps"), rope_theta=fields.number("rope_theta"),
                 tie_embeddings=fields.flag("tie_word_embeddings"), experts=experts, experts_per_token=top_k,
                 capacity_factor=capacity_factor, moe=moe, attention=attention, fused_attention=fused_attention,
                 attention_dropout=_attention_dropout(fields, fused_attention))


def _experts(fields: _Fields, model_type: str, capacity_factor) -> dict:
    """LLaMA's mixture-of-experts arguments of a mixtral or gpt_oss config (none for the dense families)."""
    if model_type not in ("gpt_oss", "mixtral"):
        return {}
    experts, top_k = fields.integer("num_local_experts"), fields.integer("num_experts_per_tok")
    if top_k > experts:
        raise fields.fail("num_experts_per_tok", f"expected at most num_local_experts {experts}")
    if model_type == "gpt_oss" and fields.integer("experts_per_token", absent=top_k) != top_k:  # GPT-OSS's file gives both
        raise fields.fail("experts_per_token", f"expected num_experts_per_tok {top_k}")
    return {"experts": experts, "experts_per_token": top_k, "capacity_factor": capacity_factor}


def _gpt(fields: _Fields, model_type: str, seq, batch):
    hidden, heads = fields.integer("n_embd"), fields.integer("n_head")
    if hidden % heads:
        raise fields.fail("n_head", f"expected a divisor of n_embd {hidden}")
    if fields.values["n_inner"] not in (None, 4 * hidden):
        raise fields.fail("n_inner", f"autostrat's GPT has an FFN of 4 * n_embd = {4 * hidden}")
    return GPT(layers=fields.integer("n_layer"), hidden=hidden, heads=heads, seq=fields.seq("n_positions", seq), batch=batch,
               vocab=fields.integer("vocab_size"), epsilon=fields.number("layer_norm_epsilon"),
               tie_embeddings=fields.flag("tie_word_embeddings"),
               dropout=tuple(fields.probability(field) for field in ("attn_pdrop", "resid_pdrop", "embd_pdrop")))
