"""`autostrat solve FILE [SECONDS]`: solve an IOPDDL instance (github.com/google/iopddl) as the
contest's binary did — progress lines `# cost C bound B after T s`, then as the last line the
solution `[s0, s1, ...]` (`[]` when none fits the memory limit; the exit status is then 1).

The time counts from the process's start (reading the file included) where the system says when
that was (Linux's /proc), else from the command's start; a call of `autostrat.cli.main` with
its own arguments (a test, a script) counts from that call.
"""

from __future__ import annotations

import json
import math
import os
import re
import time
from pathlib import Path

from autostrat.errors import ConfigError
from autostrat.runtime.threads import usable_cores
from autostrat.search.solve.instance import read_instance
from autostrat.search.solve.solver import solve

# The contest's time limits by the instance's letter (asplos-contest/2025, IOPDDL.md).
LIMITS = (("ABCDE", 60.0), ("FGHIJ", 120.0), ("KLMNO", 180.0), ("PQRST", 240.0), ("UVWXY", 300.0))
DEFAULT_SECONDS = 60.0
EXIT_MARGIN = 1.0  # seconds kept for printing the solution and leaving (0.15 s measured on C)


def contest_seconds(path) -> float:
    """The contest's limit for the instance's letter (`...-A.json.gz`), else 60 s.

    Example:
        >>> contest_seconds("asplos-2025-iopddl-K.json.gz"), contest_seconds("example.json")
        (180.0, 60.0)
    """
    found = re.search(r"(?:^|[-_])([A-Y])\.json(?:\.gz)?$", Path(path).name)
    if found:
        return next(seconds for letters, seconds in LIMITS if found.group(1) in letters)
    return DEFAULT_SECONDS


def running_seconds() -> float:
    """Seconds since this process started (0 where the system does not say)."""
    try:
        start_ticks = float(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return max(uptime - start_ticks / os.sysconf("SC_CLK_TCK"), 0.0)
    except (OSError, ValueError, IndexError):
        return 0.0


def solve_command(args, write=print) -> int:
    """Run `autostrat solve` for parsed `args` (file, seconds, json, seed, workers, started: when the
    command began, None for the process's start); the exit status."""
    began = time.perf_counter() - running_seconds() if args.started is None else args.started
    seconds = contest_seconds(args.file) if args.seconds is None else args.seconds
    instance = read_instance(args.file)
    left = seconds - (time.perf_counter() - began) - EXIT_MARGIN
    if left <= 0:
        raise ConfigError(f"{args.file}: reading the instance took the whole {seconds:g} s; give more seconds")
    workers = args.workers if args.workers is not None else min(2, usable_cores())
    before = time.perf_counter() - began  # progress times count from the start, as the limit does
    result = solve(instance, left, seed=args.seed, workers=workers,
                   progress=lambda cost, bound, at: write(f"# cost {cost:.0f} bound {bound:.0f} after {before + at:.1f} s"))
    if result.cost is None:
        write(f"# infeasible: the smallest peak found, {result.peak}, is above the usage limit {instance.limit}")
    else:
        write(f"# cost {result.cost} bound {result.bound:.0f} after {time.perf_counter() - began:.1f} s "
              f"(peak {result.peak} of {instance.limit})")
    if args.json:
        bound = result.bound if math.isfinite(result.bound) else None  # none: infeasible, or a fallback's
        write(json.dumps({"cost": result.cost, "lower_bound": bound, "peak": result.peak,
                          "usage_limit": instance.limit, "seconds": round(time.perf_counter() - began, 3),
                          "rounds": result.rounds}))
    write("[" + ", ".join(map(str, result.solution)) + "]")
    return 0 if result.cost is not None else 1
