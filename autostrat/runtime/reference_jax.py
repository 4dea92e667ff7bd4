"""The single-device graph translated to JAX: the stand-alone reference no autostrat code computes.

Only the graph's forward ops are translated, each from the documented semantics of its
MindSpore primitive to `jax.numpy` / `jax.nn` / `jax.lax` (never through autostrat's kernels).
A training graph's gradients are `jax.value_and_grad` of the forward loss (the sum of the
graph's first output, as autostrat seeds its backward with ones), not a translation of its
backward ops; its optimiser updates are written out below as MindSpore's ``ApplyGradientDescent``,
``ApplyMomentum`` and ``nn.Adam`` compute them, with the update ops' attributes.

Everything runs in float64 (JAX's x64 mode, set on import: this module is imported only to
check a run), so that the reference's own rounding is far below the float32 run it checks;
results are cast back to each tensor's dtype. A run's step is jit-compiled once (one XLA
compilation per graph): op-by-op dispatch compiles every primitive of the forward and its
gradient apart, which took longer than the whole step's compilation on the GPT configs. The
compiled step is kept for the next run of a graph with the same ops (`STEPS`): a process that
checks many runs of one model (the test suite) compiles it once.

Importing this module imports JAX (about a second): `runtime.reference` imports it only when a
check needs it, never on the search's path.
"""

from __future__ import annotations

import math
import warnings
from collections import OrderedDict

import jax
import jax.numpy as jnp
import numpy as np

from autostrat.autodiff import UPDATE_OP_TYPES, op_phase

jax.config.update("jax_enable_x64", True)
jax.config.update("jax_platforms", "cpu")
# JAX warns at every fork of its (multithreaded) process; autostrat forks only to exec another
# program at once (subprocess: mpiexec, ssh), never to run on with JAX in the child.
warnings.filterwarnings("ignore", message=r"os\.fork\(\) was called", category=RuntimeWarning)

LIBRARY = f"JAX {jax.__version__} on CPU"
STEPS = 32  # compiled steps kept, the most recently used (each holds its XLA executables)
_compiled: OrderedDict = OrderedDict()
# A reference step runs once or twice per compilation: LLVM's optimisations cost more than they
# save. With the numpy inputs below, the gpt_train config's reference went 3.94 -> 3.36 CPU-s,
# JAX's import included (median of 3, benchmarks/reference_cost.py). XLA still fuses; the
# arithmetic is the same float64, only its machine code is less tuned.
_COMPILER_OPTIONS = {"xla_backend_optimization_level": 0}


class Untranslatable(Exception):
    """An op (or update) of the graph that this module has no JAX translation of."""


def _axes(axis, rank: int) -> tuple[int, ...]:
    if axis is None or axis == ():
        return tuple(range(rank))
    return tuple(sorted(a % rank for a in ((axis,) if isinstance(axis, int) else axis)))


def _matmul(a, b, transpose_a=False, transpose_b=False):
    a = jnp.swapaxes(a, -1, -2) if transpose_a else a
    b = jnp.swapaxes(b, -1, -2) if transpose_b else b
    return jnp.matmul(a, b)


def _bias_add(x, bias, data_format="NCHW"):
    channel = x.ndim - 1 if data_format == "NHWC" else 1
    return x + jnp.reshape(bias, tuple(-1 if d == channel else 1 for d in range(x.ndim)))


def _layer_norm(x, gamma, beta, begin_norm_axis=-1, begin_params_axis=-1, epsilon=1e-7):
    axes = tuple(range(begin_norm_axis % x.ndim, x.ndim))
    mean = jnp.mean(x, axis=axes, keepdims=True)
    variance = jnp.mean(jnp.square(x - mean), axis=axes, keepdims=True)
    return (x - mean) * jax.lax.rsqrt(variance + epsilon) * gamma + beta


def _rms_norm(x, gamma, epsilon=1e-6):
    """MindSpore's RmsNorm: x * rsqrt(mean(x^2) + epsilon) * gamma over gamma's dims."""
    axes = tuple(range(x.ndim - gamma.ndim, x.ndim))
    return x * jax.lax.rsqrt(jnp.mean(jnp.square(x), axis=axes, keepdims=True) + epsilon) * gamma


