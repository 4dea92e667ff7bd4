"""Issue #33 item 6: a search is bounded by the hardware profile's memory by default, and the
plan-space search (`report.plan_space`) returns what a brute force over its candidates, each
priced by `autostrat estimate` from a config file of its own, says is the fastest that fits."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from autostrat.cli import main
from autostrat.cost import PROFILES
from autostrat.errors import InfeasibleError
from autostrat.models.gpt import GPT
from autostrat.report.estimate import estimate
from autostrat.report.plan_bound import ModelShape, step_time_bound
from autostrat.report.plan_space import plan_candidates, search_plan_space

ROOT = Path(__file__).resolve().parent.parent
SMALL = ROOT / "configs" / "estimate" / "gpt_small_search.yaml"
A100 = ("device_flops: 312.0e12\ndevice_memory_bandwidth: 2.039e12\nintra_server_bandwidth: 300.0e9\n"
        "inter_server_bandwidth: 25.0e9\nintra_server_latency: 2.0e-6\ninter_server_latency: 4.0e-6\ndevices_per_server: 8\n")


def test_the_shipped_profiles_hold_80_gib():
    assert {name: profile.device_memory for name, profile in PROFILES.items()} == {
        "a100-80gb": 80 * 2**30, "h100-sxm-80gb": 80 * 2**30}


def _mlp_on(tmp_path, device_memory: int) -> Path:
    """configs/mlp.yaml on a profile file whose device holds `device_memory` bytes."""
    (tmp_path / "small.yaml").write_text(A100 + f"device_memory: {device_memory}\n")
    path = tmp_path / "mlp.yaml"
    path.write_text((ROOT / "configs" / "mlp.yaml").read_text() + "hardware: small.yaml\n")
    return path


def test_a_search_without_a_budget_fits_the_profiles_memory(tmp_path, capsys):
    # mlp.yaml's unbounded plan peaks at 235,040 bytes; under 164,528 the search finds one of 152,608.
    path = _mlp_on(tmp_path, 164_528)
    out = tmp_path / "plan.json"
    assert main(["search", str(path), "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "max_device_memory not given, so the plan must fit hardware small.yaml's device_memory = 164,528 bytes" in text
    assert json.loads(out.read_text())["predicted"]["peak_bytes_per_device"] <= 164_528
    assert main(["search", str(_mlp_on(tmp_path, 10**9))]) == 0  # a device that holds it: the plan as it always was
    assert "device_memory" not in capsys.readouterr().out


def test_a_search_that_cannot_fit_the_profiles_memory_names_the_smallest_peak(tmp_path, capsys):
    assert main(["search", str(_mlp_on(tmp_path, 50_000))]) == 2
    error = capsys.readouterr().err
    assert re.search(r"device_memory = 50,000 bytes per device: no plan found fits it; the smallest peak found is "
                     r"235,040 bytes per device \(the unbounded search's plan\)", error), error


def _peak(estimate) -> int:
    return max(stage.peak_bytes for stage in estimate.memory)


def _brute_force(tmp_path, config: Path) -> list:
    """Every candidate of `config`'s search as its own config with a ``plan:``, estimated."""
    estimates = []
    for index, given in enumerate(plan_candidates(2, 2, 2, 8)):
        path = tmp_path / f"candidate_{index}.yaml"
        path.write_text(config.read_text().replace("device_num: 2\n", "") + (
            f"plan: {{tp: {given.tp}, pp: {given.pp}, vp: {given.vp}, dp: {given.dp}, "
            f"sequence_parallel: {str(given.sequence_parallel).lower()}, recompute: {given.recompute}, "
            f"zero: {given.zero}, micro_batch: {given.micro_batch}}}\n"))
        estimates.append(estimate(path))
    return estimates


