"""Training precision in the memory model: what a device keeps per trained parameter element.

With ``precision`` "fp16" or "bf16" a step keeps what Megatron-LM's distributed optimizer keeps
(its docs, "Distributed Optimizer"): the parameters in 16 bits, their gradients in 16 bits (fp16)
or in an fp32 buffer (bf16), and next to the Adam moments, split like them over the optimiser
shard (`optimizer_shard`), an fp32 main copy of each parameter and, with fp16, of its gradient.
Per element, sharded over d replicas: fp16 4 + 16/d bytes, bf16 6 + 12/d, fp32 8 + 8/d (Adam's
two fp32 moments are the graph's own state tensors, counted as before).

Activations (graph inputs and op outputs, the backward's too) count 2 bytes per element in
16 bits, in the search's memory model, the plan's buffers and the pipeline split's model alike.

Time is priced as Megatron-LM runs a 16-bit step (`TensorSizes.priced`, `TensorSizes.rate_dtypes`,
read by the search's cost tables, the plan's redistributions and the prediction alike): every
tensor moves and is read or written at the size the memory counts, so activations and their
gradients travel in 16 bits, a weight gradient's synchronisation in fp16 under fp16 (Megatron's
fp16 gradients) and in fp32 under bf16 (its fp32 gradient buffer, reduced in fp32); an op's
flops run at the profile's 16-bit peak (`Hardware.compute_nanoseconds`) unless one of the
tensors it computes from is kept in fp32 (the optimiser's state), the fp32 gradient buffer
excepted: Megatron's bf16 weight-gradient GEMMs read 16-bit operands and accumulate into it.
fp32 counts and prices every tensor at its dtype: every fp32 plan is the one it was.

Runs hold every tensor in the dtype its size says (`held_dtype`: the 16-bit one for 2 bytes,
float32 for bf16's 4-byte gradients), and keep the fp32 main copies (`main_name`; fp16's main
gradients, `main_gradient_name`) in the layout the memory counts them in (`runtime.program`,
`runtime.sixteen_bit`), so the bytes a run sends and the peak it holds are the ones priced here.
"""

from __future__ import annotations

from dataclasses import dataclass

from autostrat.autodiff import UPDATE_OP_TYPES
from autostrat.autodiff.optimizers import UPDATE_PREFIX
from autostrat.cost import dtype_size
from autostrat.errors import ConfigError

PRECISIONS = ("fp32", "fp16", "bf16")
# Per precision: bytes per element of a parameter, of its gradient, and of the fp32 copies kept
# beside its optimiser state (main parameter; with fp16 also main gradient).
_BYTES = {"fp32": (4, 4, 0), "fp16": (2, 2, 8), "bf16": (2, 4, 4)}
# What a plan's summary says its memory counts under a 16-bit precision.
PRECISION_MEMORY = ("parameters, gradients and fp32 main copies as Megatron's distributed optimizer keeps them, "
                    "activations in 16 bits; compute at the 16-bit peak, communication at the sizes kept")
# The dtype a 16-bit tensor is priced in: bf16 has float16's size and, on A100 and H100, its
# dense tensor-core peak (vendor datasheets), and numpy names float16 without ml_dtypes.
HALF = "float16"


def check_precision(precision) -> str:
    """`precision` if it is one of `PRECISIONS`, else a ConfigError naming them.

    Example:
        >>> check_precision("bf16")
        'bf16'
    """
    if precision not in PRECISIONS:
        raise ConfigError(f"precision must be one of {', '.join(PRECISIONS)}; got {precision!r}")
    return precision


ADAM_MOMENT_BYTES = 8  # Adam's two fp32 moments per element, split over the optimiser shard


def state_bytes(precision: str) -> tuple[int, int]:
    """Bytes per trained parameter element under Adam as Megatron's distributed optimizer table
    counts them: ``(kept on every replica, split over the d replicas of the optimiser shard)``,
    the parameter and its gradient, then the fp32 main copies and the two moments.

    Example (fp16 4 + 16/d, bf16 6 + 12/d, fp32 8 + 8/d):
        >>> [state_bytes(precision) for precision in ("fp16", "bf16", "fp32")]
        [(4, 16), (6, 12), (8, 8)]
    """
    parameter, gradient, main = _BYTES[check_precision(precision)]
    return parameter + gradient, main + ADAM_MOMENT_BYTES


