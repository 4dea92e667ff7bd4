"""`benchmarks/suite_cpu.py`: the records its pytest plugin writes, read back and tabled; and
the plugin itself in a pytest run of two tests, one of which starts a child process."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
_SPEC = importlib.util.spec_from_file_location("suite_cpu_script", ROOT / "benchmarks" / "suite_cpu.py")
suite_cpu = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(suite_cpu)


def test_records_are_summed_per_file_and_sorted_by_cpu(tmp_path):
    (tmp_path / "1.tsv").write_text("tests/a.py::x\t1.000\t0.000\ntests/b.py::y\t0.500\t4.000\n")
    (tmp_path / "2.tsv").write_text("tests/a.py::z\t2.000\t0.250\n")
    rows = suite_cpu.read_records(tmp_path)
    assert sorted(rows) == [("tests/a.py::x", 1.0, 0.0), ("tests/a.py::z", 2.0, 0.25), ("tests/b.py::y", 0.5, 4.0)]
    lines = suite_cpu.table(rows, top=2).splitlines()
    assert lines[1].split() == ["4.5", "0.5", "4.0", "tests/b.py"] and lines[2].split() == ["3.2", "3.0", "0.2", "tests/a.py"]
    assert [line.split()[-1] for line in lines[5:]] == ["tests/b.py::y", "tests/a.py::z"]  # the top 2 tests


def test_the_plugin_counts_a_tests_children(tmp_path):
    (tmp_path / "test_two.py").write_text(
        "import subprocess, sys\n"
        "def test_spins_a_child():\n"
        "    subprocess.run([sys.executable, '-c', 'import time\\nend = time.process_time() + 0.5\\nwhile time.process_time() < end: pass'])\n"
        "def test_idle():\n"
        "    pass\n")
    records = tmp_path / "records"
    records.mkdir()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "benchmarks"), str(ROOT)]), **{suite_cpu.RECORDS: str(records)})
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "suite_cpu", "-p", "no:cacheprovider", "-n", "0", "-q",
                           "-o", "addopts=", str(tmp_path / "test_two.py")], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = {test.split("::")[-1]: (own, children) for test, own, children in suite_cpu.read_records(records)}
    assert set(rows) == {"test_spins_a_child", "test_idle"}
    assert rows["test_spins_a_child"][1] >= 0.5 and rows["test_idle"][1] == 0.0
