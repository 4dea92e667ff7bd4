"""MindSpore's eight parallel documentation samples (issue #31), each run unchanged but for its
imports on 8 MPI ranks with the check against one device on; one row per sample: exit status,
seconds, and the lines the run printed about what its settings did and its check.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/mindspore_samples.py [SAMPLE ...]

The samples, the renaming and the synthetic MNIST are tests/mindspore_samples.py's; the
suite asserts the same lines (tests/test_mindspore_samples.py).
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.mindspore_samples import SAMPLE_FILES, run_sample  # noqa: E402

SHOWN = ("planned", "global batch", "sharded", "recomputed", "pipeline:", "IR dumped", "strategy checkpoint", "checked against",
         "(limit")


def main(names: list[str]) -> int:
    failed = 0
    print(f"{'sample':<32} {'rc':>3} {'seconds':>8}  what the run printed")
    for name in names or sorted(SAMPLE_FILES):
        with tempfile.TemporaryDirectory(prefix=f"sample-{name}-") as folder:
            started = time.perf_counter()
            run = run_sample(name, Path(folder), ranks=8)
            seconds = time.perf_counter() - started
        lines = [line.strip() for line in run.stdout.splitlines() if any(key in line for key in SHOWN)]
        print(f"{name:<32} {run.returncode:>3} {seconds:>8.1f}  {lines[0] if lines else run.stderr[-300:]}")
        for line in lines[1:]:
            print(f"{'':<46}{line[:200]}")
        failed += run.returncode != 0
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