@dataclass(frozen=True)
class TensorSizes:
    """Bytes per element of each tensor of a graph under a precision. In 16 bits: fp32
    parameters (and their updated values), graph inputs and op outputs take 2 bytes, except the
    gradients the updates read (2 in fp16, 4 in bf16: Megatron's fp32 gradient buffer) and
    what the optimiser's own ops compute; optimiser state, counters and constants keep their
    dtype's size, as every tensor does in fp32.

    Example (the tutorial FFN's Adam step in bf16: 16-bit weights and activations, fp32
    gradients and moments):
        >>> from autostrat.autodiff import Adam, build_training
        >>> from autostrat.frontend import trace
        >>> from autostrat.models import FFN
        >>> from autostrat.nn import Tensor
        >>> sizes = TensorSizes.of(build_training(trace(FFN(), Tensor(shape=(64, 64))), Adam()), "bf16")
        >>> sizes("dense1.weight"), sizes("dense1.matmul:0"), sizes("grad/dense1.weight"), sizes("moment1.dense1.weight")
        (2, 2, 4, 4)
    """

    dtypes: dict
    own: dict  # tensor -> bytes per element, for the trained parameters, their values and gradients
    parameters: frozenset  # the trained parameters (read first by an update op)
    gradients: frozenset  # their gradients (read last by it)
    main_bytes: int  # fp32 copies per trained parameter element, kept in its optimiser state's layout

    @classmethod
    def of(cls, graph, precision: str = "fp32") -> TensorSizes:
        """The sizes of `graph`'s tensors (a training graph with its update ops) in `precision`."""
        parameter, gradient, main = _BYTES[check_precision(precision)]
        updates = [op for op in graph.ops.values() if op.op_type in UPDATE_OP_TYPES]
        parameters = frozenset(op.inputs[0] for op in updates)
        gradients = frozenset(op.inputs[-1] for op in updates)  # every update op reads its gradient last
        own = {}
        if precision != "fp32":  # fp32 keeps every dtype's own size
            values = dict(graph.updates)
            state = set(values) - parameters  # optimiser state and counters: fp32, as their updates
            own = {name: parameter for name, info in graph.tensors.items() if info.dtype == "float32" and name not in state
                   and info.kind != "constant" and not (info.producer or "").startswith(UPDATE_PREFIX)}
            own |= dict.fromkeys(gradients, gradient) | dict.fromkeys((values[p] for p in parameters if p in values), parameter)
        return cls({name: info.dtype for name, info in graph.tensors.items()}, own, parameters, gradients, main)

    def __call__(self, tensor: str) -> int:
        return self.own.get(tensor) or dtype_size(self.dtypes[tensor])

    def priced(self, tensor: str) -> str:
        """The dtype `tensor` is moved and read in: its own in fp32, else its size's (module
        docstring): `HALF` for 2 bytes, float32 for 4.

        Example (bf16: an activation in 16 bits, a weight gradient in the fp32 buffer):
            >>> sizes = TensorSizes({"x": "float32", "g": "float32"}, {"x": 2, "g": 4}, frozenset(), frozenset({"g"}), 4)
            >>> sizes.priced("x"), sizes.priced("g")
            ('float16', 'float32')
        """
        return {2: HALF, 4: "float32"}.get(self.own.get(tensor), self.dtypes[tensor])

    def rate_dtypes(self, tensors) -> tuple[str, ...]:
        """The dtypes that set the FLOP rate of an op reading and writing `tensors`
        (`Hardware.compute_nanoseconds`): each priced, except a gradient a 16-bit plan keeps in
        fp32, which the 16-bit GEMM computing it only accumulates into (module docstring).

        Example (the bf16 weight-gradient GEMM runs at the 16-bit rate):
            >>> sizes = TensorSizes({"x": "float32", "g": "float32"}, {"x": 2, "g": 4}, frozenset(), frozenset({"g"}), 4)
            >>> sizes.rate_dtypes(["x", "g"])
            ('float16', 'float16')
        """
        return tuple(HALF if tensor in self.gradients and tensor in self.own else self.priced(tensor) for tensor in tensors)


# The numpy dtype each precision holds parameters, activations and 16-bit communication in
# (ml_dtypes registers "bfloat16" with numpy; numpy has float16 itself).
HELD = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}
MAIN_SUFFIX = ">main"  # the store key (and reference name) of a trained parameter's fp32 main copy


def main_name(parameter: str) -> str:
    """The name of `parameter`'s fp32 main copy in a 16-bit run and its reference.

    Example:
        >>> main_name("dense1.weight")
        'dense1.weight>main'
    """
    return parameter + MAIN_SUFFIX