def _rotary_position_embedding(x, cos, sin, mode=0):
    """MindSpore's rotary_position_embedding, mode 0 (rotate_half, GPT-NeoX style)."""
    half = x.shape[-1] // 2
    rotated = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * cos + rotated * sin


def _flash_attention_score(query, key, value, head_num=None, keep_prob=1.0, scale_value=1.0, pre_tokens=None,
                           next_tokens=None, inner_precise=0, input_layout="BNSD", sparse_mode=0):
    """MindSpore's FlashAttentionScore, BNSD: softmax(query key^T * scale_value + mask) value, the
    mask (sparse_mode 2, leftUpCausal) hiding key j from query row i when j > i."""
    scores = jnp.einsum("bnsd,bntd->bnst", query, key) * scale_value
    if sparse_mode == 2:
        visible = jnp.tril(jnp.ones(scores.shape[-2:], dtype=bool))
        scores = jnp.where(visible, scores, -jnp.inf)
    return jnp.einsum("bnst,bntd->bnsd", jax.nn.softmax(scores, axis=-1), value)


def _moe_routing(logits, top_k, capacity, gate, norm_topk_prob):
    """(dispatch mask, combine weights) [g, s, e, c] of GShard's routing: top_k experts per
    token, buffer positions by one running count over the group's choices ordered choice rank
    first, token second, positions from `capacity` on dropped."""
    groups, tokens, experts = logits.shape
    scores = jax.nn.softmax(logits, axis=-1) if gate == "softmax" else jax.nn.sigmoid(logits)
    weights, choices = jax.lax.top_k(scores, top_k)
    if norm_topk_prob:
        weights = weights / jnp.sum(weights, axis=-1, keepdims=True)
    hot = jax.nn.one_hot(choices, experts, dtype=jnp.int32)  # [g, s, k, e]
    by_rank = jnp.swapaxes(hot, 1, 2).reshape(groups, top_k * tokens, experts)
    position = jnp.swapaxes((jnp.cumsum(by_rank, axis=1) - 1).reshape(groups, top_k, tokens, experts), 1, 2)
    slot = jax.nn.one_hot(jnp.where(hot == 1, position, -1), capacity, dtype=logits.dtype)  # -1 and >= capacity: none
    return jnp.sum(slot, axis=2), jnp.einsum("gsk,gskec->gsec", weights, slot)


def _one_hot(indices, depth=2, on_value=1.0, off_value=0.0, axis=-1):
    hot = jax.nn.one_hot(indices, depth, axis=axis, dtype=jnp.float64)
    return hot * (on_value - off_value) + off_value


def _softmax_cross_entropy(logits, labels):
    return -jnp.sum(labels * jax.nn.log_softmax(logits, axis=-1), axis=-1)


def _pair(value) -> tuple[int, int]:
    """MindSpore's stride, dilation: an int, (h, w) or (1, 1, h, w)."""
    return (value, value) if isinstance(value, int) else tuple(value)[-2:]


def _conv2d(x, w, out_channel=None, kernel_size=None, pad_mode="valid", pad=0, stride=1, dilation=1, group=1,
            data_format="NCHW"):
    if pad_mode == "pad":
        top, bottom, left, right = (pad,) * 4 if isinstance(pad, int) else pad
        padding = ((top, bottom), (left, right))
    else:  # MindSpore's "same" puts the odd padding row after, as XLA's SAME does
        padding = pad_mode.upper()
    return jax.lax.conv_general_dilated(x, w, _pair(stride), padding, rhs_dilation=_pair(dilation),
                                        dimension_numbers=("NCHW", "OIHW", "NCHW"), feature_group_count=group)


def _squeeze(x, axis=()):
    return jnp.squeeze(x, axis=tuple(i for i, n in enumerate(x.shape) if n == 1) if axis in ((), None) else axis)


def _broadcast_to(x, shape=()):
    shape = tuple(shape)
    rank = len(shape)
    return jnp.broadcast_to(x, tuple(x.shape[d - rank + x.ndim] if size == -1 else size for d, size in enumerate(shape)))


def _slice(x, begin=(), size=()):
    return x[tuple(slice(b, n if s == -1 else b + s) for b, s, n in zip(begin, size, x.shape))]


def _gelu(x):
    return 0.5 * x * (1 + jax.scipy.special.erf(x / math.sqrt(2)))


