"""Imports only go downward through the layers of DESIGN.md section 2."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "autostrat"

# Lower index = lower layer. A module may import its own layer and any lower one.
LAYERS = [
    ["errors", "io", "protobuf", "reading", "tables"],
    ["layout"],
    ["rules"],
    ["cost"],
    ["strategies"],
    ["redistribution"],
    ["ir"],
    ["autodiff"],
    ["search"],
    ["runtime"],
    ["frontend", "ops", "nn", "models"],
    # MindSpore paths (DESIGN section 2): communication, common, context, dataset, parallel, train
    ["report", "plan_diff", "plan_source", "cli", "cli_outputs", "cli_parser", "cli_solve", "entry", "__main__", "__init__", "communication", "common",
     "context", "dataset", "parallel", "train"],
]
LEVEL = {name: index for index, names in enumerate(LAYERS) for name in names}


def _component(module: Path) -> str:
    parts = module.relative_to(PACKAGE).parts
    return parts[0].removesuffix(".py")


def _imported_components(module: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(module.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("autostrat."):
            found.add(node.module.split(".")[1])
        elif isinstance(node, ast.Import):
            found.update(a.name.split(".")[1] for a in node.names if a.name.startswith("autostrat."))
    return found


MODULES = sorted(PACKAGE.rglob("*.py"))


@pytest.mark.parametrize("module", MODULES, ids=lambda m: str(m.relative_to(PACKAGE)))
def test_imports_only_go_downward(module):
    own = _component(module)
    assert own in LEVEL, f"{module} is in no layer of DESIGN.md; add it to LAYERS"
    for imported in _imported_components(module):
        assert imported in LEVEL, f"{module} imports autostrat.{imported}, which is in no layer"
        assert LEVEL[imported] <= LEVEL[own], f"{module} ({own}) imports the higher layer {imported}"
