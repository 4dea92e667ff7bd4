"""Shared helpers of the oracle tests: random inputs for an op example, and a run of one
strategy on simulated ranks (slice, run the kernel per rank, combine partials, assemble)."""

from __future__ import annotations

import numpy as np

from autostrat.layout import Strategy, assemble_tensor, split_tensor
from autostrat.rules import Example
from autostrat.runtime.kernels import run_kernel
from autostrat.runtime.local import LocalCluster
from autostrat.runtime.ring import Ring, run_ring_kernel


def random_inputs(example: Example, rng: np.random.Generator) -> list[np.ndarray]:
    inputs = []
    for index, shape in enumerate(example.shapes):
        if index in example.integers:
            inputs.append(rng.integers(0, example.integers[index], size=shape))
        elif example.positive:
            inputs.append(rng.uniform(0.5, 2.0, size=shape))
        else:
            inputs.append(rng.standard_normal(shape))
    return inputs


def run_sliced(strategy: Strategy, inputs, attrs) -> tuple[np.ndarray, ...]:
    """The op's outputs computed rank by rank under `strategy`, then assembled; a ring
    strategy's ranks run as `LocalCluster` threads, passing blocks around their rings."""
    per_input = [split_tensor(array, layout) for array, layout in zip(inputs, strategy.input_layouts)]
    if strategy.ring:
        def rank_run(backend):
            ring = Ring(backend, strategy.ring_group(backend.rank))
            return run_ring_kernel(strategy.rule.op_type, [pieces[backend.rank] for pieces in per_input], attrs,
                                   strategy.slice_context(backend.rank), ring)
        per_rank = LocalCluster(strategy.device_num).run(rank_run)
    else:
        per_rank = [
            run_kernel(strategy.rule.op_type, [pieces[rank] for pieces in per_input], attrs, strategy.slice_context(rank))
            for rank in range(strategy.device_num)
        ]
    return tuple(
        assemble_tensor([outputs[index] for outputs in per_rank], layout, check_replicas=True)
        for index, layout in enumerate(strategy.output_layouts)
    )