def _reduce(fn):
    return lambda x, axis=(), keep_dims=False: fn(x, axis=_axes(axis, x.ndim), keepdims=keep_dims)


def _dropout(x, keep_prob=0.5, seed=0):
    """MindSpore's Dropout as autostrat defines its mask (`rules.elementwise`): element i kept
    where splitmix64(i + the seed's offset), its top 53 bits as a fraction, is below keep_prob;
    written here from the published splitmix64 (Steele et al. 2014), not autostrat's kernel."""
    offset = (seed * 0x9E3779B97F4A7C15 + 0x632BE59BD9B4E019) % 2**64
    z = jnp.arange(x.size, dtype=jnp.uint64).reshape(x.shape) + jnp.uint64(offset)
    for shift, multiplier in ((30, 0xBF58476D1CE4E5B9), (27, 0x94D049BB133111EB)):
        z = (z ^ (z >> jnp.uint64(shift))) * jnp.uint64(multiplier)
    z = z ^ (z >> jnp.uint64(31))
    keep = (z >> jnp.uint64(11)).astype(jnp.float64) / 2.0**53 < keep_prob
    return jnp.where(keep, x / keep_prob, 0), keep


FORWARD = {
    "Add": jnp.add, "Sub": jnp.subtract, "Mul": jnp.multiply, "RealDiv": jnp.divide,
    "Maximum": jnp.maximum, "Minimum": jnp.minimum,
    "Exp": jnp.exp, "Log": jnp.log, "Neg": jnp.negative, "Sqrt": jnp.sqrt, "Tanh": jnp.tanh,
    "ReLU": jax.nn.relu, "Sigmoid": jax.nn.sigmoid, "SiLU": jax.nn.silu, "GeLU": _gelu, "Identity": lambda x: x,
    "Cast": lambda x, dtype="float32": x if np.dtype(dtype).kind == "f" else x.astype(dtype),  # floats stay float64
    "MatMul": _matmul, "BatchMatMul": _matmul, "BiasAdd": _bias_add,
    "LayerNorm": _layer_norm, "RmsNorm": _rms_norm, "RotaryPositionEmbedding": _rotary_position_embedding,
    "Conv2D": _conv2d, "FlashAttentionScore": _flash_attention_score,
    "Gather": lambda params, indices, axis=0: jnp.take(params, indices, axis=axis),
    "OneHot": _one_hot, "SoftmaxCrossEntropyWithLogits": _softmax_cross_entropy,
    "ReduceSum": _reduce(jnp.sum), "ReduceMax": _reduce(jnp.max), "ReduceMean": _reduce(jnp.mean),
    "Softmax": lambda x, axis=-1: jax.nn.softmax(x, axis=axis),
    "LogSoftmax": lambda x, axis=-1: jax.nn.log_softmax(x, axis=axis),
    "Reshape": lambda x, shape=(): jnp.reshape(x, tuple(shape)),
    "Transpose": lambda x, perm=(): jnp.transpose(x, perm),
    "ExpandDims": lambda x, axis=0: jnp.expand_dims(x, axis),
    "Dropout": _dropout, "Squeeze": _squeeze, "Concat": lambda *xs, axis=0: jnp.concatenate(xs, axis=axis),
    "BroadcastTo": _broadcast_to, "Slice": _slice,
    "Einsum": lambda *operands, equation="": jnp.einsum(equation, *operands),
    "MoeDispatchMask": lambda logits, top_k=2, capacity=1, gate="softmax", norm_topk_prob=False:
        _moe_routing(logits, top_k, capacity, gate, norm_topk_prob)[0],
    "MoeCombineWeights": lambda logits, top_k=2, capacity=1, gate="softmax", norm_topk_prob=False:
        _moe_routing(logits, top_k, capacity, gate, norm_topk_prob)[1],
}


MULTI_OUTPUT = {"Dropout": 2}  # the translations that return a tuple: output and mask


def forward_outputs(op, result) -> dict:
    """Output name -> value of a translated forward op's `result` (a tuple for `MULTI_OUTPUT`)."""
    return dict(zip(op.outputs, result if op.op_type in MULTI_OUTPUT else (result,)))


