"""A 16-bit run's kernels: fp32 arithmetic on 16-bit slices, results rounded to the dtype held.

Under precision fp16 or bf16 (`search.precision`) a rank holds parameters, activations and
most gradients in 16 bits (bf16 through `ml_dtypes`, fp16 as numpy's float16), and moves them
so. Each kernel widens its 16-bit inputs to float32, computes in float32 and rounds every
result to the dtype its tensor is held in (`Compute.dtypes`), as tensor cores accumulate a
16-bit GEMM in fp32 and PyTorch's elementwise kernels compute 16-bit tensors in fp32: rounding
happens once per op output. The widened copies are the kernel's temporaries (a GPU reads the
16-bit operands), not buffers of the rank (`executor`).

An update op (Megatron-LM's distributed optimizer) steps the fp32 main copy of its parameter
(``Compute.main[0]``) with the fp32 optimiser state and an fp32 gradient (fp16: the fp16
gradient copied into the fp32 main gradient ``main[1]``, kept from step to step as Megatron
keeps it; bf16 keeps its gradient in fp32 already), divided by the static loss scale (the
backward started from the loss's gradient times it), writes the new main copy over the old one,
and its parameter output is that copy rounded to 16 bits: the working copy the next forward reads.
"""

from __future__ import annotations

import numpy as np

from autostrat.runtime.kernels import run_kernel

SIXTEEN_BIT = ("bfloat16", "float16")  # dtype names: numpy knows bfloat16 once ml_dtypes is imported


def numpy_dtype(name: str) -> np.dtype:
    """numpy's dtype `name`, ml_dtypes' bfloat16 included: ml_dtypes is imported (it registers
    bfloat16 with numpy) only when a run holds bf16, as its import takes 0.6 CPU-s that every
    fp32 rank process would otherwise pay.

    Example:
        >>> numpy_dtype("bfloat16").itemsize, numpy_dtype("float32").name
        (2, 'float32')
    """
    if name == "bfloat16":
        import ml_dtypes  # noqa: F401
    return np.dtype(name)


def widened(array: np.ndarray) -> np.ndarray:
    """`array` in float32 if it is held in 16 bits, else itself.

    Example:
        >>> widened(np.ones(2, numpy_dtype("bfloat16"))).dtype, widened(np.ones(2, np.int32)).dtype
        (dtype('float32'), dtype('int32'))
    """
    return array.astype(np.float32) if array.dtype.name in SIXTEEN_BIT else array


def rounded(array: np.ndarray, dtype: str) -> np.ndarray:
    """`array` in `dtype` (round to nearest even), itself when it has that dtype or `dtype` is "".

    Example:
        >>> rounded(np.float32([1 + 2**-9]), "bfloat16").astype(np.float32).tolist()
        [1.0]
    """
    if not dtype or array.dtype.name == dtype:
        return array
    with np.errstate(over="ignore"):  # beyond the dtype's range is its infinity, as a device rounds (a -1e9 mask in fp16)
        return array.astype(numpy_dtype(dtype))


def run_sixteen_bit(instruction, inputs: list, store: dict, loss_scale: float = 1.0) -> tuple[np.ndarray, ...]:
    """The results of a 16-bit run's `Compute` instruction on its `inputs` (see the module
    docstring); an update's fp32 main copy in `store` is rewritten in place.

    Example (a bf16 MatMul: 1 + 2^-8 + 2^-8 summed in fp32 and rounded once; summed in bf16,
    each 1 + 2^-8 would round back to 1):
        >>> from autostrat.runtime.instructions import Compute
        >>> matmul = Compute("m", "MatMul", ("a", "b"), ("c",), (), None, ("bfloat16",))
        >>> bf16 = numpy_dtype("bfloat16")
        >>> a = np.array([[1, 2**-8, 2**-8]], bf16)
        >>> [c] = run_sixteen_bit(matmul, [a, np.ones((3, 1), bf16)], {})
        >>> c.dtype.name, float(c[0, 0])
        ('bfloat16', 1.0078125)
    """
    arrays = [widened(np.asarray(array)) for array in inputs]
    if instruction.main:
        arrays[0] = store[instruction.main[0]]
    if len(instruction.main) > 1:
        np.copyto(store[instruction.main[1]], inputs[-1])  # fp16 gradient -> fp32 main gradient
        arrays[-1] = store[instruction.main[1]]
    if instruction.main and loss_scale != 1:
        arrays[-1] = _unscaled(arrays[-1], loss_scale, len(instruction.main) > 1)
    results = run_kernel(instruction.op_type, arrays, dict(instruction.attrs), instruction.context)
    if instruction.main:
        np.copyto(store[instruction.main[0]], results[0])  # the step's new main copy, in the old one's buffer
    return tuple(rounded(result, dtype) for result, dtype in zip(results, instruction.dtypes))


def _unscaled(gradient: np.ndarray, loss_scale: float, own: bool) -> np.ndarray:
    """The fp32 gradient divided by the loss scale: in its buffer when it is the rank's main
    gradient (`own`), else a kernel temporary (an fp32 gradient other ops may still read)."""
    if own:
        gradient *= np.float32(1 / loss_scale)
        return gradient
    return gradient * np.float32(1 / loss_scale)
