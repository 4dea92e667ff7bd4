"""Where the test suite's CPU goes: per test, the CPU time of the pytest process that ran it and
of every process it started and waited for (ranks, commands, mpiexec), from ``getrusage``.

The suite runs on 2 cores with 2 workers, so its wall time is about half its CPU time: this table
shows what to make cheaper (the wall time of one test says little, since it shares the cores
with the other worker's test). This is how one BLAS thread per core went unnoticed: eight ranks
each ran two OpenBLAS threads, and a MindSpore sample took 38 CPU-seconds instead of 15.

Run from the repository root: ``python benchmarks/suite_cpu.py [--top N] [PYTEST ARGS]`` (default:
the whole suite as ``bash run.sh test`` runs it). Prints the total CPU and wall time, then the
files and the tests that took the most CPU.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
RECORDS = "SUITE_CPU_RECORDS"  # the folder each pytest process appends its tests' lines to


def _cpu(who: int) -> float:
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Record the test's CPU (setup, call and teardown): this process's and its children's."""
    own, children = _cpu(resource.RUSAGE_SELF), _cpu(resource.RUSAGE_CHILDREN)
    yield
    folder = os.environ.get(RECORDS)
    if folder:
        line = f"{item.nodeid}\t{_cpu(resource.RUSAGE_SELF) - own:.3f}\t{_cpu(resource.RUSAGE_CHILDREN) - children:.3f}\n"
        with open(Path(folder) / f"{os.getpid()}.tsv", "a") as records:
            records.write(line)


def read_records(folder: Path) -> list[tuple[str, float, float]]:
    """(test id, own CPU, children's CPU) of every test recorded in `folder`."""
    rows = []
    for path in sorted(folder.glob("*.tsv")):
        for line in path.read_text().splitlines():
            test, own, children = line.split("\t")
            rows.append((test, float(own), float(children)))
    return rows


def table(rows: list[tuple[str, float, float]], top: int) -> str:
    """The files and the tests that took the most CPU, with their own and their children's share."""
    files: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for test, own, children in rows:
        files[test.split("::")[0]][0] += own
        files[test.split("::")[0]][1] += children
    lines = [f"{'CPU s':>8} {'own':>8} {'children':>9}  file"]
    for name, (own, children) in sorted(files.items(), key=lambda item: -sum(item[1]))[:top]:
        lines.append(f"{own + children:8.1f} {own:8.1f} {children:9.1f}  {name}")
    lines += ["", f"{'CPU s':>8} {'own':>8} {'children':>9}  test"]
    for test, own, children in sorted(rows, key=lambda row: -(row[1] + row[2]))[:top]:
        lines.append(f"{own + children:8.1f} {own:8.1f} {children:9.1f}  {test}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--top", type=int, default=25, help="rows of each table (default 25)")
    options, pytest_args = parser.parse_known_args(argv)
    with tempfile.TemporaryDirectory(prefix="suite-cpu-") as folder:
        env = dict(os.environ) | {RECORDS: folder}
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "benchmarks"), str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
        start, before = time.monotonic(), _cpu(resource.RUSAGE_CHILDREN)
        done = subprocess.run([sys.executable, "-m", "pytest", "-p", "suite_cpu", "-q", *pytest_args], cwd=ROOT, env=env)
        wall, total = time.monotonic() - start, _cpu(resource.RUSAGE_CHILDREN) - before
        rows = read_records(Path(folder))
    print(f"\npytest exited {done.returncode}; {len(rows)} tests; wall {wall:.0f} s; CPU {total:.0f} s in all "
          f"(pytest and every process it waited for), {sum(own + children for _, own, children in rows):.0f} s within tests\n")
    print(table(rows, options.top))
    return done.returncode


if __name__ == "__main__":
    sys.exit(main())
