"""The JAX reference of a 16-bit training step: Megatron-LM's mixed precision, written from its
recipe, never through autostrat's kernels or its precision bookkeeping (`search.precision`).

The recipe (Micikevicius et al. 2018, "Mixed Precision Training"; Megatron-LM's distributed
optimizer): the model's parameters are 16-bit copies of fp32 main parameters (at the start,
the fp32 initial values rounded to 16 bits, the main copies their exact widening); the
batch's floats enter in 16 bits; every forward op computes in float64 here (in fp32 on a GPU:
either is far finer than 16 bits) and rounds its floating result to 16 bits. Gradients are
`jax.value_and_grad` through those roundings, so each backward op's result is rounded too,
with one difference by precision: under fp16 the gradient of a parameter is the gradient of
its fp16 copy (fp16, as Megatron's fp16 gradient buffers), under bf16 that of its copy widened
first (an unrounded gradient: Megatron's bf16 GEMMs accumulate the weight gradient in fp32).
A static loss scale S multiplies the summed loss before differentiating (so every 16-bit
gradient is S times larger) and divides the gradients after. The optimiser steps the main
copies with fp32 state as `reference_jax` writes the updates out; each next 16-bit parameter
is its new main copy rounded.

The final state compared has each trained parameter twice: its 16-bit copy (under its own
name, widened to float32) and its main copy (`search.precision.main_name`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from autostrat.autodiff import UPDATE_OP_TYPES, op_phase
from autostrat.runtime.reference_jax import _COMPILER_OPTIONS, FORWARD, _float64, _update, check_translatable, forward_outputs
from autostrat.search.precision import main_name

HALF = {"fp16": jnp.float16, "bf16": jnp.bfloat16}
_compiled: dict = {}


def _floating(array) -> bool:
    return jnp.issubdtype(array.dtype, jnp.floating)


def _mixed_forward(graph, env: dict, half) -> dict:
    """Every forward op on float64 widenings of its inputs, its floating result rounded to `half`."""
    env = dict(env)
    for op in graph.ops.values():
        if op_phase(op.name) == "forward":
            inputs = [x.astype(jnp.float64) if _floating(x) else x for x in (env[name] for name in op.inputs)]
            results = forward_outputs(op, FORWARD[op.op_type](*inputs, **op.attr_dict))
            env |= {name: result.astype(half) if _floating(result) else result for name, result in results.items()}
    return env


def mixed_step(graph, values: dict, precision: str, loss_scale: float = 1.0) -> tuple[dict, dict, dict]:
    """One mixed-precision step of `graph` from `values` (main parameters and state in
    float64, the batch and constants): outputs, gradients by parameter (widened) and the next
    main parameters and state."""
    half = HALF[precision]
    trainable = [op.inputs[0] for op in graph.ops.values() if op.op_type in UPDATE_OP_TYPES]
    state = {name for name, _ in graph.updates} - set(trainable)
    fixed = {}
    for name, array in values.items():  # batch floats and untrained parameters enter in 16 bits
        kind = graph.tensors[name].kind if name in graph.tensors else "constant"
        sixteen = kind in ("input", "parameter") and name not in state and name not in trainable and _floating(array)
        fixed[name] = array.astype(half) if sixteen else array
    copies = {name: values[name].astype(half) for name in trainable}
    if precision == "bf16":  # the gradient of the widened copy: accumulated unrounded (see the module docstring)
        copies = {name: copy.astype(jnp.float64) for name, copy in copies.items()}

    def loss(parameters):
        env = _mixed_forward(graph, {k: v for k, v in fixed.items() if k not in trainable} | parameters, half)
        return jnp.sum(env[graph.outputs[0]].astype(jnp.float64)) * loss_scale, env

    (_, env), gradients = jax.value_and_grad(loss, has_aux=True)(copies)
    gradients = {name: g.astype(jnp.float64) / loss_scale for name, g in gradients.items()}
    return {name: env[name] for name in graph.outputs}, gradients, _update(graph, values, gradients)


def mixed_run(graph, values: dict, batches, precision: str, loss_scale: float = 1.0) -> tuple[tuple[dict, ...], tuple[dict, ...], dict]:
    """`reference_jax.jax_run` in `precision` (fp16 or bf16): every batch's outputs and
    gradients, and the final 16-bit parameters, main parameters and state, as float32 arrays
    (integers as they are).

    Example (two bf16 SGD steps of the tutorial FFN: the 16-bit copy is its main copy rounded,
    once, from float64; the main copy returned is float32, so rounding it again may go the
    other way only where it lies exactly halfway between two bf16 values, the copy as near):
        >>> from autostrat.autodiff import SGD
        >>> from autostrat.frontend.train import synthetic_batches
        >>> from autostrat.models import tutorial_plan
        >>> from autostrat.runtime.executor import graph_values
        >>> graph = tutorial_plan(optimizer=SGD()).graph
        >>> _, _, final = mixed_run(graph, graph_values(graph, {}), synthetic_batches(graph, 2), "bf16")
        >>> copy, main = final["dense1.weight"], final["dense1.weight>main"]
        >>> rounded = main.astype(jnp.bfloat16).astype(np.float32)
        >>> bool(np.all((copy == rounded) | (np.abs(copy - main) == np.abs(rounded - main)))), bool(np.any(copy != main))
        (True, True)
    """
    check_translatable(graph)
    half = HALF[precision]
    trainable = [op.inputs[0] for op in graph.ops.values() if op.op_type in UPDATE_OP_TYPES]
    state = {name: _float64(array) for name, array in values.items()}
    for name in trainable:  # the main copies start as the 16-bit model's parameters
        state[name] = np.asarray(state[name]).astype(half).astype(np.float64)
    step = _compiled_step(graph, precision, loss_scale)
    outputs, gradients = [], []
    for batch in batches:
        step_outputs, step_gradients, updated = step(state | {k: _float64(v) for k, v in batch.items()})
        state.update(updated)
        outputs.append(_float32(step_outputs))
        gradients.append(_float32(step_gradients))
    final = {name: state[name] for name, _ in graph.updates}
    final |= {main_name(name): state[name] for name in trainable}
    final |= {name: np.asarray(state[name]).astype(half) for name in trainable}
    return tuple(outputs), tuple(gradients), _float32(final)


def _compiled_step(graph, precision: str, loss_scale: float):
    """`mixed_step` under `jax.jit`, compiled once per graph (kept alive with it), precision and scale."""
    key = (id(graph), precision, loss_scale)
    if key not in _compiled or _compiled[key][0] is not graph:
        _compiled[key] = (graph, jax.jit(lambda arrays: mixed_step(graph, arrays, precision, loss_scale),
                                         compiler_options=_COMPILER_OPTIONS))
    return _compiled[key][1]


def _float32(arrays: dict) -> dict:
    """Floating arrays as float32 (16-bit values exactly), others as they are."""
    converted = {}
    for name, array in arrays.items():
        array = np.asarray(array)
        converted[name] = array.astype(np.float32) if array.dtype.kind in "fV" else array
    return converted
