"""Options for the doctests of `autostrat` (the tests' own are in tests/conftest.py)."""

from __future__ import annotations

import tempfile

import pytest


@pytest.fixture(autouse=True)
def doctest_temporary_folders(request, tmp_path, monkeypatch):
    """A doc example's ``tempfile.mkdtemp()`` makes its folder under the example's `tmp_path`,
    which pytest removes with its old runs: examples stay plain Python, and the suite leaves no
    folder of theirs in the machine's temporary directory."""
    if isinstance(request.node, pytest.DoctestItem):
        monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
