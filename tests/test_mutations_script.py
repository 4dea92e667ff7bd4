"""The logic of `benchmarks/mutations.py`: a mutation applies only where its snippet occurs
exactly once, failing tests are read from pytest's junit report, and the scratch copy is what
a rank would import. (No mutation runs here: each takes minutes; the script prints the table.)"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from autostrat.errors import ConfigError

ROOT = Path(__file__).resolve().parent.parent
_SPEC = importlib.util.spec_from_file_location("mutations_script", ROOT / "benchmarks" / "mutations.py")
mutations = sys.modules["mutations_script"] = importlib.util.module_from_spec(_SPEC)  # dataclasses look their module up
_SPEC.loader.exec_module(mutations)


def _mutation(find: str = "x = 1", replace: str = "x = 2"):
    return mutations.Mutation("m", "a.py", find, replace, ("tests/test_a.py",))


def test_a_snippet_found_once_is_replaced_in_the_copy(tmp_path):
    (tmp_path / "a.py").write_text("y = 0\nx = 1\n")
    mutations.mutate(tmp_path, _mutation())
    assert (tmp_path / "a.py").read_text() == "y = 0\nx = 2\n"


@pytest.mark.parametrize("text,count", [("y = 0\nx = 11\n", 0), ("x = 1\nx = 1\n", 2)])
def test_a_snippet_not_found_exactly_once_is_refused(text, count):
    mutation = _mutation("x = 1\n")
    with pytest.raises(ConfigError, match=rf"^mutation m: expected its snippet exactly once in a.py, found it {count} time\(s\): 'x = 1'$"):
        mutations.mutated(text, mutation)


def test_every_mutation_matches_this_tree_once_and_changes_it():
    """The table can never silently test an unmutated tree: every snippet still matches."""
    names = [mutation.name for mutation in mutations.MUTATIONS]
    assert len(names) == len(set(names)) >= 8
    for mutation in mutations.MUTATIONS:
        text = (ROOT / mutation.path).read_text()
        assert mutations.mutated(text, mutation) != text, mutation.name
        assert all((ROOT / test.split("::")[0]).is_file() for test in mutation.tests), mutation.tests


def test_failures_and_errors_are_read_from_the_junit_report_and_skips_not_counted():
    report = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest" tests="4">
      <testcase classname="tests.test_wire" name="test_traffic[ffn]"><failure message="AssertionError: sent 0&#10;  more"/></testcase>
      <testcase classname="tests.test_wire" name="test_traffic[gpt_train]"/>
      <testcase classname="tests.test_mpi.TestRanks" name="test_run"><error message="failed on setup"/></testcase>
      <testcase classname="tests.test_mpi" name="test_slow"><skipped message="no mpi"/></testcase>
    </testsuite></testsuites>"""
    outcome = mutations.failed_tests(report)
    assert outcome == mutations.Outcome(3, ("tests/test_wire.py::test_traffic[ffn]", "tests/test_mpi.py::TestRanks::test_run"),
                                        ("AssertionError: sent 0", "failed on setup"))
    assert [mutations.short(test) for test in outcome.failed] == ["test_wire::test_traffic[ffn]", "test_mpi::TestRanks::test_run"]


def test_a_row_says_no_when_nothing_failed():
    mutation = mutations.MUTATIONS[0]
    assert mutations.table_row(mutation, mutations.Outcome(4, ()))[2:] == ["4", "0", "-", "NO"]
    assert mutations.table_row(mutation, mutations.Outcome(4, ("tests/test_a.py::b",), ("x",)))[3:] == ["1", "test_a::b", "yes"]


def test_the_scratch_copy_is_what_a_rank_imports(tmp_path):
    """A copy of the tracked files passes the check; a folder without autostrat fails it (the
    installed package would be imported instead)."""
    copy, empty = tmp_path / "copy", tmp_path / "empty"
    copy.mkdir(), empty.mkdir()
    mutations.scratch_copy(copy)
    assert (copy / "autostrat" / "runtime" / "wire.py").read_text() == (ROOT / "autostrat" / "runtime" / "wire.py").read_text()
    mutations.check_imports_from(copy)
    with pytest.raises(ConfigError, match=rf"a rank would import autostrat from .*, expected the scratch copy {empty}$"):
        mutations.check_imports_from(empty)


def test_unknown_mutation_names_are_refused_and_list_runs_nothing(capsys):
    assert mutations.main(["--only", "relu-leaky", "--only", "nope"]) == 2
    assert capsys.readouterr().err == f"mutations: error: --only: expected one of {', '.join(m.name for m in mutations.MUTATIONS)}, got nope\n"
    assert mutations.main(["--list", "--only", "relu-leaky"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 and lines[1].startswith("relu-leaky  ") and "autostrat/runtime/kernels/elementwise.py" in lines[1]


def test_a_baseline_failure_runs_again_and_fails_the_table_only_if_it_fails_twice(monkeypatch):
    flaky = mutations.Outcome(5, ("tests/test_mpi.py::test_run[ffn]",), ("AssertionError: rank 3 stalled",))
    runs = []

    def run(mutation, tests):
        runs.append(tests)
        return flaky if len(runs) == 1 else second

    monkeypatch.setattr(mutations, "run_mutation", run)
    second = mutations.Outcome(1, ())
    assert mutations.checked_baseline(("tests/test_mpi.py",)) == (
        "baseline: 5 tests pass unmutated (test_mpi::test_run[ffn] failed once and passed when run again; "
        "it said: AssertionError: rank 3 stalled)")
    assert runs == [("tests/test_mpi.py",), ("tests/test_mpi.py::test_run[ffn]",)]
    runs.clear()
    second = flaky
    with pytest.raises(ConfigError, match=r"^the unmutated tree fails its own checks: test_mpi::test_run\[ffn\]: AssertionError: rank 3 stalled$"):
        mutations.checked_baseline(("tests/test_mpi.py",))
