"""The stand-alone reference is JAX's (issue #30, part 3): forward ops translated from MindSpore's
semantics, gradients by JAX's autodiff, the optimisers written out; every tensor is compared on
its own scale and the worst one is named; without JAX, or for an op it cannot translate, the
check falls back to autostrat's own kernels and says so. JAX never loads on the search's path."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from autostrat.autodiff import Adam, Momentum, SGD, build_training
from autostrat.frontend import trace
from autostrat.frontend.config import load_config
from autostrat.frontend.train import synthetic_batches
from autostrat.models import tutorial_plan
from autostrat.nn import Tensor
from autostrat.runtime.executor import graph_values, single_device_run
from autostrat.runtime.job import make_job
from autostrat.runtime.local import run_job_locally
from autostrat.runtime.reference import reference_run, tensor_errors
from autostrat.runtime.reference_jax import FORWARD, LIBRARY, Untranslatable, check_translatable

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = sorted(path.name for path in (ROOT / "configs").glob("*.yaml"))


def test_the_search_and_the_run_modules_never_import_jax(tmp_path):
    """Nor ml_dtypes, whose import alone takes 0.6 CPU-s: an fp32 rank never pays it
    (`runtime.sixteen_bit.numpy_dtype`)."""
    script = ("import sys\n"
              "from autostrat.cli import main\n"
              f"assert main(['search', {str(ROOT / 'configs' / 'gpt_train.yaml')!r}]) == 0\n"
              "import autostrat.runtime.job, autostrat.runtime.report, autostrat.runtime.training, autostrat.runtime.reference\n"
              "import autostrat.runtime.rank, autostrat.runtime.executor, autostrat.runtime.mpi\n"
              "print(sorted(name for name in sys.modules if name.split('.')[0] in ('jax', 'ml_dtypes')))\n")
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "[]"


@pytest.mark.parametrize("config", CONFIGS)
def test_jax_translates_every_op_of_the_shipped_configs(config):
    """Each config's forward graph, and its training graph with every optimiser."""
    loaded = load_config(ROOT / "configs" / config)
    forward = trace(loaded.net, *loaded.inputs)
    check_translatable(forward)
    for optimizer in (SGD(), Momentum(), Adam()):
        check_translatable(build_training(forward, optimizer))


def test_every_forward_kernel_has_a_translation():
    """Everything a model can trace has a JAX translation (Dropout's mask written out again from
    splitmix64, `reference_jax._dropout`)."""
    from autostrat.autodiff import UPDATE_OP_TYPES
    from autostrat.runtime.kernels.registry import kernel_op_types

    backward = {op_type for op_type in kernel_op_types() if "Grad" in op_type or "Backprop" in op_type}
    forward = set(kernel_op_types()) - backward - set(UPDATE_OP_TYPES)
    assert forward - set(FORWARD) == set()
    assert set(FORWARD) <= forward


def _training_graph(optimizer):
    graph = tutorial_plan(optimizer=optimizer).graph
    return graph, graph_values(graph, {}), synthetic_batches(graph, 2)


@pytest.mark.parametrize("optimizer", [SGD(0.1), Momentum(0.1, 0.9), Adam(1e-2)], ids=["sgd", "momentum", "adam"])
def test_autostrat_alone_equals_jax_on_every_tensor(optimizer):
    """Outputs, every parameter and optimiser state, each on its own scale, after two steps."""
    graph, values, batches = _training_graph(optimizer)
    reference = reference_run(graph, values, batches)
    own, final = single_device_run(graph, values, batches)
    assert reference.library == LIBRARY
    for got, expected in zip(own, reference.outputs):
        assert tensor_errors(got, expected)[1] < 1e-5  # float32 against float64: rounding only
    errors = tensor_errors(final, reference.final)
    assert errors[1] < errors[2], errors  # the float32 limit, 3e-4: Adam scales up gradient rounding
    assert set(reference.final) == {name for name, _ in graph.updates}


def test_momentum_and_adam_follow_mindspore_by_hand():
    """One step from zero state, written out: Momentum v = g, p -= lr * v; Adam m = 0.1 g,
    v = 0.001 g², p -= lr * sqrt(1 - 0.999) / (1 - 0.9) * m / (sqrt(v) + eps)."""
    results = {}
    for name, optimizer in (("sgd", SGD(0.1)), ("momentum", Momentum(0.1, 0.9)), ("adam", Adam(0.01, eps=1e-8))):
        graph, values, batches = _training_graph(optimizer)
        results[name] = reference_run(graph, values, batches[:1])
    g = results["sgd"].gradients[0]["dense2.bias"].astype(np.float64)
    p = graph_values(tutorial_plan().graph, {})["dense2.bias"].astype(np.float64)
    np.testing.assert_allclose(results["sgd"].final["dense2.bias"], p - 0.1 * g, rtol=1e-6)
    np.testing.assert_allclose(results["momentum"].final["moments.dense2.bias"], g, rtol=1e-6)
    np.testing.assert_allclose(results["momentum"].final["dense2.bias"], p - 0.1 * g, rtol=1e-6)
    step = 0.01 * np.sqrt(1 - 0.999) / (1 - 0.9) * (0.1 * g) / (np.sqrt(0.001 * g * g) + 1e-8)
    np.testing.assert_allclose(results["adam"].final["dense2.bias"], p - step, rtol=1e-6)
    np.testing.assert_allclose(results["adam"].final["moment2.dense2.bias"], 0.001 * g * g, rtol=1e-5)
    assert float(results["adam"].final["beta1_power"]) == pytest.approx(0.9)