@pytest.fixture(scope="module")
def searched(tmp_path_factory):
    """The brute force, and the search under a budget one byte below the fastest plan's peak, of
    the small config with sequences of 32: with 16, the fastest plan's peak (weights, mostly) is
    the smallest, recompute saving none of it (it seemed to save a hidden state on 2 stages while
    the next stage's backward read the recomputed copy the previous stage's backward made, which
    deadlocked: tests/test_pipeline_recompute.py), so no budget under it leaves a plan."""
    config = tmp_path_factory.mktemp("longer") / "gpt_small_search.yaml"
    config.write_text(SMALL.read_text().replace("seq: 16", "seq: 32"))
    estimates = _brute_force(tmp_path_factory.mktemp("brute"), config)
    budget = _peak(min(estimates, key=lambda one: one.step_time_s)) - 1
    return search_plan_space(config, max_device_memory=budget), estimates, budget, config


def test_the_plan_space_search_is_the_brute_force_minimum_that_fits(searched):
    found, estimates, budget, _ = searched
    peaks = [_peak(one) for one in estimates]
    fitting = [(one.step_time_s, index) for index, (one, peak) in enumerate(zip(estimates, peaks)) if peak <= budget]
    assert 0 < len(fitting) < len(estimates)  # the budget decides: the fastest plan of all does not fit
    fastest, index = min(fitting)
    op_level = found.priced[-1]
    if found.best.given is None:  # the op-level search's plan won: it fits and beats every candidate
        assert op_level.peak_bytes <= budget and op_level.estimate.step_time_s < fastest
    else:
        assert found.best.given == estimates[index].given and found.best.estimate.step_time_s == fastest
    assert found.counts()["pruned"] > 0
    for priced, one, peak in zip(found.priced, estimates, peaks):
        assert priced.bound <= peak  # the pruning bound is a lower bound on every candidate
        if priced.estimate is not None:
            assert (priced.estimate.step_time_s, priced.peak_bytes) == (one.step_time_s, peak)
        else:  # pruned: by the resident bound (over the budget), or by the step-time bound (no faster)
            assert priced.reason.startswith("pruned") and (peak > budget or one.step_time_s >= found.best.estimate.step_time_s)


def test_a_budget_nothing_fits_names_the_smallest_peak_found(searched):
    found, estimates, _, config = searched
    smallest = min(_peak(one) for one in estimates)
    with pytest.raises(InfeasibleError, match=rf"no plan of the {len(found.priced)} candidates fits 1,000,000 bytes per device: the "
                                              rf"smallest peak found is {smallest:,} bytes per device"):
        search_plan_space(config, max_device_memory=1_000_000)


def test_the_command_prints_the_chosen_plan_and_writes_the_estimates_fields(tmp_path, capsys):
    out = tmp_path / "search.json"  # on one device: 6 candidates and the op-level search's plan
    assert main(["search", str(SMALL), "--device-num", "1", "--max-device-memory", "3MB", "--json", str(out)]) == 0
    written, text = json.loads(out.read_text()), capsys.readouterr().out
    assert f"chosen: {written['search']['chosen']}" in text and written["search"]["budget_bytes"] == 3 * 2**20
    assert written["plan"] is None or written["plan"]["tp"] * written["plan"]["pp"] * written["plan"]["dp"] == 1
    assert {"step_time_s", "tokens_per_s_per_device", "model_tflops_per_device", "mfu", "peak_bytes_per_device",
            "stages"} <= set(written) and written["peak_bytes_per_device"] <= 3 * 2**20
    again = tmp_path / "again.json"
    assert main(["search", str(SMALL), "--device-num", "1", "--max-device-memory", "3MB", "--json", str(again)]) == 0
    assert again.read_bytes() == out.read_bytes() and capsys.readouterr().out == text.replace("search.json", "again.json")
    shared = tmp_path / "shared.json"
    assert main(["search", str(SMALL), "--device-num", "1", "--max-device-memory", "3MB", "--json", str(shared),
                 "--processes", "2"]) == 0
    assert shared.read_bytes() == out.read_bytes() and capsys.readouterr().out == text.replace("search.json", "shared.json")
    assert main(["search", str(SMALL), "--refine", "cpsat"]) == 2
    error = capsys.readouterr().err
    assert "--refine: " in error and "takes --device-num, --max-device-memory, --json, --processes and --time-limit only" in error


