"""A rank imports scipy.special only for programs whose kernels read it (runtime/kernels/special.py)."""

from __future__ import annotations

import inspect
import subprocess
import sys

from autostrat.runtime.kernels import elementwise, registry


def test_a_rank_starts_without_scipy():
    probe = "import sys, autostrat.runtime.job_file, autostrat.runtime.rank; print('scipy' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_exactly_the_kernels_reading_scipy_special_are_marked():
    # A kernel reading it unmarked would import it inside a rank's first timed step.
    for op_type, entry in registry._KERNELS.items():
        fn = elementwise._UNARY.get(op_type, entry.fn)
        source = inspect.getsource(fn) if inspect.isfunction(fn) else ""  # a numpy ufunc reads no scipy
        assert ("special." in source) == entry.scipy, op_type
    assert sum(entry.scipy for entry in registry._KERNELS.values()) >= 6


def test_preparing_a_program_with_softmax_imports_scipy_and_one_without_does_not():
    probe = ("import sys; from autostrat.runtime.kernels import prepare_kernels; prepare_kernels({'MatMul', 'ReLU'}); "
             "a = 'scipy.special' in sys.modules; prepare_kernels({'MatMul', 'Softmax'}); print(a, 'scipy.special' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "True"]
