"""Configs and plan files are data (issue #29, items 1-2): a model name resolves only through the
model registry, a user's own Cell comes in by ``--import`` on the command line, and `report` /
`explain` plan again from what the plan's JSON embeds, never from a file or module it names."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from autostrat.cli import main

ROOT = Path(__file__).resolve().parent.parent
FFN = (ROOT / "configs" / "ffn.yaml").read_text()

# Configs that try to run a shell command through the model's name; each would create MARKER.
ATTACKS = {
    "os:system": "model: {name: 'os:system', params: {command: 'touch MARKER'}}",
    "subprocess:getoutput": "model: {name: 'subprocess:getoutput', params: {cmd: 'touch MARKER'}}",
    "os.system": "model: {name: 'os.system', params: {command: 'touch MARKER'}}",
}


def _attack(folder: Path, model_line: str) -> Path:
    config = folder / "evil.yaml"
    config.write_text(FFN.replace("model:\n  name: FFN", model_line.replace("MARKER", str(folder / "MARKER"))))
    return config


@pytest.mark.parametrize("name", sorted(ATTACKS))
@pytest.mark.parametrize("command", [["search"], ["run", "--backend", "local", "--steps", "1"], ["run", "--steps", "1"]])
def test_a_config_naming_a_callable_runs_nothing(tmp_path, capsys, name, command):
    config = _attack(tmp_path, ATTACKS[name])
    assert main([command[0], str(config), *command[1:]]) == 2
    err = capsys.readouterr().err
    assert f"evil.yaml: model.name: {name!r} is not a registered model; a config names a model, it never imports code" in err
    assert not (tmp_path / "MARKER").exists()


def _planted_plan(folder: Path, source: dict) -> Path:
    """A plan file of the FFN whose "source" is `source`."""
    assert main(["search", str(ROOT / "configs" / "ffn.yaml"), "--out", str(folder / "good.json")]) == 0
    recorded = json.loads((folder / "good.json").read_text()) | {"source": source}
    (folder / "evil.json").write_text(json.dumps(recorded))
    return folder / "evil.json"


@pytest.mark.parametrize("command", [["report", "-o", "out.html"], ["explain", "relu"]])
def test_a_plan_naming_a_config_with_a_callable_runs_nothing(tmp_path, capsys, command):
    evil = _attack(tmp_path, ATTACKS["os:system"])
    for source in ({"config": str(evil), "options": {}},  # the old format: a path to plan again from
                   {"config": "evil.yaml", "config_text": evil.read_text(), "options": {}}):
        plan = _planted_plan(tmp_path, source)
        capsys.readouterr()
        argv = [command[0], str(plan)] + [str(tmp_path / a) if a.endswith(".html") else a for a in command[1:]]
        assert main(argv) == 2
        assert "autostrat: error:" in capsys.readouterr().err
        assert not (tmp_path / "MARKER").exists() and not (tmp_path / "out.html").exists()


def test_a_plan_records_no_path_and_reports_after_moving(tmp_path, capsys):
    folder = tmp_path / "a" / "b"
    folder.mkdir(parents=True)
    shutil.copy(ROOT / "configs" / "ffn.yaml", folder / "mine.yaml")
    assert main(["search", str(folder / "mine.yaml"), "--device-num", "4", "--out", str(folder / "plan.json")]) == 0
    text = (folder / "plan.json").read_text()
    assert str(tmp_path) not in text and json.loads(text)["source"]["config"] == "mine.yaml"
    moved = tmp_path / "elsewhere.json"
    (folder / "plan.json").rename(moved)
    shutil.rmtree(tmp_path / "a")  # the config is gone too: the plan carries it
    capsys.readouterr()
    assert main(["report", str(moved), "-o", str(tmp_path / "r.html")]) == 0
    assert main(["explain", str(moved), "dense2.matmul"]) == 0
    assert "dense2.matmul  MatMul" in capsys.readouterr().out


USER_MODULE = """
from autostrat import nn, ops
from autostrat.common.initializer import initializer


class Tripler(nn.Cell):
    def __init__(self, width=16):
        super().__init__()
        self.matmul = ops.MatMul()
        self.weight = nn.Parameter(initializer("normal", (width, width)))

    def construct(self, x):
        return self.matmul(x, self.weight)