@pytest.mark.parametrize("extra, message", [
    ("", "device_num: expected a positive integer (or --device-num), got None"),
    ("device_num: 2\nglobal_batch: 0\n", "global_batch: expected a positive integer, got 0"),
    ("device_num: 2\nglobal_batch: 2\nplan: {tp: 2}\n", "plan: a config with a plan is estimated (autostrat estimate), "
                                                        "not searched"),
])
def test_a_plan_space_config_is_checked_before_any_plan_is_priced(tmp_path, capsys, extra, message):
    path = tmp_path / "space.yaml"
    path.write_text("model: {name: GPT}\n" + ("global_batch: 2\n" if not extra else "") + extra)
    assert main(["search", str(path)]) == 2
    assert f"{path}: {message}" in capsys.readouterr().err


def test_json_is_refused_for_a_config_without_global_batch(capsys):
    assert main(["search", str(ROOT / "configs" / "ffn.yaml"), "--json", "x.json"]) == 2
    assert "--json x.json: the figures of a plan-space search" in capsys.readouterr().err
    assert main(["search", str(ROOT / "configs" / "ffn.yaml"), "--processes", "2"]) == 2
    assert "--processes 2: the processes of a plan-space search" in capsys.readouterr().err


# Three blocks (pp 2 is uneven: 1 and 2 blocks) wide enough that the products weigh: the
# step-time bound then prunes; the graph, hence the estimate's work, is as small as the 2-layer one.
MID = """hardware: a100-80gb
precision: bf16
model:
  name: GPT
  params: {layers: 3, hidden: 1024, heads: 8, seq: 1024, vocab: 1024}
global_batch: 2
"""


@pytest.fixture(scope="module")
def bounded(tmp_path_factory):
    """The branch-and-bound search of `MID` on 2 devices, and every candidate estimated from a
    config file of its own (the op-level search's plan, the last, only where the search priced it)."""
    folder = tmp_path_factory.mktemp("bounded")
    (folder / "space.yaml").write_text(MID + "device_num: 2\n")
    estimates = []
    for index, given in enumerate(plan_candidates(2, 2, 3, 8)):
        path = folder / f"candidate_{index}.yaml"
        path.write_text(MID + (
            f"plan: {{tp: {given.tp}, pp: {given.pp}, vp: {given.vp}, dp: {given.dp}, "
            f"sequence_parallel: {str(given.sequence_parallel).lower()}, recompute: {given.recompute}, "
            f"zero: {given.zero}, micro_batch: {given.micro_batch}}}\n"))
        estimates.append(estimate(path))
    return search_plan_space(folder / "space.yaml"), estimates


def test_the_step_time_bound_is_below_every_candidates_estimate(bounded):
    found, estimates = bounded
    steps = [sum(one.phases_ns.values()) for one in estimates]
    assert [one.time_bound <= step for one, step in zip(found.priced, steps)] == [True] * len(steps)
    assert [one.bound <= _peak(estimate) for one, estimate in zip(found.priced, estimates)] == [True] * len(steps)
    assert min(one.time_bound / step for one, step in zip(found.priced, steps)) > 0.35  # and not a trivial bound
    op_level = found.priced[-1]
    assert op_level.estimate is not None and 0 < op_level.time_bound <= op_level.step_ns


def test_uneven_pipeline_splits_are_candidates_and_priced(bounded):
    found, estimates = bounded
    uneven = [one for one in estimates if one.given.pp == 2]  # 3 blocks on 2 stages
    assert uneven and all(len(one.memory) == 2 for one in uneven)
    assert sorted({(given.tp, given.pp, given.dp) for given in plan_candidates(2, 2, 3, 8)}) == [(1, 1, 2), (1, 2, 1), (2, 1, 1)]


