"""Ranks on one machine share its cores (`runtime.threads`): the rule, and what a rank under
mpiexec ends up with, as OpenBLAS itself reports it (threadpoolctl asks the library)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from autostrat.runtime import launcher
from autostrat.runtime.mpi import SPINS
from autostrat.runtime.threads import THREAD_VARIABLES, CoreShare, core_share, usable_cores

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("environ, cores, expected", [
    ({"PMI_SIZE": "8"}, 2, CoreShare(1, True)),  # gforker: every rank here
    ({"PMI_SIZE": "2"}, 8, CoreShare(4, False)),
    ({"PMI_SIZE": "3"}, 8, CoreShare(2, False)),  # a core left idle rather than oversubscribed
    ({"PMI_SIZE": "2"}, 2, CoreShare(1, False)),
    ({"MPI_LOCALNRANKS": "4", "PMI_SIZE": "64"}, 16, CoreShare(4, False)),  # hydra: 4 of 64 ranks here
    ({"OMPI_COMM_WORLD_LOCAL_SIZE": "16"}, 8, CoreShare(1, True)),  # Open MPI
    ({"PMI_SIZE": "8", "OPENBLAS_NUM_THREADS": "4"}, 2, CoreShare(None, True)),  # the user's count stays
    ({"PMI_SIZE": "x"}, 2, CoreShare(None, False)),
    ({"PMI_SIZE": "0"}, 2, CoreShare(None, False)),
    ({}, 2, CoreShare(None, False)),  # not under a process manager
])
def test_the_cores_are_divided_among_the_ranks_on_the_machine(environ, cores, expected):
    assert core_share(environ, cores) == expected


def test_without_an_affinity_mask_every_core_of_the_machine_counts(monkeypatch):
    monkeypatch.delattr(os, "sched_getaffinity")  # macOS has none
    monkeypatch.setattr(os, "cpu_count", lambda: 3)
    assert usable_cores() == 3
    monkeypatch.setattr(os, "cpu_count", lambda: None)  # "undetermined"
    assert usable_cores() == 1


RANK_SCRIPT = """
import json, pathlib, sys, threadpoolctl
from autostrat.runtime.mpi import MpiBackend
backend = MpiBackend()
blas = [pool["num_threads"] for pool in threadpoolctl.threadpool_info() if pool["user_api"] == "blas"]
pathlib.Path(sys.argv[1], f"rank_{backend.rank}.json").write_text(json.dumps({"blas": blas, "spins": backend.spins}))
"""


@pytest.mark.parametrize("user_threads", [None, "2"])
def test_ranks_under_mpiexec_limit_their_blas_threads(tmp_path, user_threads):
    script = tmp_path / "threads.py"
    script.write_text(RANK_SCRIPT)
    env = {k: v for k, v in launcher.mpi_environment(4).items() if k not in THREAD_VARIABLES}
    env |= {"PYTHONPATH": str(ROOT), "MPIEXEC_TIMEOUT": "60"} | ({"OPENBLAS_NUM_THREADS": user_threads} if user_threads else {})
    command = [str(launcher.find_mpiexec()), "-n", "4", sys.executable, "-m", "mpi4py", str(script), str(tmp_path)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=90, env=env)
    assert done.returncode == 0, done.stderr
    ranks = [json.loads((tmp_path / f"rank_{rank}.json").read_text()) for rank in range(4)]
    cores = usable_cores()
    expected = int(user_threads) if user_threads else max(1, cores // 4)
    assert all(rank["blas"] and set(rank["blas"]) == {expected} for rank in ranks), ranks
    assert {rank["spins"] for rank in ranks} == ({0} if cores < 4 else {SPINS})


def test_mpiexec_yields_where_the_ranks_outnumber_the_cores_this_process_may_use(monkeypatch):
    # The affinity mask, not the machine's core count, decides (as the ranks' own share does).
    monkeypatch.delenv("MPIR_CVAR_ENABLE_HEAVY_YIELD", raising=False)
    monkeypatch.setattr(launcher, "usable_cores", lambda: 2)
    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    assert launcher.mpi_environment(4)["MPIR_CVAR_ENABLE_HEAVY_YIELD"] == "1"
    assert "MPIR_CVAR_ENABLE_HEAVY_YIELD" not in launcher.mpi_environment(2)
