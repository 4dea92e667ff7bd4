"""`autostrat diff` (issue #19, part 3): the ops whose strategies differ, and the cost per phase
and per layer of two plans of one model."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from autostrat.cli import main
from autostrat.errors import ConfigError
from autostrat.frontend.config import load_config
from autostrat.frontend.run import plan_config
from autostrat.plan_diff import diff_plans, layer_of


def _plan(path: str, phase: str = "predict", device_num: int | None = None):
    return plan_config(load_config(path, phase=phase), device_num)[0]


@pytest.mark.parametrize("path, phase", [("configs/gpt.yaml", "train"), ("configs/transformer_stack.yaml", "train"),
                                         ("configs/ffn.yaml", "predict")])
def test_per_layer_bytes_add_up_to_each_plans_total(path, phase):
    eight, sixteen = _plan(path, phase), _plan(path, phase, 16)
    diff = diff_plans(eight, sixteen)
    assert diff.totals == (eight.total_bytes, sixteen.total_bytes)
    assert sum(a for a, _ in diff.layers.values()) == eight.total_bytes
    phases = {phase: (a["bytes"], b["bytes"]) for phase, (a, b) in diff.phases.items()}
    assert phases == {phase: (eight.prediction.phases[phase].bytes, sixteen.prediction.phases[phase].bytes)
                      for phase in eight.prediction.phases}
    assert {name for name, _, _ in diff.changed} == {name for name, op in eight.ops.items()
                                                     if name in sixteen.ops and str(op.strategy) != str(sixteen.ops[name].strategy)}


@pytest.mark.parametrize("path", ["configs/gpt_train.yaml", "configs/transformer_stack.yaml"])
def test_the_changed_ops_are_those_whose_strategies_differ(path):
    """Two plans on the same devices, by bytes and by time: an op is listed iff its strategy
    (tuples, order, partial sums, out-strategy, parameters at rest) differs."""
    config = load_config(path, phase="train")
    by_bytes = plan_config(replace(config, context=replace(config.context, cost_model="bytes")))[0]
    by_time = plan_config(replace(config, context=replace(config.context, cost_model="time")))[0]
    diff = diff_plans(by_bytes, by_time)
    expected = [name for name, op in by_bytes.ops.items() if str(op.strategy) != str(by_time.ops[name].strategy)]
    assert [name for name, _, _ in diff.changed] == expected and expected


def test_the_gpt_layers_are_named_and_ordered():
    plan = _plan("configs/gpt.yaml", "train")
    layers = list(diff_plans(plan, plan).layers)
    assert layers == ["blocks.0", "blocks.1", "(other)"] and diff_plans(plan, plan).changed == ()
    assert layer_of("accumulate/blocks.1.attention.key.matmul:0") == "blocks.1"


def test_the_cli_diffs_two_plan_files(tmp_path, capsys):
    for name, seed in (("a", "[[2, 1], [1, 4]]"), ("b", "[[8, 1], [1, 1]]")):
        config = tmp_path / f"{name}.yaml"
        config.write_text(open("configs/ffn.yaml").read().replace("[[2, 1], [1, 4]]", seed))
        assert main(["search", str(config), "--out", str(tmp_path / f"{name}.json")]) == 0
    assert main(["diff", str(tmp_path / "a.json"), str(tmp_path / "b.json")]) == 0
    out = capsys.readouterr().out
    assert "dense1.matmul    ((2, 1), (1, 4))  ((8, 1), (1, 1))" in out
    assert "forward  6,144    0" in out.replace("   ", "  ").replace("   ", "  ") or "-6,144" in out
    assert out.splitlines()[-1].split() == ["total", "6,144", "0", "-6,144"]


def test_plans_of_two_models_or_not_plans_are_refused(tmp_path, capsys):
    with pytest.raises(ConfigError, match="plan A is of graph 'FFN', plan B of 'GPT'"):
        diff_plans(_plan("configs/ffn.yaml"), _plan("configs/gpt.yaml"))
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"ops": []}))
    assert main(["diff", str(bad), str(bad)]) == 2
    assert "plan A: expected a plan's JSON" in capsys.readouterr().err