def test_branch_and_bound_chooses_what_pricing_every_candidate_chooses(bounded):
    found, estimates = bounded
    steps = [sum(one.phases_ns.values()) for one in estimates] + [found.priced[-1].step_ns]
    fastest = min(range(len(steps)), key=lambda index: steps[index])  # everything fits 80 GiB
    assert found.best is found.priced[fastest] and found.best.step_ns == steps[fastest]
    pruned = [index for index, one in enumerate(found.priced) if one.estimate is None]
    assert pruned and found.counts()["pruned_by_time"] == len(pruned)
    assert all(steps[index] >= steps[fastest] and found.priced[index].time_bound >= steps[fastest] for index in pruned)
    for one, step in zip(found.priced, steps):
        assert one.estimate is None or one.step_ns == step


def test_branch_and_bound_on_three_processes_answers_what_one_does(bounded, tmp_path):
    """Candidates priced on 3 processes (`report.plan_pricing`): the same JSON, pruned
    candidates and their reasons included, as the search on one."""
    found, _ = bounded
    path = tmp_path / "space.yaml"
    path.write_text(MID + "device_num: 2\n")
    shared = search_plan_space(path, processes=3)
    assert shared.to_json() == found.to_json() and found.counts()["pruned_by_time"] > 0


def test_a_time_limit_that_cuts_nothing_answers_what_no_limit_does(bounded, tmp_path):
    found, _ = bounded
    path = tmp_path / "space.yaml"
    path.write_text(MID + "device_num: 2\n")
    limited = search_plan_space(path, time_limit=600)
    assert limited.best.name() == found.best.name() and limited.best.step_ns == found.best.step_ns
    assert limited.counts() == found.counts() and limited.counts()["not_priced"] == 0 and limited.gap() == 0
    assert json.loads(limited.to_json())["search"]["time_limit_s"] == 600


def test_a_time_limit_before_any_candidate_is_priced_says_so(tmp_path):
    path = tmp_path / "space.yaml"
    path.write_text(MID + "device_num: 2\n")
    with pytest.raises(InfeasibleError, match=r"no plan of the \d+ candidates priced within the time limit "
                                              r"\((\d+) of them not priced\) fits"):
        search_plan_space(path, time_limit=1e-6)


def test_candidates_left_unpriced_bound_how_much_faster_the_space_can_be():
    """The chosen plan (2 ms) against candidates the time limit left unpriced: their least
    bound, 1.6 ms, leaves it at most 25 % slower than the space's fastest; with bounds of 2 ms
    and more, none can be faster."""
    from autostrat.report.estimate import GivenPlan
    from autostrat.report.plan_results import NOT_PRICED, PlanSearch, Priced

    chosen = Priced(GivenPlan(1, 1, 1, "none", 0, 1, 1), estimate=type("E", (), {"phases_ns": {"step": 2_000_000}})())
    for bounds, gap in (((1_600_000, 1_900_000), 0.25), ((2_000_000, 3_000_000), 0.0)):
        left = tuple(Priced(None, reason=NOT_PRICED, time_bound=bound) for bound in bounds)
        search = PlanSearch(1, 1, "x", (chosen, *left), chosen, 0.0, time_limit=1.0)
        assert search.unpriced_bound() == bounds[0] and search.gap() == pytest.approx(gap)
    assert PlanSearch(1, 1, "x", (chosen,), chosen, 0.0).gap() == 0


def test_a_schedule_that_splits_the_backward_keeps_the_bound_below_the_estimate(tmp_path):
    # Its last instruction on a device may be a weight gradient: no backward chain after it.
    shape = ModelShape.of(GPT(layers=3, hidden=1024, heads=8, seq=1024, batch=2, vocab=1024))
    path = tmp_path / "zb.yaml"
    for given in [one for one in plan_candidates(2, 2, 3, 8) if one.pp == 2 and one.micro_batches == 2]:
        path.write_text(MID + "pipeline_schedule: zero_bubble_h1\n" + (
            f"plan: {{tp: 1, pp: 2, dp: 1, recompute: {given.recompute}, micro_batch: {given.micro_batch}}}\n"))
        found = estimate(path)
        assert found.plan.pipeline.schedule == "zero_bubble_h1"
        split = step_time_bound(shape, given, PROFILES["a100-80gb"], "bf16", split_backward=True)
        assert split <= sum(found.phases_ns.values()) and split < step_time_bound(shape, given, PROFILES["a100-80gb"], "bf16")
