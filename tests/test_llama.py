"""LLaMA and GPT models from HuggingFace config.json files (issue #33, item 1): the LLaMA model
computes what HuggingFace's LlamaForCausalLM computes (written out below in numpy, repeat_kv
and all), a tiny one read from config.json trains on 8 LocalBackend ranks like one device, the
YAML ``model: {hf_config: FILE}`` reads it relative to the YAML, and every refused field says
which file, field and value."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from autostrat import nn, reset_auto_parallel_context, set_auto_parallel_context
from autostrat.errors import ConfigError
from autostrat.frontend.config import load_config
from autostrat.frontend.train import TrainOneStepCell, compare, training_plan
from autostrat.models import GPT, LLaMA, from_hf_config, llama_megatron_seeds
from autostrat.runtime.training import reference_graph, train_locally, train_reference
from tests.test_training import _seed_gpt

ROOT = Path(__file__).resolve().parent.parent
TINY = ROOT / "configs" / "models" / "llama-tiny.json"


@pytest.fixture(autouse=True)
def _reset():
    yield
    reset_auto_parallel_context()


def _rms(x, gamma, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * gamma


def _huggingface_llama_loss(net: LLaMA, ids: np.ndarray, labels: np.ndarray, config: dict) -> float:
    """LlamaForCausalLM's forward and mean cross entropy, from its definition (float64): rotary
    tables from rope_theta, rotate_half, repeat_kv (np.repeat over heads), SwiGLU."""
    hidden, heads, kv = config["hidden_size"], config["num_attention_heads"], config["num_key_value_heads"]
    d, eps, (batch, seq) = hidden // heads, config["rms_norm_eps"], ids.shape
    weight = {name: p.asnumpy().astype(np.float64) for name, p in net.parameters_and_names()}
    inverse = 1.0 / config["rope_theta"] ** (np.arange(0, d, 2) / d)
    angles = np.concatenate([np.outer(np.arange(seq), inverse)] * 2, axis=-1)
    cos, sin = np.cos(angles), np.sin(angles)

    def rope(x):
        return x * cos + np.concatenate([-x[..., d // 2:], x[..., :d // 2]], axis=-1) * sin

    def heads_of(x, count):
        return x.reshape(batch, seq, count, d).transpose(0, 2, 1, 3)

    x = weight["embedding.embedding_table"][ids]
    for layer in range(config["num_hidden_layers"]):
        w = {k.split(f"blocks.{layer}.", 1)[1]: v for k, v in weight.items() if k.startswith(f"blocks.{layer}.")}
        h = _rms(x, w["ln1.gamma"], eps)
        q = rope(heads_of(h @ w["attention.query.weight"].T, heads))
        k = np.repeat(rope(heads_of(h @ w["attention.key.weight"].T, kv)), heads // kv, axis=1)
        v = np.repeat(heads_of(h @ w["attention.value.weight"].T, kv), heads // kv, axis=1)
        scores = q @ k.transpose(0, 1, 3, 2) / math.sqrt(d) + np.triu(np.full((seq, seq), -np.inf), 1)
        probabilities = np.exp(scores - scores.max(-1, keepdims=True))
        probabilities /= probabilities.sum(-1, keepdims=True)
        x = x + (probabilities @ v).transpose(0, 2, 1, 3).reshape(batch, seq, hidden) @ w["attention.projection.weight"].T
        h = _rms(x, w["ln2.gamma"], eps)
        gate = h @ w["ffn_gate.weight"].T
        x = x + (gate / (1 + np.exp(-gate)) * (h @ w["ffn_up.weight"].T)) @ w["ffn_down.weight"].T
    head = weight["embedding.embedding_table"] if net.tie_embeddings else weight["lm_head.weight"]
    logits = (_rms(x, weight["ln_final.gamma"], eps) @ head.T).reshape(batch * seq, -1)
    logits -= logits.max(-1, keepdims=True)
    log_probabilities = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    return float(-log_probabilities[np.arange(batch * seq), labels].mean())


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_llama_computes_what_huggingface_llama_computes(tmp_path, tied):
    config = json.loads(TINY.read_text()) | {"tie_word_embeddings": tied}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    net = from_hf_config(path, seq=8, batch=2)
    rng = np.random.default_rng(4)
    for _, parameter in net.parameters_and_names():  # away from the initial unit gammas
        parameter.set_data(rng.standard_normal(parameter.shape).astype(np.float32) * 0.3)
    ids, labels = (t.asnumpy() for t in net.example_inputs(with_data=True, seed=2))
    loss = float(net(nn.Tensor(ids), nn.Tensor(labels)).asnumpy())
    assert ("lm_head.weight" in dict(net.parameters_and_names())) is not tied
    assert loss == pytest.approx(_huggingface_llama_loss(net, ids, labels, config), rel=1e-5)


def test_tiny_llama_from_config_json_trains_on_8_ranks_like_one_device():
    """TP 4 (over the 4 kv heads) x DP 2 seeds, Adam, three steps on LocalBackend threads."""
    net = from_hf_config(TINY, seq=16, batch=8)
    set_auto_parallel_context(parallel_mode="auto_parallel", device_num=8, gradients_mean=True)
    _seed_gpt(net, llama_megatron_seeds(2, 4, data_parallel=2))
    plan, values, batches = training_plan(TrainOneStepCell(net, nn.Adam(net.trainable_params(), 1e-3)), None, net.example_inputs(), 3)
    run, alone = train_locally(plan, values, batches), train_reference(reference_graph(plan), values, batches)
    report = compare(plan, run, alone)
    assert report.ok, report.text
    assert run.measured == run.predicted and run.losses[-1] < run.losses[0]
    # The kv heads are split with the query heads: each rank's key weight holds one kv head's rows.
    assert plan.layouts["blocks.0.attention.key.weight"].slice_shape == (8, 64)


def test_a_yaml_config_reads_hf_config_relative_to_itself(tmp_path):
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "tiny.json").write_text(TINY.read_text())
    yaml = tmp_path / "run.yaml"
    yaml.write_text("device_num: 8\nmodel: {hf_config: models/tiny.json, params: {seq: 8, batch: 2}}\n"
                    "inputs: [{shape: [2, 8], dtype: int32}, {shape: [16], dtype: int32}]\n")
    config = load_config(yaml)
    assert isinstance(config.net, LLaMA) and config.net.seq == 8
    shipped = load_config(ROOT / "configs" / "llama_train.yaml")
    assert shipped.net.blocks[1].attention.group == 2 and shipped.strategies["blocks.1.ffn_down.matmul"][0] == ((2, 4), (1, 4))


def test_shipped_shapes_are_the_model_cards():
    shapes = {}
    for name in ("llama-2-7b", "llama-3-8b", "llama-3.1-405b"):
        net = from_hf_config(ROOT / "configs" / "models" / f"{name}.json", seq=16)
        block = net.blocks[0]
        shapes[name] = (len(net.blocks), net.hidden, block.ffn_up.weight.shape[0], block.attention.heads, block.attention.kv_heads,
                        net.embedding.embedding_table.shape[0], block.ln1.rms_norm.attrs["epsilon"])
    assert shapes == {"llama-2-7b": (32, 4096, 11008, 32, 32, 32000, 1e-5), "llama-3-8b": (32, 4096, 14336, 32, 8, 128256, 1e-5),
                      "llama-3.1-405b": (126, 16384, 53248, 128, 8, 128256, 1e-5)}
    gpt = from_hf_config(ROOT / "configs" / "models" / "gpt-175b.json", seq=16)
    assert isinstance(gpt, GPT) and gpt.tie_embeddings and (len(gpt.blocks), gpt.hidden) == (96, 12288)
    assert gpt.blocks[0].attention.heads == 96 and gpt.blocks[0].ffn1.weight.shape == (4 * 12288, 12288)


def test_gpt2_config_builds_gpt_that_trains_like_one_device(tmp_path):
    path = tmp_path / "gpt2.json"
    path.write_text(json.dumps({"model_type": "gpt2", "n_embd": 32, "n_head": 4, "n_layer": 1, "n_positions": 8, "vocab_size": 64,
                                "activation_function": "gelu", "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0}))
    net = from_hf_config(path, batch=4)
    assert net.seq == 8 and net.tie_embeddings and net.blocks[0].ln1.layer_norm.attrs["epsilon"] == 1e-5
    set_auto_parallel_context(parallel_mode="auto_parallel", device_num=4, gradients_mean=True)
    plan, values, batches = training_plan(TrainOneStepCell(net, nn.Adam(net.trainable_params(), 1e-3)), None, net.example_inputs(), 2)
    report = compare(plan, train_locally(plan, values, batches), train_reference(reference_graph(plan), values, batches))
    assert report.ok, report.text


def _write(tmp_path, **changes) -> Path:
    config = json.loads(TINY.read_text()) | changes
    path = tmp_path / "config.json"
    path.write_text(json.dumps({k: v for k, v in config.items() if v is not ...}))
    return path


@pytest.mark.parametrize(("changes", "message"), [
    ({"model_type": "bert"}, r"config.json: model_type: expected one of deepseek_v3, gpt2, gpt_oss, llama, mistral, mixtral, qwen2, got 'bert'"),
    ({"sliding_attention": 3}, r"config.json: sliding_attention: unknown field for model_type llama \(value 3\)"),
    ({"hidden_act": "gelu"}, r"config.json: hidden_act: autostrat computes the SwiGLU gate SiLU; cannot honour 'gelu'"),
    ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, r"config.json: rope_scaling: autostrat computes unscaled rotary frequencies; cannot honour \{'rope_type': 'llama3'"),
    ({"num_key_value_heads": 3}, r"config.json: num_key_value_heads: expected a divisor of num_attention_heads 8, got 3"),
    ({"hidden_size": 64.0}, r"config.json: hidden_size: expected a positive integer, got 64.0"),
    ({"vocab_size": ...}, r"config.json: vocab_size: a required field is missing"),
    ({"head_dim": 16}, r"config.json: head_dim: autostrat's head size is hidden_size / num_attention_heads = 8, got 16"),
    ({"tie_word_embeddings": "yes"}, r"config.json: tie_word_embeddings: expected true or false, got 'yes'"),
    ({"model_type": "mistral", "attention_bias": ..., "sliding_window": 8},
     r"config.json: sliding_window: autostrat computes full causal attention: expected null or at least seq 16, got 8"),
])
def test_config_errors_name_the_file_field_and_value(tmp_path, changes, message):
    with pytest.raises(ConfigError, match=message):
        from_hf_config(_write(tmp_path, **changes), seq=16)


def test_gpt2_defaults_it_cannot_honour_are_refused_as_defaults(tmp_path):
    path = tmp_path / "gpt2.json"
    path.write_text(json.dumps({"model_type": "gpt2", "n_embd": 32, "n_head": 4, "n_layer": 1, "vocab_size": 64}))
    with pytest.raises(ConfigError, match=r"activation_function: autostrat computes the exact \(erf\) GeLU, 'gelu'; cannot honour "
                                          r"'gelu_new' \(HuggingFace's default: the field is absent\)"):
        from_hf_config(path)


def test_seq_beyond_the_positions_and_bad_files_are_config_errors(tmp_path):
    with pytest.raises(ConfigError, match=r"llama-tiny.json: seq must be a positive integer up to max_position_embeddings 16, got 32"):
        from_hf_config(TINY, seq=32)
    text = tmp_path / "list.json"
    text.write_text("[1, 2]")
    with pytest.raises(ConfigError, match=r"list.json: expected a JSON object of config fields, got list"):
        from_hf_config(text)
    yaml = tmp_path / "run.yaml"
    yaml.write_text("model: {hf_config: missing.json}\ninputs: [{shape: [2, 8], dtype: int32}]\n")
    with pytest.raises(ConfigError, match=r"run.yaml: model.hf_config: .*missing.json"):
        load_config(yaml)
    yaml.write_text("model: {hf_config: x.json, name: GPT}\ninputs: [{shape: [2, 8], dtype: int32}]\n")
    with pytest.raises(ConfigError, match=r"run.yaml: model: expected a mapping with one of 'name', 'hf_config'"):
        load_config(yaml)


def test_qwen2_has_qkv_biases_and_llama_attention_bias_all_four(tmp_path):
    qwen = from_hf_config(_write(tmp_path, model_type="qwen2", attention_bias=..., tie_word_embeddings=True), seq=8)
    attention = qwen.blocks[0].attention
    assert (attention.query.has_bias, attention.key.has_bias, attention.value.has_bias, attention.projection.has_bias) == (True, True, True, False)
    biased = from_hf_config(_write(tmp_path, attention_bias=True), seq=8).blocks[0].attention
    assert biased.query.has_bias and biased.projection.has_bias
    with pytest.raises(ConfigError, match=r"config.json: use_sliding_window: autostrat computes full causal attention; cannot honour True"):
        from_hf_config(_write(tmp_path, model_type="qwen2", attention_bias=..., use_sliding_window=True), seq=8)


def test_absent_fields_take_huggingfaces_defaults(tmp_path):
    net = from_hf_config(_write(tmp_path, num_key_value_heads=..., rms_norm_eps=..., rope_theta=..., tie_word_embeddings=...), seq=8)
    attention = net.blocks[0].attention
    assert (attention.kv_heads, attention.group, net.tie_embeddings) == (8, 1, False)  # multi-head attention, untied
    assert net.blocks[0].ln1.rms_norm.attrs["epsilon"] == 1e-6
