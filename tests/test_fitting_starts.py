"""A search under a budget its strategies never fit: refused before any cost table by the peak
floor (a bound brute force confirms, an answer CP-SAT agrees with), then the first known start
that fits (Megatron's plan pieces, `report.fitting_starts`), never one over the budget."""

from __future__ import annotations

import itertools
import json

import pytest

from autostrat.cli import main
from autostrat.errors import InfeasibleError
from autostrat.search.memory import peak_bytes, peak_floor
from tests.test_refine import CASES, small_problem
from tests.test_refine_budget import gpt_training

# A tiny LLaMA's training step (2 blocks, 8 heads over 4 kv heads), 128 sequences of 16 on 8
# devices in bf16, with no seeds: its op-level space peaks at 1 387 946 bytes at the least.
TINY = """\
parallel_mode: auto_parallel
search_mode: sharding_propagation
gradients_mean: true
optimizer: {{name: adam}}
device_num: 8
precision: bf16
model: {{hf_config: {model}, params: {{seq: 16, batch: 128}}}}
inputs: [{{shape: [128, 16], dtype: int32}}, {{shape: [2048], dtype: int32}}]
"""


@pytest.mark.parametrize("device_num, seed", CASES[4::4])
def test_the_peak_floor_is_at_most_every_choices_peak(device_num, seed):
    problem = small_problem(device_num, seed)
    floor = peak_floor(problem)
    ops = list(problem.candidates)
    peaks = [peak_bytes(problem, dict(zip(ops, combo))) for combo in itertools.product(*(range(len(problem.candidates[op])) for op in ops))]
    assert 0 < floor.bytes <= min(peaks) and floor.at in problem.graph.ops


def test_a_budget_under_the_floor_is_refused_before_pricing():
    from autostrat.search import SearchOptions, search
    from autostrat.search.problem import build_problem

    graph = gpt_training(2).graph
    floor = peak_floor(build_problem(graph, 8, True))  # the problem sharding propagation searches (repeated candidates)
    with pytest.raises(InfeasibleError, match=rf"no choice of strategies fits max_device_memory = {floor.bytes - 1:,} bytes per "
                                              rf"device: .* live at {floor.at}, .* need {floor.bytes:,} bytes per device"):
        search(graph, 8, SearchOptions(refine="cpsat", max_device_memory=floor.bytes - 1))


@pytest.mark.parametrize("device_num, seed", CASES[1::8])
def test_cpsat_proves_a_budget_under_the_floor_infeasible(device_num, seed):
    # The slow path the floor short-cuts: the solver's memory constraints, proven infeasible.
    from autostrat.search.propagate import propagate
    from autostrat.search.refine import refine

    problem = small_problem(device_num, seed)
    with pytest.raises(InfeasibleError):
        refine(problem, propagate(problem).choice, time_limit=30, max_device_memory=peak_floor(problem).bytes - 1)


@pytest.fixture
def tiny(tmp_path):
    from pathlib import Path

    model = Path(__file__).resolve().parent.parent / "configs" / "models" / "llama-tiny.json"
    path = tmp_path / "tiny.yaml"
    path.write_text(TINY.format(model=model))
    return path


def _search(config, budget: int, capsys) -> tuple[str, dict]:
    out = config.parent / "plan.json"
    assert main(["search", str(config), "--max-device-memory", str(budget), "--out", str(out)]) == 0
    return capsys.readouterr().out, json.loads(out.read_text())


def test_the_search_returns_the_first_known_start_that_fits(tiny, capsys):
    # Megatron's table: tp 4 x pp 1's state is 234 432 bytes, over a quarter of the budget: not priced.
    text, plan = _search(tiny, 800_000, capsys)
    assert ("no choice of strategies fits max_device_memory = 800,000 bytes per device" in text
            and "the plan is the first known start that fits, Megatron-LM's tp 4 x pp 2 x dp 1, sequence parallel, "
                "recompute full, zero 0, micro-batch 1, peak 237,932 bytes\n" in text)
    assert len(plan["pipeline"]["peak_bytes"]) == 2 and max(plan["pipeline"]["peak_bytes"]) == 237_932


def test_a_start_over_the_budget_is_priced_and_passed_over(tiny, capsys, monkeypatch):
    monkeypatch.setattr("autostrat.report.fitting_starts.STATE_SHARE", (1, 1))  # price every start whose state fits
    text, plan = _search(tiny, 250_000, capsys)
    assert ("Megatron-LM's tp 4 x pp 2 x dp 1, sequence parallel, recompute full, zero 0, micro-batch 1, peak 237,932 "
            "bytes (priced before it: tp 4 x pp 1 x dp 2, sequence parallel, recompute full, zero 1, micro-batch 1: peak "
            "296,856 bytes)") in text
    assert max(plan["pipeline"]["peak_bytes"]) <= 250_000


def test_no_start_that_fits_keeps_the_refusal_with_the_starts_peaks(tiny, capsys, monkeypatch):
    monkeypatch.setattr("autostrat.report.fitting_starts.STATE_SHARE", (1, 1))
    assert main(["search", str(tiny), "--max-device-memory", "200000"]) == 2
    err = capsys.readouterr().err
    assert ("no choice of strategies fits max_device_memory = 200,000 bytes per device" in err
            and "; the known starts peak over it too: tp 4 x pp 2 x dp 1, sequence parallel, recompute full, zero 0, "
                "micro-batch 1: peak 237,932 bytes" in err)


def test_no_start_whose_state_leaves_the_budget_room_keeps_the_refusal(tiny, capsys):
    assert main(["search", str(tiny), "--max-device-memory", "500000"]) == 2  # tp 4 x pp 2's state: 175 824 bytes, over 1/4
    err = capsys.readouterr().err
    assert err.endswith("; no known start's model state takes a quarter of it or less\n") and err.count("\n") == 1


@pytest.mark.parametrize("option", [["--hardware", "a100-80gb"], ["--pipeline-stages", "2"]])
def test_no_start_is_tried_when_the_command_line_decides_what_the_starts_are_made_without(tiny, capsys, option):
    # The starts are made from the config's text: another profile, or a pipeline the options ask for, is not theirs.
    assert main(["search", str(tiny), "--max-device-memory", "800000", *option]) == 2
    err = capsys.readouterr().err
    assert err.startswith("autostrat: error: no ") and "known start" not in err
