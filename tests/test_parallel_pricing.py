"""Cost tables priced by worker processes (`redistribution.parallel`) against the same tables
priced in this process: the same entries, none of them priced here, and nothing after the time."""

from __future__ import annotations

import numpy as np
import pytest

from autostrat.autodiff import Adam, build_training
from autostrat.cost import Hardware
from autostrat.errors import ConfigError
from autostrat.frontend import trace
from autostrat.models import FFN
from autostrat.nn import Tensor
from autostrat.redistribution import table
from autostrat.redistribution.memo import clear_memos
from autostrat.redistribution.parallel import by_class, missing_pairs, price_in_parallel, pricing, search_class
from autostrat.search.pricing import price_tables
from autostrat.search.deadline import Deadline
from autostrat.search import SearchOptions, search
from autostrat.search import pricing as pricing_module
from autostrat.search import problem_edges
from autostrat.search.problem import build_problem


def timed_problem():
    """A training step whose tables are priced in α–β time across two servers of 4, every table
    new (problems share the tables of equal edges, `problem_edges.edge_table`)."""
    problem_edges.edge_table.cache_clear()
    graph = build_training(trace(FFN(), Tensor(shape=(64, 64)), device_num=8), Adam(1e-3))
    return build_problem(graph, 8, hardware=Hardware(devices_per_server=4))


def test_tables_priced_by_processes_equal_those_priced_here(monkeypatch):
    clear_memos()
    alone = timed_problem()
    price_tables(alone, Deadline(600.0))
    expected = [np.array(edge.table.full()) for edge in alone.edges]
    clear_memos()
    here, price = [], table.entry_price
    monkeypatch.setattr(table, "entry_price", lambda *pair: here.append(pair) or price(*pair))
    together = timed_problem()
    with pricing(2):
        price_tables(together, Deadline(600.0))
    clear_memos()
    assert here == []  # every entry came from the processes (they do not see this patch)
    assert len(expected) == len(together.edges) and sum(e.size for e in expected) > 100
    for edge, values in zip(together.edges, expected):
        assert np.array_equal(edge.table.full(), values), edge


def test_tasks_partition_the_pairs_one_search_class_each():
    # One process prices all the pairs of a class (they share its searches' memos), each once.
    clear_memos()
    pairs = missing_pairs(edge.table for edge in timed_problem().edges)
    tasks = by_class(pairs)
    keys = [{search_class(*pair) for pair in task} for task in tasks]
    assert len(tasks) > 1 and all(len(key) == 1 for key in keys)
    assert len(set().union(*keys)) == len(tasks)  # no class split over two tasks
    assert sum(map(len, tasks)) == len(pairs) == len(set(pairs))  # each pair once
    assert {pair for task in tasks for pair in task} == set(pairs)
    assert [len(task) for task in tasks] == sorted((len(task) for task in tasks), reverse=True)
    clear_memos()


def test_this_process_prices_the_tasks_no_worker_started(monkeypatch):
    # Its memos are warm: it takes the smallest tasks; the spawned process (which does not see
    # this patch) the largest. Every pair is priced once, and alike.
    from autostrat.redistribution import parallel

    clear_memos()
    pairs = missing_pairs(edge.table for edge in timed_problem().edges)
    expected = [table.entry_price(*pair) for pair in pairs]
    clear_memos()
    here, price = [], parallel.entry_price
    monkeypatch.setattr(parallel, "entry_price", lambda *pair: here.append(pair) or price(*pair))
    assert len(by_class(pairs)) > 2 and price_in_parallel(pairs, 2) == len(pairs)
    assert here and by_class(pairs)[-1][0] in here  # the last task, which no worker had taken yet
    assert [float(table.cost_table([s], [d], t, m)[0, 0]) for s, d, t, m in pairs] == expected
    clear_memos()


def test_processes_out_of_time_price_nothing():
    clear_memos()
    pairs = missing_pairs(edge.table for edge in timed_problem().edges)
    assert pairs and price_in_parallel(pairs, 2, seconds=0.0) == 0
    assert missing_pairs(edge.table for edge in timed_problem().edges) == pairs
    clear_memos()


def test_a_search_given_pricing_processes_finds_the_plan_of_one(monkeypatch):
    # The same refined plan, byte for byte, whether its tables were priced here or by 2 processes.
    graph = build_training(trace(FFN(), Tensor(shape=(64, 64)), device_num=8), Adam(1e-3))
    plans, priced = [], []
    parallel = pricing_module.price_in_parallel
    monkeypatch.setattr(pricing_module, "price_in_parallel", lambda pairs, *rest: priced.append(len(pairs)) or parallel(pairs, *rest))
    for processes in (0, 2):
        clear_memos()
        problem_edges.edge_table.cache_clear()
        options = SearchOptions(refine="cpsat", cost_model="time", hardware=Hardware(devices_per_server=4),
                                pricing_processes=processes)
        plans.append(search(graph, 8, options).to_json())
    clear_memos()
    assert len(priced) == 1 and priced[0] > 100  # the second search's tables, by the processes
    assert plans[0] == plans[1]


@pytest.mark.parametrize("processes", [-1, 1.5, True])
def test_pricing_processes_must_be_a_whole_number(processes):
    with pytest.raises(ConfigError, match="pricing_processes must be a whole number of processes"):
        SearchOptions(pricing_processes=processes)


def test_a_pair_a_process_cannot_price_is_the_callers_error():
    # As when this process prices it (`cost_table`): the planner's error, naming both layouts.
    from autostrat.errors import RedistributionError
    from autostrat.layout import DeviceMatrix, Layout, TensorMap

    four, eight = (Layout(DeviceMatrix((n,)), TensorMap((0, -1)), (8, 8)) for n in (4, 8))
    with pytest.raises(RedistributionError, match=r"cannot redistribute .*dm\[4\].* to .*dm\[8\]"):
        price_in_parallel([(four, four, "float32", None), (four, eight, "float32", None)], 2)
    clear_memos()
