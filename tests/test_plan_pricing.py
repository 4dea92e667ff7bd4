"""Plans priced on several processes (`report.plan_pricing`): the same estimates, in the same
order, as one process gives, refusals included; a worker's failure stops the pricing with its
traceback, a worker gone is an error; the expert plan search answers the same on 1 and 3
processes."""

from __future__ import annotations

from dataclasses import replace

import pytest

from autostrat.frontend.yaml_text import parse_config_text
from autostrat.report.estimate import estimate, read_given_plan
from autostrat.report.plan_pricing import price_plans
from tests.test_world import ROOT

SMALL = ROOT / "configs" / "estimate" / "gpt_small.yaml"


def _small():
    text = SMALL.read_text()
    data = parse_config_text(text, SMALL)
    return data, text, read_given_plan(data, SMALL)


def _figures(found: list) -> list:
    return [one if isinstance(one, str) else one.to_json() for one in found]


def test_several_processes_price_what_one_does_in_order():
    data, text, given = _small()
    plans = [given, replace(given, recompute="none"), replace(given, tp=3, dp=1, pp=2),  # tp 3: no split of 8 heads
             replace(given, micro_batch=2), replace(given, zero=0)]
    alone, shared = price_plans(data, text, SMALL, plans), price_plans(data, text, SMALL, plans, processes=3)
    assert _figures(shared) == _figures(alone)
    assert isinstance(alone[2], str) and "tp" in alone[2]
    assert len({one for one in _figures(alone)}) == 5  # five different answers: an order mix-up would show
    assert alone[0].to_json() == estimate(SMALL).to_json() and all(one.plan is None for one in shared if not isinstance(one, str))


def test_progress_hears_of_every_plan_once():
    data, text, given = _small()
    plans = [given, replace(given, recompute="none"), replace(given, zero=0)]
    heard = []
    price_plans(data, text, SMALL, plans, processes=2, progress=lambda plan, found: heard.append((plan, found.step_time_s)))
    assert sorted(heard, key=lambda one: plans.index(one[0])) == [(plan, one.step_time_s) for plan, one in
                                                                  zip(plans, price_plans(data, text, SMALL, plans))]


def test_a_worker_that_fails_sends_its_traceback_and_claims_nothing_more():
    import multiprocessing
    import os

    from autostrat.report.plan_pricing import _Claims, _work

    data, text, given = _small()
    broken = replace(given, global_batch="eight")  # not an AutostratError: a bug's TypeError
    claims, sent = _Claims(multiprocessing.get_context("spawn"), 3), []
    _work(claims, type("Sent", (), {"put": staticmethod(sent.append)}), data, text, SMALL, [given, broken, given], os.getppid())
    assert [index for index, _, _ in sent] == [0, 1] and sent[0][2] == "" and "TypeError" in sent[1][2]
    assert claims.claim(from_back=True) == 2 and claims.claim() is None  # the third is left to the parent


def test_a_failing_plan_stops_the_pricing_wherever_it_runs():
    data, text, given = _small()
    broken = replace(given, global_batch="eight")
    with pytest.raises((RuntimeError, TypeError), match=r"TypeError|unsupported operand"):  # in the worker, or here
        price_plans(data, text, SMALL, [broken, given, broken], processes=2)


def test_a_worker_gone_without_its_estimate_is_an_error_not_a_wait():
    import multiprocessing

    from autostrat.report.plan_pricing import _result

    context = multiprocessing.get_context("spawn")
    child = context.Process(target=int)
    child.start()
    child.join()
    with pytest.raises(RuntimeError, match=r"the pricing workers ended \(exit codes 0\) without the estimates of plan B"):
        _result(context.Queue(), [child], ["plan A", "plan B"], {1})  # polled: seen within a second, not waited for


def test_the_expert_plan_search_answers_the_same_on_three_processes():
    from autostrat.report.expert_plans import search_expert_plans

    path = ROOT / "configs/estimate/deepseek_tiny.yaml"
    alone, shared = search_expert_plans(path, limit=3), search_expert_plans(path, limit=3, processes=3)
    assert [(given, found.to_json()) for given, found in shared.priced] == [(given, found.to_json()) for given, found in alone.priced]
    assert shared.best.to_json() == alone.best.to_json() and len(alone.priced) == 4


def test_bounded_pricing_stops_past_the_fastest_and_more_processes_price_no_fewer():
    """Bounds of 0 ns, then one above the first plan's step: one process prices the first
    two (a tie on the bound with a larger key is past the best only on the key) and stops;
    two processes price those too, the fastest known later."""
    data, text, given = _small()
    plans = [given, replace(given, recompute="none"), replace(given, zero=0), replace(given, micro_batch=2)]
    step = sum(price_plans(data, text, SMALL, plans[:1])[0].phases_ns.values())
    bounds = [(0, 0), (0, 1), (step + 1, 2), (step + 2, 3)]
    alone = price_plans(data, text, SMALL, plans, bounds=bounds)
    assert [one is not None for one in alone] == [True, True, False, False]
    for processes in (2, 3):
        shared = price_plans(data, text, SMALL, plans, processes=processes, bounds=bounds)
        assert all(one is not None for one, mine in zip(shared, alone) if mine is not None)
        assert _figures([one for one in shared[:2]]) == _figures(alone[:2])
    assert price_plans(data, text, SMALL, plans, bounds=bounds, before=lambda: (0, -1)) == [None] * 4  # a start no plan beats


def test_with_a_deadline_workers_price_and_nothing_is_claimed_after_it(monkeypatch):
    """A deadline passed prices nothing; a far one prices what no deadline does, by spawned
    workers only (this process waits: an estimate here could not stop at the deadline)."""
    import time

    import autostrat.report.plan_pricing as pricing

    data, text, given = _small()
    plans = [given, replace(given, recompute="none")]
    alone = price_plans(data, text, SMALL, plans)
    monkeypatch.setattr(pricing, "_priced", lambda *args: pytest.fail("priced in the waiting process"))  # not in a worker
    assert price_plans(data, text, SMALL, plans, deadline=time.time() - 1) == [None, None]
    far = price_plans(data, text, SMALL, plans, deadline=time.time() + 600)
    assert _figures(far) == _figures(alone)