def test_a_run_names_jax_and_its_worst_tensor():
    check = run_job_locally(make_job(tutorial_plan(optimizer=Adam(1e-3)), steps=2))
    assert check.results_match, check.text
    line = next(line for line in check.text.splitlines() if line.startswith("reference:"))
    assert line.startswith(f"reference: {LIBRARY}; worst tensor "), line
    assert line.endswith("(limit 0.0003)"), line


def test_an_adam_moment_15_percent_wrong_fails_naming_it():
    """Every tensor on its own scale: a second moment is tiny next to the weights, and a 15 %
    error in it is still 0.15/1.15 of its own scale."""
    job = make_job(tutorial_plan(optimizer=Adam(1e-3)), steps=2)
    final = dict(job.final) | {"moment2.dense1.weight": job.final["moment2.dense1.weight"] * np.float32(1.15)}
    check = run_job_locally(replace(job, final=final))
    assert not check.results_match
    assert "worst tensor moment2.dense1.weight 0.13 (limit 0.0003)" in check.text


def test_without_jax_the_check_falls_back_and_says_so(monkeypatch):
    monkeypatch.setitem(sys.modules, "jax", None)  # `import jax` raises ImportError
    monkeypatch.delitem(sys.modules, "autostrat.runtime.reference_jax")
    check = run_job_locally(make_job(tutorial_plan(optimizer=SGD()), steps=1))
    assert check.results_match, check.text
    assert "reference: autostrat's own kernels (JAX not installed); worst tensor " in check.text


def test_an_op_without_a_translation_falls_back_naming_it(monkeypatch):
    monkeypatch.delitem(FORWARD, "ReLU")
    graph, values, batches = _training_graph(SGD())
    with pytest.raises(Untranslatable, match=r"^op relu \(ReLU\)$"):
        check_translatable(graph)
    check = run_job_locally(make_job(tutorial_plan(optimizer=SGD()), steps=1))
    assert "reference: autostrat's own kernels (JAX has no translation of op relu (ReLU)); worst tensor" in check.text


def test_zero_gradient_parameters_are_pooled_and_named():
    """An attention key's bias has an exact gradient of zero: JAX's is zero or rounding noise,
    so the reference lists it, and the tensors of its kind set its scale."""
    from autostrat.models import GPT

    net = GPT(layers=1, hidden=16, heads=2, seq=4, batch=2, vocab=8)
    forward = trace(net, Tensor(shape=(2, 4), dtype="int32"), Tensor(shape=(8,), dtype="int32"))
    graph = build_training(forward, Adam(1e-3))
    reference = reference_run(graph, graph_values(graph, {}), synthetic_batches(graph, 1))
    assert reference.noise_driven == ("blocks.0.attention.key.bias",)
    noise = {"moment1.blocks.0.attention.key.bias": np.float32([1e-12, 0]), "moment1.w": np.float32([1e-3, 0])}
    exact = {"moment1.blocks.0.attention.key.bias": np.float32([0, 0]), "moment1.w": np.float32([1e-3, 0])}
    assert tensor_errors(noise, exact, reference.noise_driven)[1] == pytest.approx(1e-9, rel=1e-3)
    assert tensor_errors(noise, exact)[3] == "moment1.blocks.0.attention.key.bias"


def test_a_training_report_checks_every_tensor_against_jax():
    """`train`'s report (bash run.sh N): the loss curve and final values against JAX's, each
    parameter and state on its own scale, the worst one named; a moment 15 % off fails it."""
    from autostrat.frontend.train import compare
    from autostrat.runtime.training import reference_graph, train_locally, train_reference

    plan = tutorial_plan(optimizer=Momentum(0.01, 0.9))
    values, batches = graph_values(plan.graph, {}), synthetic_batches(plan.graph, 2)
    run, reference = train_locally(plan, values, batches), train_reference(reference_graph(plan), values, batches)
    report = compare(plan, run, reference)
    assert report.ok, report.text
    assert f"reference: {LIBRARY}; worst tensor " in report.text
    wrong = dict(reference.parameters) | {"moments.dense2.bias": reference.parameters["moments.dense2.bias"] * np.float32(1.15)}
    report = compare(plan, run, replace(reference, parameters=wrong))
    assert not report.ok and "worst tensor moments.dense2.bias 0.13 (limit 0.0003)" in report.text
