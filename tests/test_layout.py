"""Layout algebra: MindSpore's worked example, device matrices, normal forms, slicing."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from autostrat.layout import DeviceMatrix, Layout, Strategy, TensorMap, assemble_tensor, split_tensor
from autostrat.rules import make_rule


@pytest.fixture
def tutorial():
    rule = make_rule("MatMul", [(256, 784), (784, 64)])
    return Strategy.from_tuples(rule, ((2, 1), (1, 4)), device_num=8)


def test_worked_example_device_matrix(tutorial):
    assert tutorial.device_matrix.shape == (2, 1, 4)
    assert tutorial.input_layouts[0].normalized().device_matrix.shape == (2, 4)


def test_worked_example_slice_shapes(tutorial):
    x, w = tutorial.input_layouts
    [out] = tutorial.output_layouts
    assert (x.slice_shape, w.slice_shape, out.slice_shape) == ((128, 784), (784, 16), (128, 16))
    assert not out.partial


def test_worked_example_rows_of_x(tutorial):
    x = tutorial.input_layouts[0]
    assert [x.slice_range(rank)[0] for rank in range(8)] == [(0, 128)] * 4 + [(128, 256)] * 4
    assert all(x.slice_range(rank)[1] == (0, 784) for rank in range(8))


def test_worked_example_columns_of_w(tutorial):
    w = tutorial.input_layouts[1]
    columns = [(0, 16), (16, 32), (32, 48), (48, 64)]
    assert [w.slice_range(rank)[1] for rank in range(8)] == columns * 2
    assert w.replica_groups() == ((0, 4), (1, 5), (2, 6), (3, 7))


def test_repeated_calculation_appends_the_last_axis():
    rule = make_rule("MatMul", [(256, 784), (784, 64)])
    strategy = Strategy.from_tuples(rule, ((2, 1), (1, 2)), device_num=8)
    assert strategy.device_matrix.shape == (2, 1, 2, 2)
    assert strategy.repeat == 2
    assert [str(layout.tensor_map) for layout in strategy.input_layouts] == ["(3, 2)", "(2, 1)"]
    # W is split over the n axis only: ranks differing in m (the 4s) or the repeat (the 1s) share slices.
    assert strategy.input_layouts[1].replica_groups() == ((0, 1, 4, 5), (2, 3, 6, 7))


def test_split_reduction_factor_leaves_the_output_partial():
    rule = make_rule("MatMul", [(64, 64), (64, 64)])
    [out] = Strategy.from_tuples(rule, ((2, 4), (4, 1)), device_num=8).output_layouts
    assert out.partial == (1,) and str(out) == "[64, 64] dm[2, 4, 1] tm(2, 0) partial(1)"
    assert out.partial_groups() == ((0, 1, 2, 3), (4, 5, 6, 7))


def test_device_matrix_coordinates_round_trip():
    matrix = DeviceMatrix((3, 2, 4))
    assert [matrix.rank(matrix.coordinate(rank)) for rank in range(24)] == list(range(24))
    assert matrix.coordinate(7) == (0, 1, 3)
    assert matrix.axis_size(0) == 4 and matrix.axis_size(2) == 3


def test_device_matrix_groups_vary_along_the_chosen_axes():
    matrix = DeviceMatrix((2, 4))
    assert matrix.groups([1]) == ((0, 4), (1, 5), (2, 6), (3, 7))
    assert matrix.groups([0, 1]) == ((0, 1, 2, 3, 4, 5, 6, 7),)
    assert matrix.groups([]) == tuple((rank,) for rank in range(8))


def test_str_forms_are_short_and_stable():
    layout = Layout(DeviceMatrix((2, 4)), TensorMap(((1, 0), -1)), (64, 32), partial=())
    assert str(layout) == "[64, 32] dm[2, 4] tm((1, 0), -1)"
    assert str(Layout(DeviceMatrix((2, 4)), TensorMap((1, -1)), (64, 32), (0,), "max")) == "[64, 32] dm[2, 4] tm(1, -1) partial(max 0)"


def test_normal_form_merges_axes_acting_together():
    a = Layout(DeviceMatrix((2, 4)), TensorMap(((1, 0), -1)), (64, 32))
    b = Layout(DeviceMatrix((8,)), TensorMap((0, -1)), (64, 32))
    c = Layout(DeviceMatrix((2, 1, 4)), TensorMap(((2, 0), -1)), (64, 32))
    assert a.normalized() == b.normalized() == c.normalized() == b
    swapped = Layout(DeviceMatrix((2, 4)), TensorMap(((0, 1), -1)), (64, 32))
    assert not swapped.equivalent(a)


def _all_layouts(shape, device_num):
    """Every layout of `shape` over every device matrix of `device_num` (axis sizes > 1 or
    with one size-1 axis), with every tensor map and every partial set."""
    matrices = [m for m in _factorizations(device_num)] + [(1,) + m for m in _factorizations(device_num)]
    for matrix in matrices:
        ndim = len(matrix)
        roles = list(itertools.product(range(len(shape) + 2), repeat=ndim))  # dim, free, or partial per axis
        for role in roles:
            for orders in itertools.product(*(itertools.permutations([a for a in range(ndim) if role[a] == d]) for d in range(len(shape)))):
                partial = tuple(a for a in range(ndim) if role[a] == len(shape) + 1)
                try:
                    yield Layout(DeviceMatrix(matrix), TensorMap(tuple(orders)), shape, partial)
                except ValueError:
                    continue


def _factorizations(number):
    if number == 1:
        yield ()
        return
    for factor in range(2, number + 1):
        if number % factor == 0:
            for rest in _factorizations(number // factor):
                yield (factor,) + rest


def _signature(layout: Layout):
    ranges = tuple(layout.slice_range(rank) for rank in range(layout.device_num))
    # Partial over a size-1 axis combines nothing, so only groups of two or more ranks count.
    return ranges, tuple(group for group in layout.partial_groups() if len(group) > 1)


@pytest.mark.parametrize("device_num", [4, 6, 8])
def test_normal_form_equal_iff_every_rank_holds_the_same_slice(device_num):
    layouts = list(_all_layouts((12, 24), device_num))
    assert len(layouts) > 50
    by_signature, by_normal = {}, {}
    for layout in layouts:
        by_signature.setdefault(_signature(layout), set()).add(layout.normalized())
        by_normal.setdefault(layout.normalized(), set()).add(_signature(layout))
    assert all(len(normals) == 1 for normals in by_signature.values())
    assert all(len(signatures) == 1 for signatures in by_normal.values())


@pytest.mark.parametrize("device_num", [2, 6, 8])
def test_split_then_assemble_gives_the_tensor_back(device_num):
    rng = np.random.default_rng(device_num)
    array = rng.standard_normal((12, 24))
    for layout in _all_layouts((12, 24), device_num):
        pieces = split_tensor(array, layout)
        assert all(piece.shape == layout.slice_shape for piece in pieces)
        np.testing.assert_allclose(assemble_tensor(pieces, layout, check_replicas=True), array)


def test_assemble_combines_partial_slices_by_their_op():
    layout = Layout(DeviceMatrix((2,)), TensorMap((-1,)), (3,), partial=(0,), partial_op="max")
    assert assemble_tensor([np.array([1, 5, 2]), np.array([4, 0, 3])], layout).tolist() == [4, 5, 3]
    summed = layout.with_partial((0,), "sum")
    assert assemble_tensor([np.array([1, 5, 2]), np.array([4, 0, 3])], summed).tolist() == [5, 5, 5]


def test_assemble_detects_replicas_that_differ():
    layout = Layout(DeviceMatrix((2,)), TensorMap((-1,)), (2,))
    with pytest.raises(ValueError, match="ranks 0 and 1 should hold the same slice"):
        assemble_tensor([np.array([1, 2]), np.array([1, 3])], layout, check_replicas=True)


def test_a_layout_remembers_its_hash_but_never_sends_it_to_another_process():
    # A string's hash differs between processes (PYTHONHASHSEED): a pickled remembered hash
    # would file the layout under the wrong bucket of a worker's memos.
    import pickle

    first = Layout(DeviceMatrix((2, 4)), TensorMap((1, 0)), (8, 8), (), "sum")
    second = Layout(DeviceMatrix((2, 4)), TensorMap((1, 0)), (8, 8))
    assert hash(first) == hash(second) == hash(first) and first == second
    assert hash(Layout(DeviceMatrix((2, 4)), TensorMap((0, 1)), (8, 8))) != hash(first)  # the fields decide
    sent = pickle.loads(pickle.dumps(first))
    assert "_hash" in first.__dict__ and "_hash" not in sent.__dict__
    assert sent == first and {first: 1}[sent] == 1


def test_a_strategy_remembers_its_hash_but_never_sends_it_to_another_process(tutorial):
    import pickle

    again = Strategy.from_tuples(tutorial.rule, ((2, 1), (1, 4)), device_num=8)
    assert hash(tutorial) == hash(again) and tutorial == again
    sent = pickle.loads(pickle.dumps(tutorial))
    assert "_hash" in tutorial.__dict__ and "_hash" not in sent.__dict__ and {tutorial: 1}[sent] == 1
