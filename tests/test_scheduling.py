"""The suite's scheduling lists (conftest.py) name tests and files that exist: a renamed test
would otherwise leave the list and silently run two MPI jobs at once, or serialise a long one."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import IN_PROCESS, SPAWNING, SPAWNING_TESTS, spawning

TESTS = Path(__file__).resolve().parent


def _functions(name: str) -> set[str]:
    tree = ast.parse((TESTS / name).read_text())
    return {node.name for node in tree.body if isinstance(node, ast.FunctionDef)}


def test_the_readme_cases_named_are_its_blocks():
    from tests.test_readme import BLOCKS, block_ids

    named = [entry.split("[")[1].rstrip("]") for entry in IN_PROCESS if entry.startswith("test_readme.py::")]
    assert named and set(named) <= set(block_ids())
    for case in named:  # none of them starts MPI ranks: no `autostrat run` without --backend local, no run.sh
        text = BLOCKS[int(case.split("-")[0])][1]
        assert "run.sh" not in text and all("--backend local" in line for line in text.splitlines() if "autostrat run" in line), case


def test_every_listed_file_and_test_exists():
    for name in SPAWNING:
        assert (TESTS / name).is_file(), name
    for entry in IN_PROCESS | SPAWNING_TESTS:
        name, test = entry.split("::")
        assert test.split("[")[0] in _functions(name), entry
    assert all(entry.split("::")[0] in SPAWNING for entry in IN_PROCESS)
    assert not any(entry.split("::")[0] in SPAWNING for entry in SPAWNING_TESTS)


def test_every_test_named_for_mpi_ranks_is_in_the_spawning_unit():
    # Run beside another MPI job, one failed in MPI_Init (UCX: "message truncated" in the
    # world's Allgather) while test_mpi's fault test ran: a new MPI test must join the unit.
    for path in sorted(set(TESTS.glob("test_*.py")) - {Path(__file__)}):
        for name in _functions(path.name):
            if name.startswith("test_") and "mpi_ranks" in name:
                assert spawning(f"tests/{path.name}::{name}"), f"{path.name}::{name}"
