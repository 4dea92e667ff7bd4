"""The kernels' special functions (runtime/kernels/special.py) against independent ones: the C
library's erf (``math.erf``) and ``scipy.special``; and a rank that runs them imports no scipy."""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest
import scipy.special

from autostrat.runtime.kernels import special

RNG = np.random.default_rng(11)


def test_erf_is_the_c_librarys_erf_to_1e_14_everywhere():
    points = np.concatenate([np.linspace(-9, 9, 40_001), np.geomspace(1e-300, 1e-2, 2_001), [0.0, 6.0, -6.0, 5.999999]])
    expected = np.array([math.erf(x) for x in points])
    assert np.abs(special.erf(points) - expected).max() <= 1e-14
    small = np.abs(points) < 1e-2  # near 0 the error is relative, not only absolute
    assert (np.abs(special.erf(points[small]) - expected[small]) <= 4e-16 * np.abs(expected[small])).all()


def test_erf_keeps_a_float32_input_float32_and_rounds_as_the_float64_value():
    x = (RNG.standard_normal(10_000) * 3).astype(np.float32)
    got = special.erf(x)
    assert got.dtype == np.float32
    assert np.array_equal(got, np.array([math.erf(v) for v in x.astype(np.float64)]).astype(np.float32))


@pytest.mark.parametrize("scale", [1.0, 30.0, 1e4])
@pytest.mark.parametrize("axis", [0, -1])
def test_softmax_and_log_softmax_are_scipys(scale, axis):
    x = RNG.standard_normal((40, 17)) * scale
    np.testing.assert_allclose(special.softmax(x, axis=axis), scipy.special.softmax(x, axis=axis), rtol=1e-13, atol=1e-300)
    np.testing.assert_allclose(special.log_softmax(x, axis=axis), scipy.special.log_softmax(x, axis=axis), rtol=1e-12)
    assert np.allclose(special.softmax(x, axis=axis).sum(axis=axis), 1.0)


def test_expit_is_scipys_without_overflow():
    x = np.concatenate([np.linspace(-800, 800, 4_001), RNG.standard_normal(1_000)])
    with np.errstate(over="raise"):
        got = special.expit(x)
    np.testing.assert_allclose(got, scipy.special.expit(x), rtol=1e-14, atol=1e-300)
    assert special.expit(x.astype(np.float32)).dtype == np.float32


def test_a_rank_running_every_special_kernel_imports_no_scipy():
    probe = ("import sys, numpy as np, autostrat.runtime.job_file, autostrat.runtime.rank\n"
             "from autostrat.runtime.kernels import run_kernel\n"
             "x = np.ones((2, 3), np.float32)\n"
             "for op in ('GeLU', 'Sigmoid', 'Softmax', 'LogSoftmax'): run_kernel(op, [x])\n"
             "print('scipy' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
