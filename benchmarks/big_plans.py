"""Issue #33: planning a 405B LLaMA shape for 16 384 devices takes <= 30 s and <= 2 GB.

Two commands, each in its own process as a user runs them (`python -m autostrat`):

- search: ``autostrat search configs/big/llama_405b.yaml --out PLAN.json`` (a training step of
  LLaMA 3.1 405B, sequence 8192, global batch 2048, bf16, 16 384 devices, no seeds: sharding
  propagation, fitted into the profile's 80 GiB; its strategies alone fit no plan there (the
  peak floor, `search.memory.peak_floor`), so the plan is the first known start that fits,
  Megatron-LM's tp 8 x pp 16 x dp 128 (`report.fitting_starts`); its table printed and its JSON
  written);
- estimate: ``autostrat estimate configs/estimate/llama_405b.yaml --json OUT.json`` (the same
  shape as Llama 3's paper plans it: tp 8 x pp 16 x dp 128, sequence parallelism, full
  recompute, ZeRO 1; the 126 blocks on 16 stages, 7 on the outermost, 8 on the others).

Per command: wall seconds, CPU seconds (user + system of the reaped child, `os.wait4`), peak
resident memory (its ru_maxrss), each against the target, and the 1-minute load average when it
started (the machine may be shared: wall seconds under load are rough, CPU seconds less so).
A command that fails prints its exit status and the last line it wrote to standard error.

Run: .venv/bin/python benchmarks/big_plans.py [--only search estimate] [--repeat N]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run as a script: the repository is not installed

from autostrat.tables import format_table  # noqa: E402

TARGET_SECONDS, TARGET_BYTES = 30.0, 2e9  # issue #33's Done-when
COMMANDS = {
    "search": lambda out: ["search", str(ROOT / "configs" / "big" / "llama_405b.yaml"), "--out", str(out)],
    "estimate": lambda out: ["estimate", str(ROOT / "configs" / "estimate" / "llama_405b.yaml"), "--json", str(out)],
}


def measure(name: str, folder: Path) -> dict:
    """Run command `name` in a child process; its wall and CPU seconds and peak RSS in bytes."""
    load = os.getloadavg()[0]
    command = [sys.executable, "-m", "autostrat", *COMMANDS[name](folder / f"{name}.json")]
    with open(folder / f"{name}.err", "w") as errors:
        started = time.perf_counter()
        child = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=errors, cwd=ROOT)
        _, status, usage = os.wait4(child.pid, 0)
        wall = time.perf_counter() - started
    lines = (folder / f"{name}.err").read_text().strip().splitlines()
    return {"name": name, "wall": wall, "cpu": usage.ru_utime + usage.ru_stime, "rss": usage.ru_maxrss * 1024,
            "load": load, "status": os.waitstatus_to_exitcode(status), "last": lines[-1] if lines else ""}


def row(result: dict) -> list[str]:
    fits = result["wall"] <= TARGET_SECONDS and result["rss"] <= TARGET_BYTES and result["status"] == 0
    return [result["name"], f"{result['wall']:.1f}", f"{result['cpu']:.1f}", f"{TARGET_SECONDS:g}",
            f"{result['rss'] / 1e9:.2f}", f"{TARGET_BYTES / 1e9:g}", "yes" if fits else "no", f"{result['load']:.1f}",
            "ok" if result["status"] == 0 else f"exit {result['status']}: {result['last']}"]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", choices=sorted(COMMANDS), default=list(COMMANDS))
    parser.add_argument("--repeat", type=int, default=1, help="runs of each command (default 1)")
    args = parser.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory(prefix="big-plans-") as folder:
        for _ in range(args.repeat):
            for name in args.only:
                rows.append(row(measure(name, Path(folder))))
                print(" ".join(rows[-1][:3]), file=sys.stderr, flush=True)  # a long run shows progress
    print(format_table(["command", "wall s", "CPU s", "target s", "peak GB", "target GB", "within", "load", "status"], rows))


if __name__ == "__main__":
    main()
