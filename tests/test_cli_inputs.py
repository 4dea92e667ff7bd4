"""Command-line values the fuzz (test_fuzz.py) found wrong in `autostrat run`. Each must be a
one-line error with exit code 2 (argparse's, or autostrat's `autostrat: error: ...`), not a
traceback and not a run that silently does something else.

These checks belong to cli.py's option validation (issue #13, "Options and inputs"), which is
being written on another branch; until it lands these tests fail."""

from __future__ import annotations

from unittest import mock

import pytest

from autostrat.cli import main

FFN = ["run", "configs/ffn.yaml", "--backend", "local"]


def exit_code(argv: list[str]) -> int:
    def no_launch(*_, **__):
        raise AssertionError("must not launch MPI")

    with mock.patch("autostrat.frontend.run.launch", no_launch):
        try:
            return main(argv)
        except SystemExit as exit_:
            return exit_.code


@pytest.mark.parametrize("options", [
    ["--steps", "0"],          # was: ZeroDivisionError: integer modulo by zero (runtime/report.py)
    ["--steps", "-1"],         # was: ZeroDivisionError: integer modulo by zero
    ["--device-num", "0"],     # was: exit 0, silently ran on the config's 8 devices
    ["--seed", "-1"],          # was: ValueError: expected non-negative integer (numpy)
    ["--timeout", "nan"],      # was: exit 0; NaN compares false with every bound
    ["--stall-timeout", "nan"],  # was: exit 0
], ids=lambda options: " ".join(options))
def test_a_bad_run_option_is_a_one_line_error(options, capsys):
    assert exit_code(FFN + options) == 2
    assert "Traceback" not in capsys.readouterr().err


def test_a_failed_dump_ir_leaves_no_plan_json_either(tmp_path, capsys):
    # was: exit 2 ("cannot write .../file/ir/step_parallel_begin.ir: Not a directory") with
    # plan.json written: cli.py saves --out before it tries --dump-ir.
    (tmp_path / "file").write_text("")
    argv = ["search", "configs/ffn.yaml", "--out", str(tmp_path / "plan.json"), "--dump-ir", str(tmp_path / "file" / "ir")]
    assert exit_code(argv) == 2
    assert "Not a directory" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]
