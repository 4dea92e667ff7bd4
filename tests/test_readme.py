"""Every code block of the README runs as written (one test per block).

Python blocks run as scripts and bash blocks line by line, in a fresh folder holding links to
the checkout's `.venv`, `configs/` and `sample_code/`, so what they write lands there. Two lines are not run:
`bash run.sh test` is the command that runs this very suite, the JSON block is a rank table,
which is validated instead, and the YAML block a hardware profile, read as one. `bash run.sh N` changes into the checkout itself, as it would for a
user.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from autostrat.frontend.hardware_file import read_hardware_file
from autostrat.runtime.rank_table import parse_rank_table

ROOT = Path(__file__).resolve().parent.parent
BLOCKS = re.findall(r"```(\w+)\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
NOT_RUN = ("bash run.sh test",)  # the suite itself


def workspace(tmp_path: Path) -> Path:
    for name in (".venv", "configs", "sample_code"):
        (tmp_path / name).symlink_to(ROOT / name)
    return tmp_path


def block_ids():
    return [f"{index}-{language}" for index, (language, _) in enumerate(BLOCKS)]


def test_the_readme_has_its_blocks():
    assert [language for language, _ in BLOCKS].count("python") >= 2 and len(BLOCKS) >= 7


@pytest.mark.slow
@pytest.mark.parametrize("language,text", BLOCKS, ids=block_ids())
def test_readme_block_runs_as_written(tmp_path, language, text):
    folder = workspace(tmp_path)
    if language == "python":
        (folder / "block.py").write_text(text)
        done = subprocess.run([sys.executable, "block.py"], cwd=folder, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
    elif language == "json":
        assert parse_rank_table(json.loads(text), "README rank table").device_num == 4
    elif language == "yaml":
        (folder / "my_cluster.yaml").write_text(text)
        assert read_hardware_file(folder / "my_cluster.yaml").matmul_efficiency == 0.6
    else:
        assert language == "bash"
        for line in filter(None, (line.strip() for line in text.splitlines())):
            if line.startswith(NOT_RUN):
                continue
            cwd = ROOT if line.startswith("bash run.sh") else folder
            done = subprocess.run(["bash", "-c", line], cwd=cwd, capture_output=True, text=True, timeout=300)
            assert done.returncode == 0, f"{line}\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
