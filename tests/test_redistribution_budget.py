"""The timed planner's budget (`search.TIMED_BUDGET`): past it a plan is the link plan or the
path the search had reached, never faster than the brute-force optimum, never slower than it
says (`RedistributionPlan.least` is a lower bound of the optimum), and priced as it runs."""

from __future__ import annotations

import pytest

from autostrat.cost import Hardware
from autostrat.redistribution import plan_redistribution, redistribution_time, search
from autostrat.redistribution.memo import clear_memos
from autostrat.redistribution.link_plans import link_matrix
from tests.redistribution_oracle import all_layouts, oracle_times


@pytest.fixture
def one_node_budget(monkeypatch):
    # Every search of more than one settled node is cut: the fast path answers wherever it can.
    clear_memos()
    monkeypatch.setattr(search, "TIMED_BUDGET", 1)
    yield
    clear_memos()


def test_a_cut_plan_is_bounded_by_its_least_and_priced_as_it_runs(one_node_budget):
    # 2 servers of 4; every pair of layouts of an [8, 4] tensor whose layouts and servers meet on
    # fewer axes than the prime ones (the others are searched to the end).
    model = Hardware(devices_per_server=4).alpha_beta(8)
    layouts = all_layouts(8, (8, 4))
    cut, proven, worst = 0, 0, 1.0
    for src in layouts:
        fastest = oracle_times(src, model)
        for dst in layouts:
            if link_matrix(src, dst, model) is None:
                continue
            plan, optimum = plan_redistribution(src, dst, model=model), fastest(dst)
            nanoseconds = plan.nanoseconds(model)
            assert redistribution_time(src, dst, model=model) == nanoseconds, (src, dst)
            if plan.least is None:
                proven += 1
                assert plan.exhaustive and nanoseconds == optimum, (src, dst)
                continue
            cut += 1
            assert not plan.exhaustive and plan.least <= optimum <= nanoseconds, (src, dst, plan.least, optimum)
            assert str(plan).endswith(f" (fastest >= {plan.least} ns)")
            if optimum == 0:  # a free plan exists: the fast path finds one too (layouts equal up to slicing)
                assert nanoseconds == 0, (src, dst)
            else:
                worst = max(worst, nanoseconds / optimum)
    # What the planner's docstring says was measured here: 240 of 256 pairs cut, at most 2.5
    # times the optimum (a reorder on the 8-device axis, which the link plan moves whole).
    assert (cut, proven) == (240, 16)
    assert 2.4 < worst <= 2.51


def test_the_default_budget_leaves_small_searches_proven():
    # 2 servers of 4, the same pairs at the shipped budget: every plan proven optimal.
    clear_memos()
    model = Hardware(devices_per_server=4).alpha_beta(8)
    layouts = all_layouts(8, (8, 4))
    for src in layouts[::5]:
        fastest = oracle_times(src, model)
        for dst in layouts:
            plan = plan_redistribution(src, dst, model=model)
            assert plan.least is None and plan.nanoseconds(model) == fastest(dst), (src, dst)


def test_the_benchmarks_count_every_search_stopped_at_its_budget(one_node_budget, monkeypatch):
    # `benchmarks/phases.counted_pairs` wraps `solving._cut` where the searches call it: were it
    # moved, the benchmarks would print 0 stopped searches for any run.
    from pathlib import Path

    from autostrat.layout import DeviceMatrix, Layout, TensorMap

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parent.parent / "benchmarks"))
    from phases import counted_pairs

    src = Layout(DeviceMatrix((8,)), TensorMap((0, -1)), (8, 4))
    dst = Layout(DeviceMatrix((2, 4)), TensorMap(((0, 1), -1)), (8, 4))
    with counted_pairs() as counts:
        plan = plan_redistribution(src, dst, model=Hardware(devices_per_server=4).alpha_beta(8))
    assert counts.cut == 1 and plan.least is not None
