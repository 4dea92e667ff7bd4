"""Where outputs go (`autostrat.io`): never onto an input or another output (refused before any
search), through symlinks to their targets, through devices and FIFOs, "-" as standard output,
and a config's paths only inside the config's folder unless the command line or Python gives them."""

from __future__ import annotations

import json
import re
import os
import stat
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

import autostrat.cli as cli
import autostrat.frontend.run as run_module
from autostrat import nn, reset_auto_parallel_context, set_auto_parallel_context
from autostrat.cli import main
from autostrat.errors import ConfigError
from autostrat.frontend.api import parallelize
from autostrat.frontend.config import load_config
from autostrat.models import FFN, tutorial_plan
from autostrat.report.html import write_report
from autostrat.runtime.checkpoint import save_checkpoint

ROOT = Path(__file__).resolve().parent.parent
CONFIG = str(ROOT / "configs" / "ffn.yaml")
NO_SPACE = "cannot write /dev/full: No space left on device (ENOSPC)"


@pytest.fixture(scope="module")
def plan():
    return tutorial_plan()


@pytest.fixture
def no_search(monkeypatch):
    """Fails the test if anything is planned: a clash is refused before the work."""
    def searched(*_, **__):
        raise AssertionError("planned before refusing")

    for module, name in ((cli, "_timed_plan"), (cli, "replan"), (run_module, "plan_config")):
        monkeypatch.setattr(module, name, searched)


