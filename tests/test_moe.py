"""Mixture of experts (issue #35, expert parallelism): the Einsum op and the GShard routing ops
against their JAX translations and JAX's autodiff, the capacity's drops, the Mixtral config,
and the tiny Mixtral trained on 8 local ranks with its experts split 8 ways (EP), equal to the
JAX reference with the bytes predicted (test_mpi.py runs it on 8 MPI ranks with EP 4 x ETP 2). The oracle
(test_oracle.py) and the finite differences (test_gradients.py) cover the ops as every op."""

from __future__ import annotations

import json

import jax
import numpy as np
import pytest

from autostrat.errors import ConfigError, RuleError
from autostrat.frontend.run import RunOptions, run_config
from autostrat.models import from_hf_config, moe_seeds
from autostrat.rules import get_op, make_rule
from autostrat.runtime.kernels import run_kernel
from autostrat.runtime.reference_jax import FORWARD
from tests.oracle import random_inputs
from tests.test_world import ROOT

ROUTING = ("MoeDispatchMask", "MoeCombineWeights")


@pytest.mark.parametrize("op_type", ("Einsum",) + ROUTING)
def test_kernel_equals_the_jax_translation(op_type):
    rng = np.random.default_rng(11)
    for example in get_op(op_type).examples:
        inputs = random_inputs(example, rng)
        [expected] = run_kernel(op_type, inputs, example.attrs)
        got = np.asarray(jax.jit(lambda *xs: FORWARD[op_type](*xs, **example.attrs))(*inputs))  # one compilation, not one per primitive
        np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-12, err_msg=f"{op_type} {example.attrs}")


def test_combine_weights_gradient_equals_jax_autodiff():
    """The grad kernel against jax.vjp of the JAX routing (whose mask comes from integer
    positions, so JAX's own gradient flows through the gate values alone)."""
    rng = np.random.default_rng(12)
    for example in get_op("MoeCombineWeightsGrad").examples:
        logits, dcombine = random_inputs(example, rng)
        [got] = run_kernel("MoeCombineWeightsGrad", [logits, dcombine], example.attrs)
        def pullback(x, dy, attrs=example.attrs):
            return jax.vjp(lambda y: FORWARD["MoeCombineWeights"](y, **attrs), x)[1](dy)[0]

        expected = np.asarray(jax.jit(pullback)(logits, dcombine))
        np.testing.assert_allclose(got, expected, rtol=1e-10, atol=1e-12, err_msg=str(example.attrs))


def test_positions_follow_gshard_priority_and_capacity_drops():
    """Four tokens all preferring expert 0, then expert 1: first choices fill expert 0's two
    slots in token order (tokens 2 and 3 dropped there), second choices fill expert 1's after."""
    logits = np.array([[[2.0, 1.0, 0.0]] * 4])
    mask, = run_kernel("MoeDispatchMask", [logits], {"top_k": 2, "capacity": 2})
    assert mask[0, :, 0].tolist() == [[1, 0], [0, 1], [0, 0], [0, 0]]
    assert mask[0, :, 1].tolist() == [[1, 0], [0, 1], [0, 0], [0, 0]]
    assert mask[0, :, 2].sum() == 0
    weights, = run_kernel("MoeCombineWeights", [logits], {"top_k": 2, "capacity": 4, "norm_topk_prob": True})
    np.testing.assert_allclose(weights.sum(axis=(2, 3)), 1.0)  # dropless: each token's two weights sum to 1
    np.testing.assert_allclose(weights[0, 0, :2].max(axis=-1), [1 / (1 + np.exp(-1)), 1 / (1 + np.e)])


def test_the_einsum_rule_reads_the_equation():
    assert str(make_rule("Einsum", [(4, 6, 2, 3), (4, 6, 8)], equation="gsec,gsh->egch")) == "g s e c, g s h -> e g c h; reduction s"
    assert str(make_rule("Einsum", [(2, 6, 2, 3), (2, 2, 3, 8)], equation="gsec,egch->gsh")) == "g s e c, e g c h -> g s h; reduction e c"
    assert str(make_rule("MoeDispatchMask", [(2, 6, 4)], capacity=3)) == "g s e -> g s e c; need-replication s e c"


@pytest.mark.parametrize(("op_type", "shapes", "attrs", "message"), [
    ("Einsum", [(2, 3), (3, 4)], {"equation": "ij,jk"}, r"equation must be explicit, such as 'ij,jk->ik', got 'ij,jk'"),
    ("Einsum", [(3, 3)], {"equation": "ii->i"}, r"distinct lowercase indices \(no '...', no repeated index\), got 'ii'"),
    ("Einsum", [(2, 3)], {"equation": "ij->k"}, r"output index 'k' of 'ij->k' is in no input"),
    ("Einsum", [(2, 3)], {"equation": "ij,jk->ik"}, r"'ij,jk->ik' names 2 operands, got 1 inputs"),
    ("MoeDispatchMask", [(2, 6)], {}, r"needs router logits \[groups, tokens, experts\], got shape \[2, 6\]"),
    ("MoeDispatchMask", [(2, 6, 4)], {"top_k": 5}, r"top_k must be an integer from 1 to the 4 experts, got 5"),
    ("MoeCombineWeights", [(2, 6, 4)], {"capacity": 0}, r"capacity must be a positive integer .* got 0"),
    ("MoeCombineWeights", [(2, 6, 4)], {"gate": "relu"}, r"gate must be one of sigmoid, softmax, got 'relu'"),
    ("MoeCombineWeightsGrad", [(2, 6, 4), (2, 6, 4, 2)], {"capacity": 3}, r"needs dcombine of shape \[2, 6, 4, 3\], got \[\[2, 6, 4, 2\]\]"),
])
def test_rule_errors(op_type, shapes, attrs, message):
    with pytest.raises(RuleError, match=message):
        make_rule(op_type, shapes, **attrs)