def check_translatable(graph) -> None:
    """Raise `Untranslatable` naming the first forward op without a JAX translation, or an
    update this module does not write out.

    Example:
        >>> from autostrat.autodiff import Adam
        >>> from autostrat.models import tutorial_plan
        >>> check_translatable(tutorial_plan(optimizer=Adam()).graph)
    """
    for op in graph.ops.values():  # backward ops and the rest of the update are not translated: see the module docstring
        phase = op_phase(op.name)
        if phase == "forward" and op.op_type not in FORWARD:
            raise Untranslatable(f"op {op.name} ({op.op_type})")
        if phase == "forward" and len(op.outputs) != MULTI_OUTPUT.get(op.op_type, 1):
            raise Untranslatable(f"op {op.name} ({op.op_type}) with {len(op.outputs)} outputs")
    updated = set(_updaters(graph))
    for state, _ in graph.updates:
        if state not in updated:
            raise Untranslatable(f"the update of {state}")


def _forward(graph, env: dict) -> dict:
    """Every forward op on `env` (tensor name -> jax array); returns env with their outputs."""
    env = dict(env)
    for op in graph.ops.values():
        if op_phase(op.name) == "forward":
            inputs = [env[name] for name in op.inputs]
            env |= forward_outputs(op, FORWARD[op.op_type](*inputs, **op.attr_dict))
    return env


def _updaters(graph) -> dict:
    """State name -> (update op, which output of the written-out update gives its next value)."""
    found = {}
    for op in graph.ops.values():
        if op.op_type in UPDATE_OP_TYPES:
            states = {"ApplyGradientDescent": 1, "ApplyMomentum": 2, "ApplyAdam": 3}[op.op_type]
            found.update({op.inputs[index]: (op, index) for index in range(states)})
            if op.op_type == "ApplyAdam":
                found.update({"beta1_power": (op, "beta1"), "beta2_power": (op, "beta2")})
    return found


def _summed(gradient, attrs: dict):
    """MindSpore's gradient sum over a parameter's replicas without ``gradients_mean``."""
    return gradient if attrs.get("gradients_mean", True) else gradient * attrs.get("replicas", 1)


def _sgd(p, g, attrs: dict):
    return (p - attrs["learning_rate"] * g,)


def _momentum(p, v, g, attrs: dict):
    """``ApplyMomentum``: v = momentum * v + g; p -= lr * v (Nesterov: p -= lr * (g + momentum * v))."""
    mu, lr = attrs["momentum"], attrs["learning_rate"]
    v = mu * v + g
    return p - lr * (g + mu * v if attrs.get("use_nesterov") else v), v


def _adam(p, m, v, g, powers: tuple, rate: float, attrs: dict):
    """``nn.Adam``: the powers are multiplied by beta first, then
    m += (1 - beta1)(g - m); v += (1 - beta2)(g² - v); p -= lr·sqrt(1 - beta2^t)/(1 - beta1^t)·m/(sqrt(v) + eps)."""
    beta1, beta2 = attrs.get("beta1", 0.9), attrs.get("beta2", 0.999)
    m = m + (1 - beta1) * (g - m)
    v = v + (1 - beta2) * (g * g - v)
    step = rate * jnp.sqrt(1 - powers[1]) / (1 - powers[0])
    return p - step * m / (jnp.sqrt(v) + attrs.get("epsilon", 1e-8)), m, v


def _update(graph, state: dict, gradients: dict) -> dict:
    """The next value of every state the graph updates."""
    new = {}
    for op in graph.ops.values():
        if op.op_type not in UPDATE_OP_TYPES:
            continue
        attrs, p = op.attr_dict, op.inputs[0]
        g = _summed(gradients[p], attrs)
        if op.op_type == "ApplyGradientDescent":
            results = _sgd(state[p], g, attrs)
        elif op.op_type == "ApplyMomentum":
            results = _momentum(state[p], state[op.inputs[1]], g, attrs)
        else:
            powers = (state["beta1_power"] * attrs.get("beta1", 0.9), state["beta2_power"] * attrs.get("beta2", 0.999))
            rate = state["optimizer/learning_rate"]
            results = _adam(state[p], state[op.inputs[1]], state[op.inputs[2]], g, powers, rate, attrs)
            new.update(beta1_power=powers[0], beta2_power=powers[1])
        new.update(zip(op.inputs, results))
    return {name: new[name] for name, _ in graph.updates}


