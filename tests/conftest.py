"""Shared pytest options: `--update-golden` rewrites golden files instead of comparing."""

from __future__ import annotations

from pathlib import Path

import pytest

GOLDEN = Path(__file__).parent / "golden"


def pytest_addoption(parser):
    parser.addoption("--update-golden", action="store_true", help="rewrite golden files (review the diff)")


@pytest.fixture
def golden(request):
    """Compare text with tests/golden/NAME, or rewrite it with --update-golden."""

    def check(name: str, text: str) -> None:
        path = GOLDEN / name
        if request.config.getoption("--update-golden"):
            path.write_text(text)
        assert path.exists(), f"missing golden file {path}; run pytest --update-golden and review it"
        assert text == path.read_text(), f"{name} differs from its golden file (pytest --update-golden to accept)"

    return check
