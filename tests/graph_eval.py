"""A single-device reference run of an ir graph with the numpy kernels (float64 by default),
for the gradient tests; the runtime's executor is what runs plans."""

from __future__ import annotations

import numpy as np

from autostrat.ir import Graph
from autostrat.runtime.kernels import run_kernel


def as_float64(array) -> np.ndarray:
    array = np.asarray(array)
    return array.astype(np.float64) if np.issubdtype(array.dtype, np.floating) else array


def evaluate(graph: Graph, feeds: dict) -> dict[str, np.ndarray]:
    """Every tensor's value: `feeds` first, then parameter and constant values, then each op."""
    values = {name: as_float64(value) for name, value in feeds.items()}
    for name, info in graph.tensors.items():
        if name not in values and info.kind in ("constant", "parameter"):
            values[name] = as_float64(graph.values[name].asnumpy())
    for op in graph.ops.values():
        outputs = run_kernel(op.op_type, [values[t] for t in op.inputs], op.attr_dict)
        values.update(zip(op.outputs, outputs))
    return values
