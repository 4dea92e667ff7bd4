"""Dropout as Megatron-LM runs it (issue #33): the forward keeps a 1-byte mask the backward reads,
GPT's Dropouts where GPT-2 places them from a config.json's pdrop fields, and a run with them
equal to JAX's reference on 8 ranks (the measured peak: tests/test_memory_measured.py)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from autostrat import nn, reset_auto_parallel_context, set_auto_parallel_context
from autostrat.autodiff import Adam, build_training
from autostrat.autodiff.recompute import RECOMPUTE_PREFIX, recompute_cells
from autostrat.errors import ConfigError
from autostrat.frontend import trace
from autostrat.frontend.train import TrainOneStepCell, training_plan
from autostrat.models import GPT, LLaMA, from_hf_config, megatron_seeds
from autostrat.runtime.job import make_job
from autostrat.runtime.kernels.registry import run_kernel
from autostrat.runtime.local import run_job_locally
from autostrat.runtime.reference_jax import LIBRARY
from autostrat.search import SearchOptions, search

MASK64 = 2**64 - 1


@pytest.fixture(autouse=True)
def _reset():
    yield
    reset_auto_parallel_context()


def _splitmix_fraction(index: int, seed: int) -> float:
    """splitmix64's output for `index` past the seed's offset, its top 53 bits as a fraction, in
    Python integers (Steele et al. 2014; the kernel's and the JAX reference's are numpy and jnp)."""
    z = (index + seed * 0x9E3779B97F4A7C15 + 0x632BE59BD9B4E019) & MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return ((z ^ (z >> 31)) >> 11) / 2**53


def test_the_kernel_keeps_the_splitmix_mask_as_one_byte_a_element():
    x = np.random.default_rng(0).standard_normal((6, 8)).astype(np.float32)
    y, mask = run_kernel("Dropout", [x], {"keep_prob": 0.7, "seed": 5})
    expected = np.array([_splitmix_fraction(i, 5) < 0.7 for i in range(x.size)]).reshape(x.shape)
    assert mask.dtype == np.bool_ and mask.nbytes == x.size
    np.testing.assert_array_equal(mask, expected)
    np.testing.assert_array_equal(y, np.where(expected, x / np.float32(0.7), 0).astype(np.float32))
    [dx] = run_kernel("DropoutGrad", [np.ones_like(x), mask], {"keep_prob": 0.7})
    np.testing.assert_array_equal(dx, np.where(expected, np.float32(1 / 0.7), 0).astype(np.float32))


class _Dropped(nn.Cell):
    def __init__(self):
        super().__init__()
        self.dense = nn.Dense(16, 16)
        self.drop = nn.Dropout(keep_prob=0.8, seed=2)

    def construct(self, x):
        return self.drop(self.dense(x))


@pytest.mark.parametrize("recompute", [False, True])
def test_the_backward_reads_the_kept_mask_or_its_recomputed_copy(recompute):
    forward = trace(_Dropped().set_train(), nn.Tensor(shape=(8, 16)), device_num=1)
    graph = build_training(forward, Adam(1e-3))
    if recompute:
        graph = recompute_cells(graph, ("",), set(forward.ops))
    [grad] = [op for op in graph.ops.values() if op.op_type == "DropoutGrad"]
    mask = grad.inputs[1]
    assert graph.tensors["drop.dropout:1"].dtype == "bool"
    assert mask == (RECOMPUTE_PREFIX + "drop.dropout:1" if recompute else "drop.dropout:1")


def _gpt2_config(tmp_path, **fields):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "gpt2", "n_embd": 32, "n_head": 4, "n_layer": 2, "n_positions": 8,
                                "vocab_size": 64, "activation_function": "gelu", **fields}))
    return path


def test_a_gpt2_config_builds_its_dropouts_where_gpt2_drops(tmp_path):
    net = from_hf_config(_gpt2_config(tmp_path, attn_pdrop=0.1, resid_pdrop=0.2, embd_pdrop=0.3), batch=2)
    graph = trace(net, *net.example_inputs(), device_num=1)
    keep = {name: dict(op.attrs)["keep_prob"] for name, op in graph.ops.items() if op.op_type == "Dropout"}
    assert keep == {"embedding_dropout": 0.7} | {f"blocks.{i}.{name}": p for i in range(2) for name, p in (
        ("attention.probs_dropout", 0.9), ("dropout1", 0.8), ("dropout2", 0.8))}
    seeds = [dict(op.attrs)["seed"] for op in graph.ops.values() if op.op_type == "Dropout"]
    assert len(set(seeds)) == len(seeds)  # no two draw the same mask
    zero = from_hf_config(_gpt2_config(tmp_path, attn_pdrop=0, resid_pdrop=0.0, embd_pdrop=0), batch=2)
    assert not any(op.op_type == "Dropout" for op in trace(zero, *zero.example_inputs(), device_num=1).ops.values())


def test_a_pdrop_outside_0_to_1_is_refused_naming_the_field(tmp_path):
    path = _gpt2_config(tmp_path, attn_pdrop=1.0)
    with pytest.raises(ConfigError, match=r"config.json: attn_pdrop: expected a dropout probability in \[0, 1\), got 1.0"):
        from_hf_config(path)


def test_gpt_refuses_a_dropout_that_is_not_three_probabilities():
    with pytest.raises(ConfigError, match=r"GPT: dropout must be a tuple of 3 probabilities in \[0, 1\) "
                                          r"\(attention, hidden, embedding\), got \(0.1, 0.1\)"):
        GPT(dropout=(0.1, 0.1))


def _megatron_gpt_with_dropout() -> GPT:
    """A 2-layer GPT with dropout 0.1 everywhere, seeded as Megatron's TP 4 x DP 2."""
    net = GPT(layers=2, hidden=32, heads=4, seq=8, batch=4, vocab=64, dropout=(0.1, 0.1, 0.1))
    for name, (strategy, _) in megatron_seeds(2, 4, data_parallel=2).items():
        block, rest = name.split(".", 2)[1:]
        cell = net.blocks[int(block)]
        for part in rest.split("."):
            cell = getattr(cell, part)
        cell.shard(strategy)
    return net


