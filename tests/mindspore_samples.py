"""Run MindSpore's documentation samples (tests/fixtures/mindspore_samples) with only their imports
renamed: `rename_imports` rewrites ``mindspore`` to ``autostrat`` in import statements and checks
that nothing else changed, `write_mnist` writes a small synthetic MNIST in MNIST's own file format,
and `run_sample` runs a renamed sample in a new folder, on 8 MPI ranks or as one process (the
ranks as threads), with DATA_PATH pointing at that data.

Example:
    >>> rename_imports("import mindspore as ms\\nfrom mindspore.communication import init\\nx = 'mindspore'\\n")
    "import autostrat as ms\\nfrom autostrat.communication import init\\nx = 'mindspore'\\n"
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from autostrat.runtime import launcher

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "tests" / "fixtures" / "mindspore_samples"
# The eight samples of issue #31, by the folder of docs/sample_code they come from.
SAMPLE_FILES = {
    "sharding_propagation": "sharding_propagation/train.py",
    "operator_parallel": "distributed_operator_parallel/distributed_operator_parallel.py",
    "operator_parallel_layout": "distributed_operator_parallel/advanced_distributed_operator_parallel.py",
    "optimizer_parallel": "distributed_optimizer_parallel/distributed_optimizer_parallel.py",
    "pipeline_parallel": "distributed_pipeline_parallel/distributed_pipeline_parallel.py",
    "recompute": "recompute/train.py",
    "strategy_saving": "model_saving_loading/train_saving.py",
    "high_dimension_tensor_parallel": "high_dimension_tensor_parallel/high_dimension_tensor_parallel.py",
}
MNIST_COUNT = 64  # images: with the samples' batch of 32, an epoch is 2 steps
_IMPORT = re.compile(r"^(\s*(?:from|import)\s+)mindspore(?=[.\s])", re.MULTILINE)


def _imports_as_mindspore(tree: ast.AST) -> str:
    """The dump of `tree` with every imported ``autostrat`` module named ``mindspore`` again."""
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "autostrat":
            node.module = "mindspore" + node.module[len("autostrat"):]
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "autostrat":
                    alias.name = "mindspore" + alias.name[len("autostrat"):]
    return ast.dump(tree)


def _imported_modules(tree: ast.AST) -> list[str]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.append(node.module)
        elif isinstance(node, ast.Import):
            found.extend(alias.name for alias in node.names)
    return found


def rename_imports(source: str) -> str:
    """`source` with ``mindspore`` renamed ``autostrat`` in its import statements, and only
    there: the renamed program's syntax tree, its imports named back, is the original's, and no
    import of ``mindspore`` is left."""
    renamed = _IMPORT.sub(r"\1autostrat", source)
    tree = ast.parse(renamed)
    left = [name for name in _imported_modules(tree) if name.split(".")[0] == "mindspore"]
    assert not left, f"imports of mindspore left after renaming: {left}"
    assert _imports_as_mindspore(tree) == ast.dump(ast.parse(source)), "renaming changed more than import statements"
    return renamed


def write_mnist(folder: Path, count: int = MNIST_COUNT, seed: int = 0) -> Path:
    """`count` random 28x28 uint8 images and labels 0-9 in MNIST's idx files
    (``train-images-idx3-ubyte``, ``train-labels-idx1-ubyte``: a big-endian magic number 2051 or
    2049, the counts, then the bytes) in `folder`, made if missing; returns `folder`."""
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 256, (count, 28, 28), dtype=np.uint8)
    labels = rng.integers(0, 10, count, dtype=np.uint8)
    folder.mkdir(parents=True, exist_ok=True)
    header = np.array([2051, count, 28, 28], dtype=">u4").tobytes()
    (folder / "train-images-idx3-ubyte").write_bytes(header + images.tobytes())
    (folder / "train-labels-idx1-ubyte").write_bytes(np.array([2049, count], dtype=">u4").tobytes() + labels.tobytes())
    return folder


@dataclass(frozen=True)
class SampleRun:
    returncode: int
    stdout: str
    stderr: str
    folder: Path  # where the sample ran (its current folder: what it wrote is there)


def prepare_sample(name: str, folder: Path) -> Path:
    """The renamed sample `name` (a key of SAMPLE_FILES) written into `folder`, with the synthetic
    MNIST in ``folder/MNIST_Data/train``; returns the script's path."""
    original = SAMPLES / SAMPLE_FILES[name]
    script = folder / original.name
    folder.mkdir(parents=True, exist_ok=True)
    script.write_text(rename_imports(original.read_text()))
    write_mnist(folder / "MNIST_Data" / "train")
    return script


def run_sample(name: str, folder: Path, ranks: int | None = 8, timeout: float = 600, check: bool = True) -> SampleRun:
    """Run the renamed sample `name` in `folder` (its current folder): on `ranks` MPI ranks
    (``mpiexec -n ranks python -m mpi4py script``, loopback only), or with `ranks` None as one
    process running 8 ranks as threads (``RANK_SIZE=8``). `check`: the run checks itself
    against one device (``AUTOSTRAT_CHECK=1``)."""
    script = prepare_sample(name, folder)
    env = dict(os.environ) | {"PYTHONPATH": str(ROOT), "DATA_PATH": str(folder / "MNIST_Data" / "train")}
    env["AUTOSTRAT_CHECK"] = "1" if check else "0"
    if ranks is None:
        command = [sys.executable, script.name]
        env["RANK_SIZE"] = "8"
    else:
        command = [str(launcher.find_mpiexec()), "-n", str(ranks), sys.executable, "-m", "mpi4py", script.name]
        env = launcher.mpi_environment(ranks) | env | {"MPIEXEC_TIMEOUT": str(int(timeout))}
        env.pop("RANK_SIZE", None)
    done = subprocess.run(command, cwd=folder, env=env, capture_output=True, text=True, timeout=timeout + 30)
    return SampleRun(done.returncode, done.stdout, done.stderr, folder)