def _float64(array):
    """`array` as numpy, in float64 if floating. The jitted step takes numpy arrays as they
    are, where `jnp.asarray` compiled a copy per distinct shape first (11 compilations for
    the pipeline sample)."""
    array = np.asarray(array)
    return array.astype(np.float64) if array.dtype.kind == "f" else array


def jax_step(graph, values: dict) -> tuple[dict, dict, dict]:
    """One step of `graph` in JAX on float64 arrays: its outputs, the gradient of every
    trainable parameter (by parameter name) and the next value of every updated state.

    Example (the tutorial FFN's training graph with SGD: the loss and one gradient):
        >>> from autostrat.autodiff import SGD
        >>> from autostrat.frontend.train import synthetic_batches
        >>> from autostrat.models import tutorial_plan
        >>> from autostrat.runtime.executor import graph_values
        >>> graph = tutorial_plan(optimizer=SGD()).graph
        >>> values = graph_values(graph, {}) | synthetic_batches(graph, 1)[0]
        >>> outputs, gradients, _ = jax_step(graph, {k: _float64(v) for k, v in values.items()})
        >>> sorted(gradients)[:2], gradients["dense1.weight"].shape
        (['dense1.bias', 'dense1.weight'], (64, 64))
    """
    trainable = [op.inputs[0] for op in graph.ops.values() if op.op_type in UPDATE_OP_TYPES]
    fixed = {name: array for name, array in values.items() if name not in trainable}

    def loss(parameters):
        env = _forward(graph, fixed | parameters)
        return jnp.sum(env[graph.outputs[0]]), env

    if not trainable:
        env = _forward(graph, values)
        return {name: env[name] for name in graph.outputs}, {}, {}
    (_, env), gradients = jax.value_and_grad(loss, has_aux=True)({name: values[name] for name in trainable})
    return {name: env[name] for name in graph.outputs}, gradients, _update(graph, values, gradients)


def jax_run(graph, values: dict, batches) -> tuple[tuple[dict, ...], tuple[dict, ...], dict]:
    """Every batch's outputs and gradients, and the updated states after the last step, as
    numpy arrays of the graph's dtypes (`Untranslatable` before anything runs)."""
    check_translatable(graph)
    state = {name: _float64(array) for name, array in values.items()}
    outputs, gradients = [], []
    step = _compiled_step(graph)
    for batch in batches:
        step_outputs, step_gradients, updated = step(state | {k: _float64(v) for k, v in batch.items()})
        state.update(updated)
        outputs.append(_numpy(graph, step_outputs))
        gradients.append(_numpy(graph, step_gradients))
    return tuple(outputs), tuple(gradients), _numpy(graph, {name: state[name] for name, _ in graph.updates})


def _step_key(graph):
    """What `jax_step` reads of `graph`: every op's name (its phase), type, attributes and
    tensors, the outputs and the updates; None when an attribute cannot be a key (unhashable)."""
    key = (tuple((op.name, op.op_type, op.attrs, op.inputs, op.outputs) for op in graph.ops.values()),
           graph.outputs, graph.updates)
    try:
        hash(key)
    except TypeError:
        return None
    return key


def _compiled_step(graph):
    """`jax_step` of `graph` under `jax.jit`, the one compiled for an equal graph before if
    kept (jit compiles again for other shapes or dtypes of the arrays).

    Example:
        >>> from autostrat.autodiff import SGD
        >>> from autostrat.models import tutorial_plan
        >>> _compiled_step(tutorial_plan(optimizer=SGD()).graph) is _compiled_step(tutorial_plan(optimizer=SGD()).graph)
        True
    """
    key = _step_key(graph)
    if key is None:
        return jax.jit(lambda arrays: jax_step(graph, arrays), compiler_options=_COMPILER_OPTIONS)
    if key not in _compiled:
        _compiled[key] = jax.jit(lambda arrays: jax_step(graph, arrays), compiler_options=_COMPILER_OPTIONS)
        while len(_compiled) > STEPS:
            _compiled.popitem(last=False)
    _compiled.move_to_end(key)
    return _compiled[key]


def _numpy(graph, arrays: dict) -> dict:
    return {name: np.asarray(array).astype(graph.tensors[name].dtype) for name, array in arrays.items()}
