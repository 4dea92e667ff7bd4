"""Redistribution costs searched once per shape class (`planner.shape_class`) equal the search
on the caller's own shape, on random layout pairs at 8, 64 and 1024 devices."""

from __future__ import annotations

import math

import numpy as np
import pytest

from autostrat.errors import RedistributionError
from autostrat.layout import DeviceMatrix, Layout, TensorMap
from autostrat.redistribution import redistribution_cost
from autostrat.redistribution.memo import clear_memos
from autostrat.redistribution.planner import shape_class
from autostrat.redistribution.solving import solve_cost, solve_layouts
from autostrat.rules import make_rule
from autostrat.strategies import generate_strategies, split_values

# Dims divisible by every device count, by some, and by none (GPT-3's vocabulary, LLaMA's FFN).
SIZES = (24, 96, 128, 1024, 4096, 11008, 12288, 50257)


def _direct(src: Layout, dst: Layout) -> float:
    """The search on the layouts' own shape, as before shape classes."""
    try:
        return float(solve_layouts(src, dst, 4, None, solve_cost)[1][1])  # float32
    except RedistributionError:
        return math.inf


def _fast(src: Layout, dst: Layout) -> float:
    try:
        return float(redistribution_cost(src, dst))
    except RedistributionError:
        return math.inf


def _pairs(device_num: int, count: int, seed: int, values=None) -> list[tuple[Layout, Layout]]:
    """Producer outputs and consumer inputs of one tensor of a random shape: random MatMul
    candidates (split reductions give partial outputs) against Add's and MatMul's."""
    rng = np.random.default_rng(seed)
    pairs = []
    while len(pairs) < count:
        m, k, n, p = (int(rng.choice(SIZES)) for _ in range(4))
        producers = [s.output_layouts[0] for s in generate_strategies(make_rule("MatMul", [(m, k), (k, n)]), device_num, values=values)]
        consumers = [s.input_layouts[0] for op_type, shapes in (("Add", [(m, n), (m, n)]), ("MatMul", [(m, n), (n, p)]))
                     for s in generate_strategies(make_rule(op_type, shapes), device_num, values=values)]
        pairs.append((producers[rng.integers(len(producers))], consumers[rng.integers(len(consumers))]))
    return pairs


@pytest.mark.parametrize("device_num, values, count", [(8, None, 40), (64, None, 30), (1024, split_values((128, 8)), 20)],
                         ids=["8", "64", "1024-mesh"])
def test_costs_by_shape_class_equal_the_search_on_the_own_shape(device_num, values, count):
    pairs = _pairs(device_num, count, seed=device_num, values=values)
    classed = sum(shape_class(src, dst, 4) is not None for src, dst in pairs)
    assert classed >= count // 2  # most pairs take the fast path, so the comparison means something
    for src, dst in pairs:
        clear_memos()  # neither side reads the other's searches
        direct = _direct(src, dst)
        clear_memos()
        assert _fast(src, dst) == direct, f"{src} -> {dst}"


def test_a_shape_class_keeps_every_divisor_of_device_num_and_scales_exactly():
    rows = Layout(DeviceMatrix((2, 4)), TensorMap((1, -1)), (96, 50257))
    whole = Layout(DeviceMatrix((2, 4)), TensorMap((-1, -1)), (96, 50257))
    small_rows, small_whole, itemsize, numerator, denominator = shape_class(rows, whole, 4)
    assert small_rows.shape == small_whole.shape == (8, 1)  # gcd(96, 8), gcd(50257, 8)
    assert (itemsize, numerator, denominator) == (32, 96 * 50257, 8 * 8)
    # The 2-axis splits the rows: an AllGather of the other half.
    assert redistribution_cost(rows, whole) == _direct(rows, whole) == 96 * 50257 * 4 // 2


def test_no_shape_class_where_a_step_would_round():
    # 3 x 5 float16 elements are 30 bytes, not a multiple of 8 devices: a step's share rounds.
    odd = Layout(DeviceMatrix((8,)), TensorMap((-1, -1)), (3, 5)).with_partial([0])
    assert shape_class(odd, odd.with_partial([]), 2) is None
    assert shape_class(odd, odd.with_partial([]), 4) is None  # 60 bytes: 8 does not divide them either


def test_paths_of_the_cost_search_beyond_64_devices_are_optimal_and_move_the_right_data(monkeypatch):
    # Past `COARSE_FIRST_ABOVE` prime axes a plan is the cost search's path, taken back from the
    # source's relabelling classes to real states (`paths.onto_target`): checked slice by
    # slice against the plain search's cost. The last pair is the 4096-device case that took
    # 0.7 s per plan before (a tiny GPT: its dims split by none of 4096).
    from autostrat.layout import assemble_tensor, split_tensor
    from autostrat.redistribution import plan_redistribution, simulate
    from autostrat.redistribution.search import Search

    taken = []  # (kept up to the source's relabellings, length) of each path taken from a cost search
    original = Search.path
    monkeypatch.setattr(Search, "path", lambda self, reached: taken.append((self.by_source, self.unit)) or original(self, reached))
    rng = np.random.default_rng(128)
    pairs = _pairs(128, 6, seed=128)
    pairs = [(Layout(s.device_matrix, s.tensor_map, (128, 96), s.partial), Layout(d.device_matrix, d.tensor_map, (128, 96)))
             for s, d in pairs]
    pairs.append((Layout(DeviceMatrix((1, 8, 1, 512)), TensorMap((3, 1)), (128, 64), partial=(2,)),
                  Layout(DeviceMatrix((8, 8, 64)), TensorMap((2, 1)), (128, 64))))
    for src, dst in pairs:
        try:
            plan = plan_redistribution(src, dst)
        except RedistributionError:
            assert _direct(src, dst) == math.inf
            continue
        assert plan.exhaustive and plan.cost == _direct(src, dst) == sum(step.bytes for step in plan.steps)
        x = rng.standard_normal(src.shape)
        np.testing.assert_allclose(assemble_tensor(simulate(plan, split_tensor(x, src)), dst, check_replicas=True), x,
                                   err_msg=str(plan))
    assert (True, True) in taken  # some paths came back from the source's relabelling classes