"""


def _user_config(folder: Path) -> Path:
    (folder / "my_models.py").write_text(USER_MODULE)
    config = folder / "mine.yaml"
    config.write_text("device_num: 4\nmodel: {name: Tripler, params: {width: 16}}\ninputs: [{shape: [8, 16]}]\n"
                      "strategies: {matmul: [[2, 1], [1, 2]]}\n")
    return config


def _autostrat(folder: Path, *argv: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT))  # autostrat itself; the user's folder only through --import
    return subprocess.run([sys.executable, "-m", "autostrat", *argv], cwd=folder, capture_output=True, text=True,
                          env=env, timeout=120)


def test_a_users_cell_comes_in_by_import_on_the_command_line(tmp_path):
    config = _user_config(tmp_path)
    refused = _autostrat(tmp_path, "search", str(config))
    assert refused.returncode == 2
    assert "mine.yaml: model.name: unknown model 'Tripler'; registered models: FFN" in refused.stderr
    assert "(your own Cell: --import MODULE on the command line)" in refused.stderr
    searched = _autostrat(tmp_path, "search", str(config), "--import", "my_models", "--out", "plan.json")
    assert searched.returncode == 0, searched.stderr
    assert "autostrat: imported my_models (--import): model(s) Tripler registered" in searched.stderr
    assert "matmul" in searched.stdout and json.loads((tmp_path / "plan.json").read_text())["source"]["imports"] == ["my_models"]
    unimported = _autostrat(tmp_path, "report", "plan.json", "-o", "r.html")
    assert unimported.returncode == 2 and not (tmp_path / "r.html").exists()
    assert "it was searched with --import my_models: give the same" in unimported.stderr
    reported = _autostrat(tmp_path, "report", "plan.json", "-o", "r.html", "--import", str(tmp_path / "my_models.py"))
    assert reported.returncode == 0, reported.stderr


def test_import_errors_are_one_line(tmp_path, capsys):
    (tmp_path / "broken.py").write_text("raise RuntimeError('boom')\n")
    (tmp_path / "empty.py").write_text("x = 1\n")
    cases = {str(tmp_path / "broken.py"): "importing it raised RuntimeError: boom",
             str(tmp_path / "empty.py"): "expected a module defining Cell subclasses to register as models, found none",
             "no_such_module_anywhere": "cannot import it: No module named 'no_such_module_anywhere'",
             "bad name!": "expected a module name such as my_models or a .py file, got 'bad name!'"}
    for spec, message in cases.items():
        assert main(["search", str(ROOT / "configs" / "ffn.yaml"), "--import", spec]) == 2
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err, err


def test_a_seeding_checkpoint_travels_in_the_plan_and_replanning_writes_nothing(tmp_path, capsys, monkeypatch):
    seeds = tmp_path / "seeds.json"
    config = tmp_path / "ffn.yaml"
    config.write_text(FFN + f"strategy_ckpt_save_file: {seeds.name}\n")
    monkeypatch.chdir(tmp_path)  # the config's checkpoint path is relative to the current folder, as in MindSpore
    assert main(["search", str(config)]) == 0
    assert seeds.exists()
    seeded = tmp_path / "seeded.yaml"
    seeded.write_text(FFN.replace("strategies:\n  dense1.matmul: [[2, 1], [1, 4]]\n", "")
                      + f"strategy_ckpt_load_file: {seeds.name}\nstrategy_ckpt_save_file: again.json\n")
    assert main(["search", str(seeded), "--out", "plan.json"]) == 0
    recorded = json.loads((tmp_path / "plan.json").read_text())
    assert recorded["source"]["strategy_ckpt"]["name"] == "seeds.json"
    seeds.unlink(), (tmp_path / "again.json").unlink()
    capsys.readouterr()
    assert main(["report", "plan.json", "-o", "r.html"]) == 0
    assert (tmp_path / "r.html").exists() and not seeds.exists() and not (tmp_path / "again.json").exists()


def test_a_malformed_source_is_refused(tmp_path, capsys):
    for source, message in (
            ({"config": "x.yaml", "config_text": FFN, "options": {}, "code": "os:system"},
             "source has code; expected config, config_text, options, imports, strategy_ckpt and hardware"),
            ({"config": "x.yaml", "config_text": FFN, "options": {},
              "strategy_ckpt": {"name": "../../etc/x", "base64": ""}},
             "source.strategy_ckpt: expected {name: FILE NAME, base64: TEXT}"),
            ({"config": "x.yaml", "config_text": 5, "options": {}}, "expected a plan written by autostrat search --out")):
        plan = _planted_plan(tmp_path, source)
        capsys.readouterr()
        assert main(["report", str(plan), "-o", str(tmp_path / "out.html")]) == 2
        assert message in capsys.readouterr().err