def config_in(folder: Path, extra: str = "") -> Path:
    """The tutorial FFN's config in `folder`, with `extra` YAML lines."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "ffn.yaml"
    path.write_text(Path(CONFIG).read_text() + extra)
    return path


def listing(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


def error(capsys) -> str:
    return capsys.readouterr().err.removeprefix("autostrat: error: ")


# --- devices and FIFOs are written through; symlinks to their targets ---


def test_out_to_dev_full_is_an_error_naming_it_and_the_device_stays(capsys):
    # Before: as root, the rename replaced the device node with a regular file.
    assert main(["search", CONFIG, "--out", "/dev/full"]) == 2
    assert error(capsys) == NO_SPACE + "\n"
    assert stat.S_ISCHR(os.stat("/dev/full").st_mode)


def test_a_failed_device_write_leaves_the_other_outputs_unwritten(tmp_path, capsys):
    assert main(["search", CONFIG, "--out", "/dev/full", "--dump-ir", str(tmp_path / "ir")]) == 2
    assert error(capsys) == NO_SPACE + "\n" and listing(tmp_path) == []


def test_out_to_dev_null_writes_through(capsys):
    assert main(["search", CONFIG, "--out", "/dev/null"]) == 0
    assert "plan written to /dev/null" in capsys.readouterr().out and stat.S_ISCHR(os.stat("/dev/null").st_mode)


def test_a_fifo_with_a_reader_gets_the_plan(tmp_path):
    fifo = tmp_path / "plan.fifo"
    os.mkfifo(fifo)
    received = []
    reader = threading.Thread(target=lambda: received.append(fifo.read_bytes()))
    reader.start()
    code = main(["search", CONFIG, "--out", str(fifo)])
    if code != 0:  # the writer never came: let the reader go
        open(fifo, "wb").close()
    reader.join()
    assert code == 0 and json.loads(received[0])["total_bytes_per_device"] == 6144
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)


def test_out_through_a_symlink_keeps_the_link_and_replaces_its_target(tmp_path):
    (tmp_path / "plans").mkdir()
    target = tmp_path / "plans" / "plan.json"
    target.write_text("old")
    link = tmp_path / "link.json"
    link.symlink_to(Path("plans") / "plan.json")
    assert main(["search", CONFIG, "--out", str(link)]) == 0
    assert link.is_symlink() and os.readlink(link) == "plans/plan.json"
    assert json.loads(target.read_text())["graph"] == "FFN" and listing(tmp_path) == ["link.json", "plans", "plans/plan.json"]


def test_a_dangling_symlink_gets_its_target_created(tmp_path):
    link = tmp_path / "link.json"
    link.symlink_to(tmp_path / "new" / "plan.json")
    assert main(["search", CONFIG, "--out", str(link)]) == 0
    assert link.is_symlink() and json.loads((tmp_path / "new" / "plan.json").read_text())["graph"] == "FFN"


WRITERS = {
    "plan.save": lambda plan, path: plan.save(path),
    "plan.save_strategy": lambda plan, path: plan.save_strategy(path),
    "save_checkpoint": lambda plan, path: save_checkpoint({"w": np.ones(2, np.float32)}, path),
    "write_report": lambda plan, path: write_report(plan, path),
}


@pytest.mark.parametrize("writer", WRITERS, ids=list(WRITERS))
def test_python_writers_write_through_symlinks_and_devices(tmp_path, plan, writer):
    target = tmp_path / "target"
    target.write_text("old")
    (tmp_path / "link").symlink_to(target)
    WRITERS[writer](plan, tmp_path / "link")
    assert (tmp_path / "link").is_symlink() and target.read_bytes() != b"old" and listing(tmp_path) == ["link", "target"]
    with pytest.raises(ConfigError, match=f"^{re.escape(NO_SPACE)}$"):
        WRITERS[writer](plan, "/dev/full")
    assert stat.S_ISCHR(os.stat("/dev/full").st_mode)


def test_dump_ir_into_a_linked_folder_writes_into_its_target(tmp_path, plan):
    (tmp_path / "real").mkdir()
    (tmp_path / "ir").symlink_to("real")
    plan.dump_ir(tmp_path / "ir")
    assert (tmp_path / "ir").is_symlink() and listing(tmp_path / "real") == ["step_parallel_begin_0000.ir", "step_parallel_end_0001.ir"]


# --- "-" is standard output ---


def test_out_dash_prints_only_the_plan_json_on_standard_output():
    done = subprocess.run([sys.executable, "-m", "autostrat", "search", CONFIG, "--out", "-"], capture_output=True,
                          text=True, cwd=ROOT, env=os.environ | {"PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["total_bytes_per_device"] == 6144  # the whole of standard output is the JSON
    assert "dense2.matmul    MatMul" in done.stderr and done.stderr.endswith("plan written to standard output\n")


def test_report_dash_prints_the_html_on_standard_output(tmp_path, capsys):
    assert main(["search", CONFIG, "--out", str(tmp_path / "plan.json")]) == 0
    capsys.readouterr()
    assert main(["report", str(tmp_path / "plan.json"), "-o", "-"]) == 0
    captured = capsys.readouterr()
    assert captured.out.startswith("<!doctype html>") and captured.err == "report written to standard output\n"


@pytest.mark.parametrize("argv,message", [
    (["search", CONFIG, "--out", "-", "--report", "-"],
     "--out and --report both write to standard output (-); give one of them a file"),
    (["search", CONFIG, "--dump-ir", "-"], "--dump-ir takes a folder; standard output (-) takes one file"),
    (["search", CONFIG, "--png", "charts"], "--png charts writes the report's charts: give --report FILE too"),
    (["run", CONFIG, "--report", "-"], "run --report: standard output (-) carries the run's own lines; give a file"),
], ids=["two-on-stdout", "dump-ir-dash", "png-without-report", "run-report-dash"])
def test_output_options_that_cannot_work_are_refused_before_the_search(no_search, capsys, argv, message):
    assert main(argv) == 2 and error(capsys) == message + "\n"


# --- an output that is an input or another output is refused before any search ---


def test_out_onto_the_config_is_refused(tmp_path, no_search, capsys):
    config = config_in(tmp_path)
    before = config.read_text()
    assert main(["search", str(config), "--out", str(config)]) == 2
    assert error(capsys) == (f"--out {config} is the config {config}: an output never replaces an input; "
                             f"give the output another path\n")
    assert config.read_text() == before


def test_out_onto_a_link_to_the_config_is_refused(tmp_path, no_search, capsys):
    config = config_in(tmp_path)
    (tmp_path / "link.yaml").symlink_to(config)
    assert main(["search", str(config), "--out", str(tmp_path / "link.yaml")]) == 2
    assert error(capsys).startswith(f"--out {tmp_path / 'link.yaml'} is the config {config}")


def test_out_and_report_on_one_file_are_refused(tmp_path, no_search, capsys):
    path = str(tmp_path / "x")
    assert main(["search", CONFIG, "--out", path, "--report", path]) == 2
    assert error(capsys) == f"--out {path} and --report {path} are the same file; give each output its own path\n"
    assert listing(tmp_path) == []


def test_report_onto_its_plan_is_refused(tmp_path, no_search, capsys):
    plan_file = tmp_path / "plan.json"
    plan_file.write_text("{}")
    assert main(["report", str(plan_file), "-o", str(plan_file)]) == 2
    assert error(capsys).startswith(f"-o {plan_file} is the plan {plan_file}: an output never replaces an input")
    assert plan_file.read_text() == "{}"


def test_dump_ir_folder_on_the_out_file_is_refused(tmp_path, no_search, capsys):
    path = tmp_path / "x"
    assert main(["search", CONFIG, "--out", str(path), "--dump-ir", str(path)]) == 2
    assert error(capsys) == (f"--dump-ir {path}/step_parallel_begin_0000.ir would be inside --out {path}, which is a file; "
                             f"give each output its own path\n")


def test_out_onto_a_dump_is_refused(tmp_path, no_search, capsys):
    dump = tmp_path / "ir" / "step_parallel_end_0001.ir"
    assert main(["search", CONFIG, "--dump-ir", str(tmp_path / "ir"), "--out", str(dump)]) == 2
    assert error(capsys) == f"--out {dump} and --dump-ir {dump} are the same file; give each output its own path\n"


def test_out_onto_a_chart_is_refused(tmp_path, no_search, capsys):
    chart = tmp_path / "png" / "memory.png"
    argv = ["search", CONFIG, "--report", str(tmp_path / "r.html"), "--png", str(tmp_path / "png"), "--out", str(chart)]
    assert main(argv) == 2 and error(capsys).startswith(f"--out {chart} and --png {chart} are the same file")


def test_run_report_onto_the_config_is_refused(tmp_path, no_search, capsys):
    config = config_in(tmp_path)
    assert main(["run", str(config), "--backend", "local", "--report", str(config)]) == 2
    assert error(capsys).startswith(f"--report {config} is the config {config}")


def test_run_strategy_checkpoint_on_its_report_is_refused(tmp_path, no_search, capsys):
    path = tmp_path / "x"
    assert main(["run", CONFIG, "--backend", "local", "--report", str(path), "--strategy-ckpt-save-file", str(path)]) == 2
    assert error(capsys) == f"strategy_ckpt_save_file {path} and --report {path} are the same file; give each output its own path\n"


def test_standard_output_closed_is_a_one_line_error():
    done = subprocess.run([sys.executable, "-m", "autostrat", "search", CONFIG, "--out", "-"], stderr=subprocess.PIPE,
                          text=True, cwd=ROOT, env=os.environ | {"PYTHONPATH": str(ROOT)}, preexec_fn=lambda: os.close(1))
    assert done.returncode == 2 and done.stderr.endswith(
        "autostrat: error: cannot write standard output: standard output is closed (EBADF)\n")


def test_a_config_strategy_checkpoint_on_out_is_refused(tmp_path, no_search, capsys):
    config = config_in(tmp_path, "strategy_ckpt_save_file: plan.json\n")
    out = tmp_path / "plan.json"
    assert main(["search", str(config), "--out", str(out)]) == 2
    assert error(capsys) == (f"strategy_ckpt_save_file {out} (in {config}) and --out {out} are the same file; "
                             f"give each output its own path\n")


def test_a_config_strategy_checkpoint_on_the_config_itself_is_refused(tmp_path):
    config = config_in(tmp_path, "strategy_ckpt_save_file: ffn.yaml\n")
    with pytest.raises(ConfigError, match=rf"^strategy_ckpt_save_file {config} \(in {config}\) is the config {config}: "):
        load_config(config)


def test_a_config_strategy_checkpoint_on_its_load_file_is_refused(tmp_path):
    config = config_in(tmp_path, "strategy_ckpt_save_file: s.json\nstrategy_ckpt_load_file: s.json\n")
    saved = tmp_path / "s.json"
    with pytest.raises(ConfigError, match=rf"^strategy_ckpt_save_file {saved} \(in {config}\) is strategy_ckpt_load_file {saved}: "):
        load_config(config)


# --- a config's paths: relative to its folder, written only inside it ---


@pytest.mark.parametrize("given,linked", [("../x.json", False), ("/ABSOLUTE/x.json", False), ("out/x.json", True),
                                          ("link.json", True)], ids=["parent", "absolute", "linked-folder", "linked-file"])
def test_a_config_strategy_checkpoint_outside_its_folder_is_refused(tmp_path, capsys, given, linked):
    outside = tmp_path / "outside"
    outside.mkdir()
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "out").symlink_to(outside)
    (tmp_path / "config" / "link.json").symlink_to(outside / "x.json")
    given = given.replace("/ABSOLUTE", str(outside))
    config = config_in(tmp_path / "config", f"strategy_ckpt_save_file: {given}\n")
    written = given if given.startswith("/") else f"{tmp_path / 'config'}/{given}"
    really = f" (really {outside / 'x.json'})" if linked else ""
    assert main(["search", str(config)]) == 2
    message = error(capsys)
    assert message.startswith(f"{config}: strategy_ckpt_save_file {written}{really} is outside") and message.count("\n") == 1
    with pytest.raises(ConfigError, match=rf"strategy_ckpt_save_file {written}.* is outside the config's folder "
                                          rf"{tmp_path / 'config'}: a config writes only inside its own folder"):
        load_config(config)
    assert listing(outside) == []


def test_strategy_ckpt_config_save_file_outside_names_its_key(tmp_path):
    config = config_in(tmp_path / "config", "strategy_ckpt_config: {save_file: ../s.json}\n")
    with pytest.raises(ConfigError, match=rf"^{config}: strategy_ckpt_config.save_file {tmp_path / 'config'}/../s.json "
                                          rf"is outside the config's folder"):
        load_config(config)


def test_a_config_strategy_checkpoint_inside_is_written_and_said(tmp_path, capsys):
    config = config_in(tmp_path / "config", "strategy_ckpt_save_file: saved/s.json\n")
    saved = tmp_path / "config" / "saved" / "s.json"
    assert main(["search", str(config)]) == 0
    assert f"\nstrategy checkpoint written to {saved} (strategy_ckpt_save_file in {config})\n" in capsys.readouterr().out
    assert json.loads(saved.read_text())["parallel_strategy_item"]["MatMul_dense1.weight"]["parallel_strategy"] == [[2, 1], [1, 4]]


def test_run_says_where_the_config_strategy_checkpoint_went(tmp_path, capsys):
    config = config_in(tmp_path, "strategy_ckpt_save_file: s.ckpt\n")
    assert main(["run", str(config), "--backend", "local", "--steps", "1"]) == 0
    assert (f"strategy checkpoint written to {tmp_path / 's.ckpt'} (strategy_ckpt_save_file in {config})"
            in capsys.readouterr().out)
    assert (tmp_path / "s.ckpt").stat().st_size > 0


def test_a_failed_out_leaves_the_config_strategy_checkpoint_unwritten(tmp_path, capsys):
    config = config_in(tmp_path, "strategy_ckpt_save_file: s.json\n")
    assert main(["search", str(config), "--out", "/dev/full"]) == 2
    assert error(capsys) == NO_SPACE + "\n" and listing(tmp_path) == ["ffn.yaml"]


def test_a_config_strategy_load_file_is_relative_to_its_folder(tmp_path):
    config = config_in(tmp_path / "config", "strategy_ckpt_config: {load_file: s.json, only_trainable_params: false}\n")
    assert load_config(config).context.strategy_ckpt_load_file == str(tmp_path / "config" / "s.json")


def test_the_command_line_may_write_the_strategy_checkpoint_anywhere(tmp_path, capsys):
    # It replaces the config's, also when given in MindSpore's strategy_ckpt_config.
    config = config_in(tmp_path / "config", "strategy_ckpt_config: {save_file: s.json}\n")
    elsewhere = tmp_path / "elsewhere" / "s.json"
    assert main(["search", str(config), "--strategy-ckpt-save-file", str(elsewhere)]) == 0
    assert f"\nstrategy checkpoint written to {elsewhere}\n" in capsys.readouterr().out
    assert elsewhere.exists() and listing(tmp_path / "config") == ["ffn.yaml"]


def test_a_python_call_may_write_the_strategy_checkpoint_anywhere(tmp_path):
    elsewhere = tmp_path / "a" / ".." / "s.json"
    set_auto_parallel_context(parallel_mode="auto_parallel", device_num=8, strategy_ckpt_save_file=str(elsewhere))
    try:
        net = FFN()
        net.dense1.matmul.shard(((2, 1), (1, 4)))
        parallelize(net, nn.Tensor(shape=(64, 64)))
    finally:
        reset_auto_parallel_context()
    saved = json.loads((tmp_path / "s.json").read_text())
    assert saved["parallel_strategy_item"]["MatMul_dense1.weight"]["parallel_strategy"] == [[2, 1], [1, 4]]


def test_where_a_path_came_from_is_no_key_a_user_sets(tmp_path):
    with pytest.raises(ConfigError, match="unknown auto-parallel context key 'output_paths_from'"):
        set_auto_parallel_context(output_paths_from="")
    with pytest.raises(ConfigError, match="unknown key 'output_paths_from'"):
        load_config(config_in(tmp_path, "output_paths_from: ''\n"))
