"""The stand-alone reference of every checked run, and the per-tensor comparison with it.

The reference is computed by JAX (`runtime.reference_jax`: forward ops translated from
MindSpore's semantics, gradients by JAX's autodiff, the optimisers written out), so that a
wrong kernel, bprop or update of autostrat's cannot agree with it. Where JAX is not installed,
or the graph has an op it has no translation of, the reference falls back to autostrat's own
kernels (`executor.single_device_run`) and its label says so and why: such a check only shows
that the ranks agree with one device running the same kernels.

A parameter whose exact gradient is zero (an attention key's bias: softmax ignores what it adds
to every score of a row) gets a gradient of rounding noise in float32, which Adam scales up to
a step of the learning rate's size: two correct implementations disagree on it completely.
Such a parameter (its reference gradient at most `NOISE` times the step's largest) and its
optimiser state are compared on the scale of all tensors of their kind (all parameters, all
first moments, ...), and the report names them.

JAX is imported here only when a reference is computed (once per process, about a second),
never when this module is imported: the search never pays for it.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

import numpy as np

from autostrat.autodiff import forward_name
from autostrat.errors import ConfigError
from autostrat.runtime.executor import single_device_run

OWN_KERNELS = "autostrat's own kernels"
# The largest relative error of a tensor on its own scale. A float32 run against the float64
# reference: each gradient of a 2-layer GPT is off by up to 1e-5 of its largest element
# (cancellation in float32 sums). MindSpore's Adam adds eps to the uncorrected sqrt(v), so an
# element whose gradient is near eps / sqrt(1 - beta2) (3e-7) keeps half its gradient's relative
# error in its step instead of normalising it away: measured, a bias element at 2.6e-4 of its
# tensor's largest gradient, off by 4e-4 of itself, left its parameter off by 1.03e-4 of the
# tensor's scale after one step (transformer_stack.yaml on 8 ranks), 2.1e-4 after three (a
# 2-stage GPT against JAX; numpy 2.4.6, JAX 0.10.2); a wrong kernel or update is off by 1e-3 or more.
TOLERANCE = {"float16": 1e-2, "float32": 3e-4, "float64": 1e-10}
# Half the distance from 1 to the next 16-bit number (bf16 keeps 8 significant bits, fp16 11),
# and how many of them a step's tensors may differ by (`sixteen_bit_tolerance`).
UNIT_ROUNDOFF = {"bf16": 2.0**-8, "fp16": 2.0**-11}
ROUNDINGS = 64
# The floor of a tensor's scale: a tensor the reference holds at exact zeros is compared absolutely.
TINY = 1e-30
NOISE = 2.0**-20  # a gradient this small next to the step's largest is float32 rounding noise


@dataclass(frozen=True)
class Reference:
    """Every step's outputs and gradients (by parameter; none from the fallback), the updated
    tensors after the last step, and which library computed them (`library`: "JAX 0.x on
    CPU", or `OWN_KERNELS` and why)."""

    outputs: tuple[dict, ...]
    gradients: tuple[dict, ...]
    final: dict
    library: str

    @property
    def noise_driven(self) -> tuple[str, ...]:
        """The parameters whose every reference gradient is rounding noise (see the module docstring)."""
        largest = [max((float(np.max(np.abs(g), initial=0.0)) for g in step.values()), default=0.0) for step in self.gradients]
        return tuple(sorted(name for name in (self.gradients[0] if self.gradients else ()) if all(
            float(np.max(np.abs(step[name]), initial=0.0)) <= NOISE * top for step, top in zip(self.gradients, largest))))

    @property
    def independent(self) -> bool:
        return not self.library.startswith(OWN_KERNELS)


def reference_run(graph, values: dict, batches, precision: str = "fp32", loss_scale: float = 1.0) -> Reference:
    """The reference of a run of `graph` from `values` (initial parameters, state, constants)
    on `batches`: JAX where it is installed and translates every op, else autostrat's kernels;
    in fp16 or bf16, JAX's mixed-precision step (`reference_mixed`, with its static `loss_scale`),
    which has no fallback.

    Example (the tutorial FFN's training graph, one step):
        >>> from autostrat.autodiff import SGD
        >>> from autostrat.frontend.train import synthetic_batches
        >>> from autostrat.models import tutorial_plan
        >>> from autostrat.runtime.executor import graph_values
        >>> graph = tutorial_plan(optimizer=SGD()).graph
        >>> reference = reference_run(graph, graph_values(graph, {}), synthetic_batches(graph, 1))
        >>> reference.library.startswith("JAX"), sorted(reference.gradients[0])[:1]
        (True, ['dense1.bias'])
    """
    if precision != "fp32":
        return _mixed_reference(graph, values, batches, precision, loss_scale)
    try:
        reference_jax = importlib.import_module("autostrat.runtime.reference_jax")
    except ImportError:
        return _own_kernels(graph, values, batches, "JAX not installed")
    try:
        outputs, gradients, final = reference_jax.jax_run(graph, values, batches)
    except reference_jax.Untranslatable as missing:
        return _own_kernels(graph, values, batches, f"JAX has no translation of {missing}")
    return Reference(outputs, gradients, final, reference_jax.LIBRARY)


def _mixed_reference(graph, values: dict, batches, precision: str, loss_scale: float) -> Reference:
    """JAX's mixed-precision run: autostrat's own kernels cannot stand in for it (they would
    check the runtime's 16-bit arithmetic against itself), so a missing JAX or translation is
    a `ConfigError` naming the precision, before any rank starts."""
    try:
        reference_jax = importlib.import_module("autostrat.runtime.reference_jax")
        reference_mixed = importlib.import_module("autostrat.runtime.reference_mixed")
    except ImportError:
        raise ConfigError(f"precision {precision!r}: a 16-bit run is checked against JAX's mixed-precision step, "
                          f"and JAX is not installed (pip install jax)") from None
    try:
        outputs, gradients, final = reference_mixed.mixed_run(graph, values, batches, precision, loss_scale)
    except reference_jax.Untranslatable as missing:
        raise ConfigError(f"precision {precision!r}: the JAX reference of a 16-bit run has no translation of {missing}; "
                          f"run it in precision fp32") from None
    return Reference(outputs, gradients, final, f"{reference_jax.LIBRARY}, {precision} mixed precision")


def sixteen_bit_tolerance(precision: str, steps: int) -> float:
    """The largest relative error of a tensor of a 16-bit run against the mixed-precision
    reference, each tensor on its own scale: `ROUNDINGS` unit roundoffs of the 16-bit dtype
    (2^-8 for bf16's 8 significant bits, 2^-11 for fp16's 11) per step, as a step's rounding
    differences add up over the steps (two correct runs round at different points: a kernel's
    fp32 against the reference's float64, the ring's order of a 16-bit sum, a bprop's ops
    against JAX's VJP of the op, a main copy rounded either side of a tie). fp32 keeps `TOLERANCE`.

    Example:
        >>> sixteen_bit_tolerance("bf16", 2), sixteen_bit_tolerance("fp16", 2)
        (0.5, 0.0625)
    """
    return ROUNDINGS * UNIT_ROUNDOFF[precision] * max(steps, 1) if precision in UNIT_ROUNDOFF else 0.0


def _own_kernels(graph, values: dict, batches, why: str) -> Reference:
    outputs, final = single_device_run(graph, values, batches)
    return Reference(outputs, (), final, f"{OWN_KERNELS} ({why})")


def _kind(name: str) -> str:
    """A tensor's kind by its prefix: "" for a parameter or output, "moment1." for a first moment, ..."""
    return name[: len(name) - len(forward_name(name))]


def _scales(expected: dict, pooled: tuple[str, ...]) -> dict[str, float]:
    own = {name: float(np.max(np.abs(np.asarray(array)), initial=0.0)) for name, array in expected.items()}
    kinds: dict[str, float] = {}
    for name, scale in own.items():
        kinds[_kind(name)] = max(kinds.get(_kind(name), 0.0), scale)
    return {name: max(kinds[_kind(name)] if forward_name(name) in pooled else scale, TINY) for name, scale in own.items()}


def tensor_errors(got: dict, expected: dict, pooled: tuple[str, ...] = (), limit: float = 0.0) -> tuple[float, float, float, str]:
    """The worst tensor of `got` against `expected`, each on its own scale: the largest
    absolute error, the largest relative error max|a - b| / max(max|b|, TINY), the tolerance
    of the coarsest dtype, and the name of the tensor with that relative error ("" if none).
    The tensors of the parameters in `pooled` (and their state) are on their kind's scale.
    A `limit` (a 16-bit run's, `sixteen_bit_tolerance`) replaces the dtypes' tolerances.

    Example:
        >>> tensor_errors({"w": np.float32([1, 2]), "v": np.float32([1e-6, 0])}, {"w": np.float32([1, 2]), "v": np.float32([1.15e-6, 0])})
        (1.500000053056283e-07, 0.13043478690687477, 0.0003, 'v')
    """
    absolute = relative = 0.0
    tolerance, worst = 1e-10, ""
    scales = _scales(expected, pooled)
    for name, reference in expected.items():
        reference = np.asarray(reference)
        difference = float(np.max(np.abs(np.asarray(got[name], np.float64) - reference), initial=0.0))
        scale = scales[name]
        error = difference / scale
        if not np.isfinite(error):  # a NaN or infinity (an fp16 overflow, say) is never within a limit
            difference = error = np.inf
        absolute = max(absolute, difference)
        if error > relative or not worst:
            relative, worst = max(relative, error), name
        tolerance = max(tolerance, TOLERANCE.get(reference.dtype.name, 0.0))
    return absolute, relative, limit or tolerance, worst


def reference_line(library: str, worst: str, relative: float, tolerance: float) -> str:
    """The report's line on the reference.

    Example:
        >>> reference_line("JAX 0.4 on CPU", "dense1.weight", 3.1e-07, 1e-05)
        'reference: JAX 0.4 on CPU; worst tensor dense1.weight 3.1e-07 (limit 1e-05)'
    """
    return f"reference: {library}; worst tensor {worst or '(none)'} {relative:.2g} (limit {tolerance:g})"


__all__ = ["OWN_KERNELS", "Reference", "reference_line", "reference_run", "sixteen_bit_tolerance", "tensor_errors"]
