"""The ops a LLaMA decoder needs (issue #33): RmsNorm, SiLU and RotaryPositionEmbedding. The
oracle (test_oracle.py) and the finite differences (test_gradients.py) cover them as every op;
here each kernel meets its JAX translation, written from MindSpore's documented semantics, and
the rules split what they claim to split."""

from __future__ import annotations

import numpy as np
import pytest

from autostrat.errors import RuleError
from autostrat.rules import get_op, make_rule
from autostrat.runtime.kernels import run_kernel
from autostrat.runtime.reference_jax import FORWARD
from tests.oracle import random_inputs

NEW_OPS = ("RmsNorm", "RotaryPositionEmbedding", "SiLU")


@pytest.mark.parametrize("op_type", NEW_OPS)
def test_kernel_equals_the_jax_translation(op_type):
    rng = np.random.default_rng(5)
    for example in get_op(op_type).examples:
        inputs = random_inputs(example, rng)
        [expected] = run_kernel(op_type, inputs, example.attrs)
        got = np.asarray(FORWARD[op_type](*inputs, **example.attrs))
        np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-12, err_msg=f"{op_type} {example.shapes}")


def test_rotary_with_llama_tables_rotates_each_pair_by_its_angle():
    """HuggingFace LLaMA's tables (cos, sin of position * inverse frequency, halves repeated):
    pair (i, i + D/2) of position p turns by p * theta**(-2i/D), so norms are kept."""
    seq, dim = 5, 8
    angles = np.arange(seq)[:, None] * 10000.0 ** (-np.arange(0, dim, 2) / dim)[None, :]
    cos, sin = np.cos(np.concatenate([angles, angles], -1)), np.sin(np.concatenate([angles, angles], -1))
    x = np.random.default_rng(1).standard_normal((2, 3, seq, dim))
    [y] = run_kernel("RotaryPositionEmbedding", [x, cos, sin])
    half = dim // 2
    complex_x = x[..., :half] + 1j * x[..., half:]
    turned = complex_x * np.exp(1j * angles)
    np.testing.assert_allclose(y, np.concatenate([turned.real, turned.imag], -1), atol=1e-12)


def test_rotary_keeps_head_dim_whole_and_splits_seq_with_its_tables():
    rule = make_rule("RotaryPositionEmbedding", [(2, 4, 6, 8), (6, 8), (6, 8)])
    assert str(rule) == "a b c d, c d, c d -> a b c d; need-replication d"


def test_rms_norm_keeps_gamma_dims_whole():
    assert str(make_rule("RmsNorm", [(4, 6, 8), (8,)])) == "a b c, c -> a b c; need-replication c"


@pytest.mark.parametrize(("op_type", "shapes", "attrs", "message"), [
    ("RotaryPositionEmbedding", [(2, 4, 6, 7), (6, 7), (6, 7)], {}, "needs x with an even last dim"),
    ("RotaryPositionEmbedding", [(2, 4, 6, 8), (6, 8), (6, 8)], {"mode": 1}, r"only mode 0 \(rotate_half\) is supported, got mode 1"),
    ("RotaryPositionEmbedding", [(2, 1, 6, 8), (3, 6, 8), (3, 6, 8)], {}, r"cos and sin \[3, 6, 8\] must broadcast to x \[2, 1, 6, 8\]"),
    ("RmsNorm", [(4, 6, 8), (6,)], {}, r"gamma's shape must be x's trailing dims, got x \[4, 6, 8\] and gamma \[6\]"),
])
def test_rule_errors(op_type, shapes, attrs, message):
    with pytest.raises(RuleError, match=message):
        make_rule(op_type, shapes, **attrs)


def test_mindspore_names_of_the_new_ops():
    """``ops.RmsNorm(epsilon)(x, gamma)``, ``ops.silu``, ``nn.SiLU`` and
    ``ops.rotary_position_embedding(x, cos, sin, mode)``, as MindSpore spells them."""
    from autostrat import nn, ops

    rng = np.random.default_rng(2)
    x, gamma = rng.standard_normal((2, 3, 8)).astype(np.float32), rng.standard_normal(8).astype(np.float32)
    expected = x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-3) * gamma
    np.testing.assert_allclose(ops.RmsNorm(1e-3)(nn.Tensor(x), nn.Tensor(gamma)).asnumpy(), expected, rtol=1e-5)
    np.testing.assert_allclose(ops.rms_norm(nn.Tensor(x), nn.Tensor(gamma), 1e-3).asnumpy(), expected, rtol=1e-5)
    np.testing.assert_allclose(ops.silu(nn.Tensor(x)).asnumpy(), nn.SiLU()(nn.Tensor(x)).asnumpy())
    np.testing.assert_allclose(nn.SiLU()(nn.Tensor(x)).asnumpy(), x / (1 + np.exp(-x)), rtol=1e-6)
    cos, sin = np.ones((3, 8), np.float32), np.zeros((3, 8), np.float32)
    rotated = ops.rotary_position_embedding(nn.Tensor(x[None]), nn.Tensor(cos), nn.Tensor(sin), 0)
    np.testing.assert_array_equal(rotated.asnumpy(), x[None])  # cos 1, sin 0: no turn
