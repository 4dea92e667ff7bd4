"""Shared pytest options: `--update-golden` rewrites golden files instead of comparing."""

from __future__ import annotations

from pathlib import Path

import pytest

from autostrat import nn

GOLDEN = Path(__file__).parent / "golden"


@pytest.fixture(autouse=True)
def fresh_parameter_seeds():
    """Every test's parameters draw their seeds from a generator reset to 0, as if the test ran
    alone: initial weights (and the float32 rounding that training checks compare within 1e-05)
    no longer depend on which tests ran before. Adding tests once moved a draw of the Adam
    checks in test_training past that limit (1.1e-05 and 1.5e-05)."""
    nn.set_seed(0)


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
