"""The cost-table entry bounds (`search.entry_bounds`) against the entries the redistribution
search prices: never above one, on every pair of a small training step's tables."""

from __future__ import annotations

import numpy as np
import pytest

from autostrat.autodiff import Adam, build_training
from autostrat.cost import Hardware
from autostrat.frontend import trace
from autostrat.layout import DeviceMatrix, Layout, TensorMap
from autostrat.models import TransformerStack
from autostrat.redistribution import cost_table
from autostrat.search.entry_bounds import entry_bound, table_bounds
from autostrat.search.problem import build_problem


@pytest.mark.parametrize("device_num, timed", [(8, False), (12, False), (8, True)])
def test_no_bound_exceeds_its_entry_on_a_training_step(device_num, timed):
    # Timed: nanoseconds on two servers of 4, the entries' collectives as their fastest algorithms.
    net = TransformerStack(layers=1, hidden=48, heads=4, seq=12, batch=8)
    hardware = Hardware(devices_per_server=4) if timed else None
    problem = build_problem(build_training(trace(net, *net.example_inputs(), device_num=device_num), Adam()), device_num,
                            hardware=hardware)
    positive = partial = 0
    for edge in problem.edges:
        table = edge.table
        rows, columns = table.shape
        bounds = np.array([table_bounds(table, row=row) for row in range(rows)])
        assert (bounds == np.array([table_bounds(table, column=column) for column in range(columns)]).T).all()
        priced = table.full()
        assert (bounds <= priced).all(), (edge.producer, edge.consumer, np.argwhere(bounds > priced)[:3])
        positive += int(np.count_nonzero(bounds))
        summed = [row for row, layout in enumerate(table.producer_layouts) if layout.partial]
        partial += int(np.count_nonzero(bounds[summed]))
    assert positive > 1000  # the bound prunes: it is not 0 everywhere
    assert (partial > 100) != timed  # partial sums are bounded in bytes (the search's start bound), not in time


def test_a_gather_is_bounded_by_its_price_and_a_partial_sum_by_its_reduction():
    matrix = DeviceMatrix((2, 4))
    split = Layout(matrix, TensorMap((1, 0)), (8, 8))
    whole = Layout(matrix, TensorMap((-1, -1)), (8, 8))
    swapped = Layout(matrix, TensorMap((0, 1)), (8, 8))  # the same piece sizes, other ranks' pieces
    assert entry_bound(split, whole, 4) == cost_table([split], [whole])[0, 0] == 4 * (64 - 8)
    assert 0 < entry_bound(split, swapped, 4) <= cost_table([split], [swapped])[0, 0]  # rank 0 alone sees nothing missing
    # A sum over the axis of 2 (axes count from the right) of 8 x 8 float32 made whole: an
    # AllReduce of 2 · (2 - 1)/2 of the 256-byte piece, which the search's start bound (combine:
    # T · (g + R - 2)/N) proves.
    summed = whole.with_partial([1])
    assert entry_bound(summed, whole, 4) == cost_table([summed], [whole])[0, 0] == 256
    assert 0 < entry_bound(summed, split, 4) <= cost_table([summed], [split])[0, 0]
    from autostrat.cost import Hardware
    assert entry_bound(summed, whole, 4, Hardware().alpha_beta(8)) == 0  # timed: its algorithms are not bounded here


def test_a_cheaper_edge_is_found_exactly_when_the_whole_row_has_one():
    """`SearchProblem.has_cheaper_edge` prices by bound and stops early; against the minimum of
    every option's price, for each cost a table row holds."""
    from autostrat.search.precision import TensorSizes
    from autostrat.strategies import generate_strategies

    net = TransformerStack(layers=1, hidden=48, heads=4, seq=12, batch=8)
    problem = build_problem(build_training(trace(net, *net.example_inputs(), device_num=8), Adam()), 8)
    checked = 0
    for edge in problem.edges[::7]:
        consumer = problem.graph.ops[edge.consumer]
        options = generate_strategies(consumer.rule, 8, problem.allow_repeated, problem.split_values, problem.mesh)
        dtype = (problem.sizes or TensorSizes.of(problem.graph)).priced(edge.tensor)
        for row in range(min(edge.table.shape[0], 3)):
            source = edge.source_layout(problem.candidates[edge.producer][row])
            least = cost_table([source], [s.input_layouts[edge.input_index] for s in options], dtype).min()
            for cost in {0.0, least, least + 1, *edge.table[row, :].tolist()}:
                assert problem.has_cheaper_edge(edge, row, cost) == (cost > least), (edge.producer, edge.consumer, row, cost)
                checked += 1
    assert checked > 100