def main_gradient_name(parameter: str) -> str:
    """The name of `parameter`'s fp32 main gradient in an fp16 run (Megatron-LM's copy of the
    fp16 gradient the fp32 step reads)."""
    return parameter + MAIN_SUFFIX + " gradient"


def held_dtype(sizes: TensorSizes, tensor: str, precision: str) -> str:
    """The dtype a run holds `tensor` in: the precision's 16-bit dtype where the memory counts
    2 bytes for it, float32 where a 16-bit plan keeps 4 (bf16's fp32 gradient buffer), else its
    own (fp32, integers, optimiser state).

    Example:
        >>> sizes = TensorSizes({"x": "float32", "g": "float32", "i": "int32"}, {"x": 2, "g": 4}, frozenset(), frozenset({"g"}), 4)
        >>> [held_dtype(sizes, name, "bf16") for name in ("x", "g", "i")]
        ['bfloat16', 'float32', 'int32']
    """
    return {2: HELD[precision], 4: "float32"}.get(sizes.own.get(tensor), sizes.dtypes[tensor])


def check_loss_scale(loss_scale, precision: str = "fp32") -> float:
    """`loss_scale` as a float if it is a finite number >= 1, and 1 unless `precision` is a 16-bit
    one (the fp32 runtime has no unscaling step); else a ConfigError naming the key.

    Example:
        >>> check_loss_scale(1024, "fp16")
        1024.0
        >>> check_loss_scale(8, "fp32")
        Traceback (most recent call last):
        ...
        autostrat.errors.ConfigError: loss_scale scales a 16-bit run's gradients (precision fp16 or bf16); got loss_scale 8 with precision 'fp32'
    """
    if isinstance(loss_scale, bool) or not isinstance(loss_scale, (int, float)) or not 1 <= loss_scale < float("inf"):
        raise ConfigError(f"loss_scale must be a finite number >= 1 (a power of two keeps the scaling exact); got {loss_scale!r}")
    if precision == "fp32" and loss_scale != 1:
        raise ConfigError(f"loss_scale scales a 16-bit run's gradients (precision fp16 or bf16); got loss_scale {loss_scale!r} "
                          f"with precision {precision!r}")
    return float(loss_scale)


def check_runnable(precision: str, where: str = "", pipeline: bool = False, loss_scale: float | None = None) -> None:
    """Refuse, before any rank starts, to run a plan in a precision the runtime does not execute
    that way: fp16 and bf16 run without pipeline stages (a stage program keeps no fp32 main copy);
    fp16 needs a `loss_scale` above 1 (None: not known here, the run checks it): unscaled, the
    small gradients of a model fall into float16's subnormals (below 6.1e-5), where they keep
    few bits (the tiny LLaMA's embedding gradients: its table 4 % off the reference after two
    steps). `where` (a config path, or "") opens the message.

    Example:
        >>> check_runnable("bf16")
        >>> check_runnable("bf16", "configs/gpt_pipeline.yaml", pipeline=True)
        Traceback (most recent call last):
        ...
        autostrat.errors.ConfigError: configs/gpt_pipeline.yaml: precision 'bf16' runs without pipeline stages (pipeline_stages 1); got pipeline stages: run it in precision fp32, or plan it without stages
    """
    check_precision(precision)
    prefix = f"{where}: " if where else ""
    if precision != "fp32" and pipeline:
        raise ConfigError(f"{prefix}precision {precision!r} runs without pipeline stages (pipeline_stages 1); got pipeline "
                          f"stages: run it in precision fp32, or plan it without stages")
    if precision == "fp16" and loss_scale is not None and loss_scale <= 1:
        raise ConfigError(f"{prefix}precision 'fp16' runs with a loss_scale above 1 (e.g. loss_scale: 1024), got loss_scale "
                          f"{loss_scale:g}: unscaled fp16 gradients lose their bits in float16's subnormals")


def check_fp32_loop(precision: str, where: str) -> None:
    """Refuse a 16-bit plan in a training loop that carries whole parameters from call to call
    (`where`: Model.train, the functional loop): it keeps no fp32 main copies between calls, and
    checks against the fp32 reference. `autostrat run` trains 16-bit plans.

    Example:
        >>> check_fp32_loop("fp16", "Model.train")
        Traceback (most recent call last):
        ...
        autostrat.errors.ConfigError: Model.train trains in precision fp32 only, got precision 'fp16' (its fp32 main copies are not carried between calls): train 16-bit plans with autostrat run
    """
    if precision != "fp32":
        raise ConfigError(f"{where} trains in precision fp32 only, got precision {precision!r} (its fp32 main copies are not "
                          f"carried between calls): train 16-bit plans with autostrat run")
