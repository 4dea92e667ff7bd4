"""The cases issue 3 states by number, bad input, refinement, lowering and cost tables."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from autostrat.cost import AlphaBeta
from autostrat.errors import RedistributionError
from autostrat.layout import DeviceMatrix, Layout, TensorMap, assemble_tensor, split_tensor
from autostrat.redistribution import cost_table, lower_plan, plan_redistribution, redistribution_cost, simulate
from autostrat.redistribution.memo import clear_memos
from autostrat.redistribution.refine import common_matrix, refine_layout
from autostrat.rules import make_rule
from autostrat.strategies import generate_strategies

DM24 = DeviceMatrix((2, 4))  # axis 1 has size 2, axis 0 has size 4
ROWS_PARTIAL = Layout(DM24, TensorMap((1, -1)), (64, 64), partial=(0,))


def _kinds(plan):
    return [step.kind for step in plan.steps]


def test_partial_to_split_is_one_reduce_scatter_of_6144_bytes():
    plan = plan_redistribution(ROWS_PARTIAL, Layout(DM24, TensorMap((1, 0)), (64, 64)))
    assert _kinds(plan) == ["ReduceScatter"]
    assert plan.cost == 6144 == 3 * (64 * 32 * 4) // 4
    assert plan.steps[0].groups == ((0, 1, 2, 3), (4, 5, 6, 7))


def test_partial_to_replicated_is_one_all_reduce_of_12288_bytes():
    plan = plan_redistribution(ROWS_PARTIAL, Layout(DM24, TensorMap((1, -1)), (64, 64)))
    assert _kinds(plan) == ["AllReduce"]
    assert plan.cost == 12288


def test_moving_a_split_between_dims_is_one_all_to_all_over_that_axis():
    matrix = DeviceMatrix((2, 2, 2))
    src = Layout(matrix, TensorMap((2, 1, -1)), (16, 8, 8))
    plan = plan_redistribution(src, Layout(matrix, TensorMap((-1, 1, 2)), (16, 8, 8)))
    assert _kinds(plan) == ["AllToAll"]
    assert (plan.steps[0].axes, plan.steps[0].dims) == ((2,), (0, 2))
    assert plan.cost == (16 * 8 * 8 * 4 // 4) // 2


@pytest.mark.parametrize("group", [2, 4, 8])
def test_split_to_replicated_is_one_all_gather_of_g_minus_1_pieces(group):
    src = Layout(DeviceMatrix((group,)), TensorMap((-1, 0)), (16, 64))
    plan = plan_redistribution(src, Layout(DeviceMatrix((group,)), TensorMap((-1, -1)), (16, 64)))
    assert _kinds(plan) == ["AllGather"]
    assert plan.cost == (group - 1) * (16 * 64 * 4 // group)


def test_equal_layouts_give_an_empty_plan_of_cost_0():
    plan = plan_redistribution(ROWS_PARTIAL, ROWS_PARTIAL)
    assert plan.steps == () and plan.cost == 0
    same = Layout(DeviceMatrix((2, 1, 4)), TensorMap((2, -1)), (64, 64), partial=(0,))
    assert plan_redistribution(same, ROWS_PARTIAL).steps == ()


def test_layouts_over_different_device_matrices_are_refined():
    src = Layout(DeviceMatrix((8,)), TensorMap((0, -1)), (64, 64))
    dst = Layout(DeviceMatrix((4, 2)), TensorMap((1, -1)), (64, 64))
    plan = plan_redistribution(src, dst)
    assert str(common_matrix(src.device_matrix, dst.device_matrix)) == "[4, 2]"
    assert _kinds(plan) == ["AllGather"] and plan.cost == 2048
    assert str(plan.steps[0].before.device_matrix) == "[2, 2, 2]"


def test_incompatible_device_matrices_cross_with_a_collective_permute():
    src = Layout(DeviceMatrix((2, 3)), TensorMap((1, 0)), (12, 12))
    dst = Layout(DeviceMatrix((3, 2)), TensorMap((0, 1)), (12, 12))
    plan = plan_redistribution(src, dst)
    assert _kinds(plan) == ["CollectivePermute"] and plan.cost == 12 * 12 * 4 // 6
    x = np.arange(144.0).reshape(12, 12)
    assert all((a == b).all() for a, b in zip(simulate(plan, split_tensor(x, src)), split_tensor(x, dst)))


def test_refined_layouts_give_every_rank_the_same_slice():
    layout = Layout(DeviceMatrix((2, 4)), TensorMap((0, 1)), (8, 8), partial=())
    refined = refine_layout(layout, DeviceMatrix((2, 2, 2)))
    assert str(refined.tensor_map) == "((1, 0), 2)"
    assert [refined.slice_range(r) for r in range(8)] == [layout.slice_range(r) for r in range(8)]


ERROR_CASES = {
    "device_num": (lambda: Layout(DeviceMatrix((4,)), TensorMap((0, -1)), (64, 64)), r"\[64, 64\] dm\[2, 4\].* to \[64, 64\] dm\[4\].*device_num 8 != 4"),
    "shape": (lambda: Layout(DM24, TensorMap((1, -1)), (64, 32)), r"dm\[2, 4\] tm\(1, -1\) partial\(0\) to \[64, 32\].*shapes"),
}


@pytest.mark.parametrize("case", ERROR_CASES)
def test_mismatched_layouts_are_errors_naming_both(case):
    other, message = ERROR_CASES[case]
    with pytest.raises(RedistributionError, match=message):
        plan_redistribution(ROWS_PARTIAL, other())


def test_a_whole_source_reaches_a_partial_target_by_one_free_partial_create():
    # Issue #32: a consumer wanting a partial sum of a whole value (DTensor's Replicate -> Partial):
    # rank 0 of each group over axis 0 keeps its rows, the other three hold zeros; nothing is sent.
    whole = Layout(DM24, TensorMap((1, -1)), (64, 64))
    plan = plan_redistribution(whole, ROWS_PARTIAL)
    assert str(plan) == "PartialCreate(axes (0, 1), 0B); 0B" and plan.exhaustive  # the 4-axis as two prime axes
    assert plan.steps[0].groups == ((0, 1, 2, 3), (4, 5, 6, 7))
    assert [str(p) for p in lower_plan(plan)] == ["ZerosLike(ranks=[[1, 2, 3], [5, 6, 7]])"]
    x = np.arange(64.0 * 64).reshape(64, 64)
    pieces = simulate(plan, split_tensor(x, whole))
    assert [bool(piece.any()) for piece in pieces] == [True, False, False, False, True, False, False, False]
    np.testing.assert_array_equal(assemble_tensor(pieces, ROWS_PARTIAL, check_replicas=True), x)


def test_a_partial_max_reaches_a_partial_sum_through_its_resolved_value():
    # One state holds partial values of one op: the max is resolved, then the sum created.
    most = ROWS_PARTIAL.with_partial((0,), "max")
    plan = plan_redistribution(most, ROWS_PARTIAL)
    assert [step.kind for step in plan.steps] == ["AllReduce", "PartialCreate"]
    assert plan.cost == redistribution_cost(most, ROWS_PARTIAL) == redistribution_cost(most, ROWS_PARTIAL.with_partial(()))
    rng = np.random.default_rng(5)
    x = rng.standard_normal((64, 64))
    pieces = [piece - rng.uniform(0, 1, piece.shape) * (rank % 4 != 0) for rank, piece in enumerate(split_tensor(x, most))]
    np.testing.assert_array_equal(assemble_tensor(simulate(plan, pieces), ROWS_PARTIAL, check_replicas=True), x)


def test_plans_lower_to_mindspore_primitives():
    src = Layout(DM24, TensorMap((-1, 0)), (64, 64))
    gather = plan_redistribution(src, Layout(DM24, TensorMap((-1, -1)), (64, 64)))
    assert [p.name for p in lower_plan(gather)] == ["AllGather", "Split", "Concat"]
    scatter = plan_redistribution(ROWS_PARTIAL, Layout(DM24, TensorMap((1, 0)), (64, 64)))
    assert [p.name for p in lower_plan(scatter)] == ["Split", "Concat", "ReduceScatter"]
    sliced = plan_redistribution(Layout(DM24, TensorMap((-1, -1)), (64, 64)), Layout(DM24, TensorMap((1, 0)), (64, 64)))
    assert [p.name for p in lower_plan(sliced)] == ["StridedSlice", "StridedSlice"]
    text = scatter.to_text()
    assert text.splitlines()[0].endswith(": 6144B") and "ReduceScatter(groups=[[0, 1, 2, 3], [4, 5, 6, 7]], op=sum)" in text


def test_plans_are_deterministic():
    dst = Layout(DeviceMatrix((4, 2)), TensorMap((0, 1)), (64, 64))
    first = plan_redistribution(ROWS_PARTIAL, dst).to_text()
    clear_memos()
    assert plan_redistribution(ROWS_PARTIAL, dst).to_text() == first


def test_an_alpha_beta_model_trades_bytes_for_fast_axes():
    # Axis 1 of [2, 4] (size 2) crosses servers and is 100 times slower. Moving the row split to
    # the columns over it is one AllToAll of 4096 bytes; the time model sends more bytes, mostly
    # inside servers, and finishes sooner.
    model = AlphaBeta(DM24, latency=(0.0, 0.0), bandwidth=(100.0, 1.0))
    src, dst = Layout(DM24, TensorMap((1, -1)), (64, 64)), Layout(DM24, TensorMap((-1, 1)), (64, 64))
    by_bytes, by_time = plan_redistribution(src, dst), plan_redistribution(src, dst, model=model)

    def seconds(plan):
        return sum(model.step_time(s.kind, s.before.device_matrix, s.axes, s.bytes) for s in plan.steps)

    assert by_bytes.cost == 4096 < by_time.cost
    assert seconds(by_time) < seconds(by_bytes) / 2
    x = np.arange(64.0 * 64).reshape(64, 64)
    assert (assemble_tensor(simulate(by_time, split_tensor(x, src)), dst, check_replicas=True) == x).all()


def test_cost_table_rows_are_producers_and_columns_consumers():
    rule = make_rule("MatMul", [(64, 64), (64, 64)])
    candidates = generate_strategies(rule, 8)
    producers = [s.output_layouts[0] for s in candidates]
    consumers = [s.input_layouts[0] for s in candidates]
    table = cost_table(producers, consumers)
    assert table.shape == (len(producers), len(consumers))
    assert table[3, 5] == plan_redistribution(producers[3], consumers[5]).cost
    assert table[0, 0] == 0 and (table >= 0).all()
    assert (cost_table(producers, consumers) == table).all()


def test_cost_tables_price_whole_to_partial_pairs():
    whole = Layout(DM24, TensorMap((1, -1)), (64, 64))
    split = Layout(DM24, TensorMap((1, 0)), (64, 64))  # its columns must be gathered first: 3 × 2 KiB
    assert cost_table([whole, split], [ROWS_PARTIAL]).tolist() == [[0.0], [6144.0]]


def test_cost_tables_leave_the_garbage_collector_as_they_found_it():
    import gc

    whole = Layout(DM24, TensorMap((1, -1)), (64, 64))
    other = Layout(DeviceMatrix((4,)), TensorMap((0, -1)), (64, 64))
    was = gc.isenabled()
    try:
        for enabled in (True, False):
            gc.enable() if enabled else gc.disable()
            clear_memos()
            cost_table([whole], [ROWS_PARTIAL, whole])
            assert gc.isenabled() == enabled
            with pytest.raises(RedistributionError):
                cost_table([whole], [other])  # 8 devices against 4: raised from inside the fill
            assert gc.isenabled() == enabled
    finally:
        gc.enable() if was else gc.disable()


def test_reduce_then_move_bound_is_exact_where_the_combine_bound_is_not():
    # dm[32, 2] partial over the 32-axis -> dm[16, 4] split over the 16-axis: a ReduceScatter
    # (31 MiB) then 4 MiB of moves. The combine bound says 34 MiB; reduce + the shadow's receive
    # bound says 35 MiB, the optimum.
    from autostrat.redistribution.heuristic import partial_bounds, receive_bound
    from autostrat.redistribution.moves import Space

    space = Space((2,) * 6, (4096, 4096), 4)
    start, target = (((), (0,)), (1, 2, 3, 4, 5)), (((), (5, 4, 3, 2)), ())
    bound = receive_bound(space, target)
    assert partial_bounds(space, bound.target_free, start) == (34 * 2**20, 31 * 2**20)
    assert bound(start) == 35 * 2**20
    src = Layout(DeviceMatrix((32, 2)), TensorMap((-1, 0)), (4096, 4096), partial=(1,))
    assert redistribution_cost(src, Layout(DeviceMatrix((16, 4)), TensorMap((-1, 1)), (4096, 4096))) == 35 * 2**20


def test_bounds_are_admissible_and_the_size_bound_is_the_weaker():
    # size bound <= receive bound <= the brute-force optimum, from every state of [2, 2, 2]
    # (partial ones included) to a sample of whole targets.
    from autostrat.redistribution.heuristic import receive_bound
    from autostrat.redistribution.moves import Space
    from tests.redistribution_oracle import layout_of, oracle_cost, states

    space = Space((2, 2, 2), (8, 4), 4)
    every = states(space.sizes, space.shape)
    for target in [state for state in every if not state[1]][::7]:
        bound, dst = receive_bound(space, target), layout_of(space.sizes, space.shape, "sum", target)
        for state in every:
            optimum = oracle_cost(layout_of(space.sizes, space.shape, "sum", state), dst)
            assert bound.size_bound(state) <= bound(state) <= optimum


def test_searches_settle_the_same_states_whatever_the_memos_hold():
    # Shared memos (moves, edges per relabelling pools, bounds per target) and lazily computed
    # bounds must not change which plan a search finds.
    rule = make_rule("MatMul", [(64, 64), (64, 64)])
    candidates = generate_strategies(rule, 8)
    pairs = [(s.output_layouts[0], t.input_layouts[0]) for s in candidates for t in candidates]
    texts = [plan_redistribution(src, dst).to_text() for src, dst in pairs]
    clear_memos()
    assert [plan_redistribution(src, dst).to_text() for src, dst in pairs[::-1]] == texts[::-1]


@pytest.mark.parametrize("device_num", [8, 16, 64])
def test_cost_tables_price_every_pair_as_its_plan(device_num):
    # Cost tables take a path-free search of their own; it must find each plan's cost.
    rule = make_rule("MatMul", [(64, 64), (64, 64)])
    candidates = generate_strategies(rule, device_num)[::3 if device_num == 64 else 1]
    producers, consumers = [s.output_layouts[0] for s in candidates], [s.input_layouts[0] for s in candidates]
    clear_memos()
    table = cost_table(producers, consumers)
    clear_memos()
    assert table.tolist() == [[float(plan_redistribution(src, dst).cost) for dst in consumers] for src in producers]


def test_searches_up_to_the_sources_relabellings_find_the_same_cost():
    # A source partial over 4 equal axes keeps its states up to their 24 relabellings; every
    # cost must equal the search kept up to the target's relabellings (which also gives plans).
    from autostrat.redistribution.moves import Space
    from autostrat.redistribution.layers import Problem
    from autostrat.redistribution.search import cost_search, search

    space = Space((2, 2, 2, 2), (16, 16), 4)
    problem = Problem((space,), "sum")
    sources = [(((), ()), (0, 1, 2, 3)), (((3,), ()), (0, 1, 2)), (((), (0,)), (1, 2, 3))]
    targets = [(((3, 2, 1, 0), ()), ()), (((), (0, 1, 2, 3)), ()), (((1, 3), (0, 2)), ()), (((2,), (1,)), ())]
    for source, target in itertools.product(sources, targets):
        by_source, reached = cost_search(problem, (0, source), (0, target))
        by_target, expected = search(problem, (0, source), (0, target))
        assert by_source.by_source and not by_target.by_source
        assert by_source.best[reached][0] == by_target.best[expected][0]


def test_unit_moves_gather_and_scatter_one_axis_and_keep_the_other_steps():
    from autostrat.redistribution.moves import Space, moves

    space = Space((2, 2, 2, 2), (16, 16), 4)
    state = (((3, 2), ()), (0, 1))
    full, unit = moves(space, state), moves(space, state, unit=True)
    blocks = {(m.kind, len(m.axes)) for m in full}
    assert ("AllGather", 2) in blocks and ("ReduceScatter", 2) in blocks
    assert [m for m in full if m.kind in ("AllGather", "ReduceScatter") and len(m.axes) == 1] == [
        m for m in unit if m.kind in ("AllGather", "ReduceScatter")
    ]
    assert [m for m in full if m.kind not in ("AllGather", "ReduceScatter")] == [
        m for m in unit if m.kind not in ("AllGather", "ReduceScatter")
    ]


def test_the_constructive_fallback_prices_a_pair_as_its_plan(constructive_only):
    src, dst = CONSTRUCTIVE_CASES[1]
    assert redistribution_cost(src, dst) == plan_redistribution(src, dst).cost


CONSTRUCTIVE_CASES = [
    (ROWS_PARTIAL, Layout(DeviceMatrix((4, 2)), TensorMap((0, 1)), (64, 64))),
    (Layout(DM24, TensorMap((1, 0)), (64, 64)), Layout(DM24, TensorMap((0, 1)), (64, 64))),
    (Layout(DeviceMatrix((2, 3)), TensorMap((1, 0)), (12, 12)), Layout(DeviceMatrix((3, 2)), TensorMap((0, 1)), (12, 12))),
]


@pytest.mark.parametrize("src, dst", CONSTRUCTIVE_CASES)
def test_the_constructive_fallback_is_marked_no_cheaper_than_exact_and_correct(constructive_only, monkeypatch, src, dst):
    from autostrat.redistribution import search

    fallback = plan_redistribution(src, dst)
    assert not fallback.exhaustive
    assert str(fallback).endswith(" (constructive)") and fallback.to_text().splitlines()[0].endswith(" (constructive)")
    assert fallback.cost == sum(step.bytes for step in fallback.steps)
    assert [p.name for p in lower_plan(fallback)]  # lowers like any plan
    x = np.random.default_rng(5).integers(-9, 9, size=src.shape).astype(np.float64)
    pieces = split_tensor(x, src)
    if src.partial:  # rank 0's group holds the values, the others zeros: the sum is x
        pieces = [piece * (src.device_matrix.coordinate(rank)[-1] == 0) for rank, piece in enumerate(pieces)]
    np.testing.assert_array_equal(assemble_tensor(simulate(fallback, pieces), dst, check_replicas=True), x)
    monkeypatch.setattr(search, "SETTLED_LIMIT", 100_000)
    clear_memos()
    exact = plan_redistribution(src, dst)
    assert exact.exhaustive and "(constructive)" not in exact.to_text()
    assert fallback.cost >= exact.cost


def test_the_constructive_fallback_reaches_a_partial_layout(constructive_only):
    src = Layout(DM24, TensorMap((-1, -1)), (64, 64), partial=(0, 1))
    plan = plan_redistribution(src, Layout(DM24, TensorMap((1, -1)), (64, 64), partial=(0,)))
    assert not plan.exhaustive
    assert str(plan) == "AllReduce(axes (2,), 16384B) -> Slice(axes (2,) dim 0, 0B); 16384B (constructive)"