def test_an_einsum_summing_inside_one_operand_has_no_gradient():
    from autostrat import nn, ops
    from autostrat.autodiff import build_backward
    from autostrat.frontend import trace

    class RowSums(nn.Cell):
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(np.ones((4, 3), np.float32))
            self.sums = ops.Einsum("ij->i")

        def construct(self, x):
            return ops.ReduceSum()(ops.Mul()(self.sums((self.weight,)), x), ())

    graph = trace(RowSums(), nn.Tensor(shape=(4,)))
    with pytest.raises(RuleError, match=r"sums: Einsum 'ij->i' sums index 'j' inside operand 0 alone; its gradient"):
        build_backward(graph)


def test_the_tiny_mixtral_config():
    net = from_hf_config(ROOT / "configs/models/mixtral-tiny.json", seq=16, batch=8, capacity_factor=1.5)
    moe = net.blocks[0].moe
    assert moe.w_gate.shape == (8, 32, 48) and moe.w_down.shape == (8, 48, 32) and moe.router.shape == (8, 32)
    assert moe.dispatch_mask.attrs == {"top_k": 2, "capacity": 6, "gate": "softmax", "norm_topk_prob": True}
    assert from_hf_config(ROOT / "configs/models/mixtral-tiny.json", seq=8).blocks[0].moe.dispatch_mask.attrs["capacity"] == 8


@pytest.mark.parametrize(("change", "message"), [
    ({"num_experts_per_tok": 9}, r"num_experts_per_tok: expected at most num_local_experts 8, got 9"),
    ({"num_local_experts": 0}, r"num_local_experts: expected a positive integer, got 0"),
    ({"router_jitter_noise": 0.1}, r"router_jitter_noise: autostrat computes no router jitter; cannot honour 0.1"),
    ({"output_router_logits": True}, r"output_router_logits: autostrat computes no auxiliary load-balancing loss; cannot honour True"),
    ({"n_shared_experts": 2}, r"n_shared_experts: unknown field for model_type mixtral \(value 2\)"),
])
def test_mixtral_config_errors_name_the_file_and_field(tmp_path, change, message):
    data = json.loads((ROOT / "configs/models/mixtral-tiny.json").read_text()) | change
    path = tmp_path / "config.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ConfigError, match=f"config.json: {message}"):
        from_hf_config(path, seq=16)


def test_a_capacity_factor_needs_experts():
    with pytest.raises(ConfigError, match=r"capacity_factor applies to a mixture of experts \(model_type deepseek_v3, gpt_oss, mixtral\), got 1.5 for model_type llama"):
        from_hf_config(ROOT / "configs/models/llama-tiny.json", capacity_factor=1.5)
    with pytest.raises(ConfigError, match=r"capacity_factor must be a positive number or null \(dropless\), got -1"):
        from_hf_config(ROOT / "configs/models/mixtral-tiny.json", capacity_factor=-1)


EP_ONLY = {op: [list(part) for part in strategy] for op, (strategy, _) in moe_seeds(1, 8).items()}


def test_the_tiny_mixtral_trains_on_8_local_ranks_with_experts_split_8_ways(tmp_path):
    """configs/moe_train.yaml with EP 8 (no ETP) in place of its EP 4 x ETP 2 seeds, which
    tests/test_mpi.py runs on 8 MPI ranks: the tokens reach their experts by one AllToAll over
    the 8 devices, from the split by sequence to the split by expert."""
    import yaml

    config = yaml.safe_load((ROOT / "configs/moe_train.yaml").read_text())
    assert set(EP_ONLY) <= set(config["strategies"])  # the shipped EP 4 x ETP 2 seeds, replaced
    config["strategies"] |= EP_ONLY
    config["model"]["hf_config"] = str(ROOT / "configs/models/mixtral-tiny.json")
    path = tmp_path / "moe.yaml"
    path.write_text(yaml.safe_dump(config))
    code, text = run_config(path, RunOptions(backend="local", steps=1))
    assert code == 0, text
    assert "bytes: measured = predicted on every rank" in text and ": OK" in text
    assert "blocks.0.moe.dispatch:0 -> blocks.0.moe.expert_gate[0]: AllToAll (forward) sent 5376, predicted 5376" in text
    assert "dm[8] tm(0, -1, -1)" in text.split("optimizer/blocks.0.moe.w_gate")[1].splitlines()[0]  # 1 expert per device


def test_mindspore_names_of_the_new_ops():
    """``ops.Einsum(equation)((x, y))`` and ``ops.einsum(equation, x, y)``, as MindSpore spells
    them, and the routing primitives."""
    from autostrat import nn, ops

    rng = np.random.default_rng(3)
    x, y = rng.standard_normal((2, 3)).astype(np.float32), rng.standard_normal((3, 4)).astype(np.float32)
    np.testing.assert_allclose(ops.Einsum("ij,jk->ik")((nn.Tensor(x), nn.Tensor(y))).asnumpy(), x @ y, rtol=1e-6)
    np.testing.assert_allclose(ops.einsum("ij,jk->ki", nn.Tensor(x), nn.Tensor(y)).asnumpy(), (x @ y).T, rtol=1e-6)
    logits = nn.Tensor(rng.standard_normal((1, 4, 3)).astype(np.float32))
    assert ops.MoeDispatchMask(top_k=2, capacity=4)(logits).asnumpy().sum() == 8  # dropless: 4 tokens x 2 experts