@pytest.mark.slow
def test_a_gpt_with_dropout_on_8_ranks_equals_jax():
    """Every rank slices the masks of its own elements; JAX draws them from its own splitmix64
    (`reference_jax._dropout`)."""
    net = _megatron_gpt_with_dropout()
    set_auto_parallel_context(parallel_mode="auto_parallel", device_num=8)
    plan, _, _ = training_plan(TrainOneStepCell(net, nn.Adam(net.trainable_params(), 1e-3)), None, net.example_inputs(), 2)
    check = run_job_locally(make_job(plan, steps=2))
    assert check.results_match, check.text
    assert f"reference: {LIBRARY}; worst tensor " in check.text


@pytest.mark.slow
def test_a_bf16_llama_with_attention_dropout_on_8_ranks_equals_the_mixed_precision_reference():
    """The masks stay bool (one byte) beside bf16 activations, on the ranks and in JAX's step.
    (A LLaMA: GPT's key bias, whose exact gradient is zero, fails bf16's check with or without
    dropout, its second moment all rounding noise.)"""
    net = LLaMA(layers=2, hidden=32, ffn=48, heads=4, kv_heads=2, seq=8, batch=4, vocab=64, attention_dropout=0.1)
    graph = build_training(trace(net.set_train(), *net.example_inputs(), device_num=8), Adam(1e-3))
    plan = search(graph, 8, SearchOptions(precision="bf16"))
    assert plan.graph.tensors["blocks.0.attention.probs_dropout:1"].dtype == "bool"
    check = run_job_locally(make_job(plan, steps=1))
    assert check.results_match, check.text
    assert "bf16 mixed precision" in check.text


def test_a_llama_config_drops_its_attention_probabilities_unfused_only(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "llama", "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
                                "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 64,
                                "max_position_embeddings": 8, "attention_dropout": 0.1}))
    net = from_hf_config(path, batch=2)
    graph = trace(net, *net.example_inputs(), device_num=1)
    assert sorted(name for name, op in graph.ops.items() if op.op_type == "Dropout") == [
        "blocks.0.attention.probs_dropout", "blocks.1.attention.probs_dropout"]
    with pytest.raises(ConfigError, match=r"config.json: attention_dropout: the fused attention \(fused_attention: true\) "
                                          r"drops nothing: expected 0, got 0.1"):
        from_hf_config(path, fused_attention=True)
