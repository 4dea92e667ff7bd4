"""What autostrat writes: a failed write leaves no file and no folder behind, and what the user
keeps (plan JSON, strategy checkpoint, IR dumps, parameter checkpoint) follows the umask."""

from __future__ import annotations

import os
import stat

import numpy as np
import pytest

from autostrat.cli import main
from autostrat.errors import ConfigError
from autostrat.frontend import trace
from autostrat.io import write_atomically, write_files_atomically
from autostrat.reading import read_json, read_text
from autostrat.models import FFN
from autostrat.nn import Tensor
from autostrat.runtime.checkpoint import save_checkpoint
from autostrat.search import search

CONFIG = "configs/ffn.yaml"


@pytest.fixture(scope="module")
def plan():
    return search(trace(FFN(), Tensor(shape=(64, 64))), 8)


def listing(folder) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


def no_space(*_):
    raise OSError(28, "No space left on device")


# --- --dump-ir, --out and the strategy checkpoint leave nothing behind when they fail ---


def test_dump_ir_into_a_file_leaves_nothing(tmp_path, capsys):
    (tmp_path / "ir").write_text("")
    assert main(["search", CONFIG, "--dump-ir", str(tmp_path / "ir")]) == 2
    assert "cannot write " in capsys.readouterr().err and listing(tmp_path) == ["ir"]


def test_dump_ir_under_a_file_leaves_nothing(tmp_path, capsys):
    (tmp_path / "file").write_text("")
    assert main(["search", CONFIG, "--dump-ir", str(tmp_path / "file" / "ir")]) == 2
    assert "file/ir/step_parallel_begin_0000.ir: Not a directory" in capsys.readouterr().err
    assert listing(tmp_path) == ["file"]


def test_dump_ir_whose_second_file_cannot_be_written_leaves_neither(tmp_path, capsys):
    (tmp_path / "ir" / "step_parallel_end_0001.ir").mkdir(parents=True)  # a folder where a dump goes
    assert main(["search", CONFIG, "--dump-ir", str(tmp_path / "ir")]) == 2
    assert "ir/step_parallel_end_0001.ir: Is a directory" in capsys.readouterr().err
    assert listing(tmp_path) == ["ir", "ir/step_parallel_end_0001.ir"]


def test_a_failed_dump_ir_removes_the_folders_it_made(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(os, "replace", no_space)
    assert main(["search", CONFIG, "--dump-ir", str(tmp_path / "a" / "ir")]) == 2
    assert "No space left on device" in capsys.readouterr().err and listing(tmp_path) == []


def test_a_failed_dump_ir_leaves_no_plan_json_either(tmp_path, capsys):
    # Before: plan.json stayed, since --out was written before --dump-ir was tried.
    (tmp_path / "file").write_text("")
    argv = ["search", CONFIG, "--out", str(tmp_path / "plan.json"), "--dump-ir", str(tmp_path / "file" / "ir")]
    assert main(argv) == 2
    assert "Not a directory" in capsys.readouterr().err
    assert listing(tmp_path) == ["file"]


def test_a_failed_out_removes_the_folders_it_made(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(os, "replace", no_space)
    assert main(["search", CONFIG, "--out", str(tmp_path / "a" / "b" / "plan.json")]) == 2
    assert "a/b/plan.json: No space left on device" in capsys.readouterr().err and listing(tmp_path) == []


def test_out_onto_a_folder_leaves_nothing(tmp_path, capsys):
    (tmp_path / "plan.json").mkdir()
    assert main(["search", CONFIG, "--out", str(tmp_path / "plan.json")]) == 2
    assert "plan.json: Is a directory" in capsys.readouterr().err and listing(tmp_path) == ["plan.json"]


def test_a_failed_strategy_checkpoint_save_leaves_nothing(tmp_path, monkeypatch, plan):
    monkeypatch.setattr(os, "replace", no_space)
    with pytest.raises(ConfigError, match=r"cannot write .*new/strategy.json: No space left on device"):
        plan.save_strategy(tmp_path / "new" / "strategy.json")
    assert listing(tmp_path) == []


def test_a_failed_rename_keeps_no_new_target(tmp_path, monkeypatch):
    calls = []

    def replace_once(source, target):
        calls.append(target)
        if len(calls) > 1:
            no_space()
        os.rename(source, target)

    monkeypatch.setattr(os, "replace", replace_once)
    with pytest.raises(ConfigError, match=r"cannot write .*b.ir: No space left on device"):
        write_files_atomically({tmp_path / "ir" / "a.ir": "a", tmp_path / "ir" / "b.ir": "b"})
    assert listing(tmp_path) == []


def test_text_that_is_not_utf8_is_refused_before_writing(tmp_path):
    with pytest.raises(ConfigError, match=r"cannot write .*x.json: the text is not encodable as UTF-8 \(surrogates not allowed\)"):
        write_atomically(tmp_path / "new" / "x.json", "\ud800")
    assert listing(tmp_path) == []


# --- files the user keeps follow the umask; private files stay the owner's ---


@pytest.fixture(params=[0o022, 0o027], ids=["umask022", "umask027"])
def umask(request):
    previous = os.umask(request.param)
    yield request.param
    os.umask(previous)


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_plan_json_follows_the_umask(tmp_path, umask, plan):
    plan.save(tmp_path / "plan.json")
    assert mode(tmp_path / "plan.json") == 0o666 & ~umask


def test_strategy_checkpoint_follows_the_umask(tmp_path, umask, plan):
    plan.save_strategy(tmp_path / "strategy.json")
    assert mode(tmp_path / "strategy.json") == 0o666 & ~umask


def test_ir_dumps_and_their_folder_follow_the_umask(tmp_path, umask, plan):
    paths = plan.dump_ir(tmp_path / "ir")
    assert [mode(path) for path in paths] == [0o666 & ~umask] * 2 and mode(tmp_path / "ir") == 0o777 & ~umask


def test_parameter_checkpoint_follows_the_umask(tmp_path, umask):
    save_checkpoint({"w": np.ones(2, np.float32)}, tmp_path / "ffn.npz")
    assert mode(tmp_path / "ffn.npz") == 0o666 & ~umask


def test_private_files_are_the_owners_only(tmp_path, umask):
    write_atomically(tmp_path / "pid", "1\n", private=True)
    assert mode(tmp_path / "pid") == 0o600


# --- reading: bytes that are not UTF-8, values nested too deeply, huge integers ---


def test_a_file_that_is_not_utf8_names_the_byte(tmp_path):
    (tmp_path / "table.json").write_bytes(b'{"version": "\xff"}')
    with pytest.raises(ConfigError, match=r"table.json: a rank table must be UTF-8 text; line 1, column 14 is byte 0xff"):
        read_json(tmp_path / "table.json", "rank table")


def test_json_nested_too_deeply(tmp_path):
    (tmp_path / "table.json").write_text("[" * 100_000)
    with pytest.raises(ConfigError, match=r"table.json: not a valid rank table: values nested too deeply"):
        read_json(tmp_path / "table.json", "rank table")


def test_json_integer_with_too_many_digits(tmp_path):
    (tmp_path / "table.json").write_text("1" * 5000)
    with pytest.raises(ConfigError, match=r"table.json: not a valid rank table: Exceeds the limit \(4300 digits\)"):
        read_json(tmp_path / "table.json", "rank table")


def test_read_text_of_a_missing_file(tmp_path):
    with pytest.raises(ConfigError, match=r"cannot read config .*missing.yaml: No such file or directory"):
        read_text(tmp_path / "missing.yaml", "config")

