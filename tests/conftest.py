"""Shared pytest options: `--update-golden` rewrites golden files instead of comparing."""

from __future__ import annotations

import compileall
import os
import shutil
import tempfile
from pathlib import Path

import pytest

from autostrat import nn
from autostrat.runtime.threads import core_share, usable_cores

GOLDEN = Path(__file__).parent / "golden"


@pytest.fixture(autouse=True)
def fresh_parameter_seeds():
    """Every test's parameters draw their seeds from a generator reset to 0, as if the test ran
    alone: initial weights (and the float32 rounding that training checks compare within 1e-05)
    no longer depend on which tests ran before. Adding tests once moved a draw of the Adam
    checks in test_training past that limit (1.1e-05 and 1.5e-05)."""
    nn.set_seed(0)


def pytest_configure(config):
    """Bytecode for autostrat written once (as `run.sh` writes it), so that the hundreds of
    processes the tests start (ranks, commands) read it instead of compiling every module again
    where PYTHONDONTWRITEBYTECODE is set.

    One JAX compilation cache on disk for the processes the tests start, in a new folder
    removed at the session's end. Every `autostrat run` computes its JAX reference in a new
    process, which compiled the same step of the same model again for each of the suite's
    dozens of runs (measured: the tutorial's first reference 3.6 s, 0.85 s from the cache).
    Set in the process that starts pytest-xdist's workers, so that they and every process they
    start inherit it. The tests' own process keeps its compiled steps in memory
    (`reference_jax.STEPS`) and reads no cache files: tests that make file operations fail
    would see JAX's warnings about its cache."""
    if not hasattr(config, "workerinput"):
        compileall.compile_dir(Path(__file__).resolve().parent.parent / "autostrat", quiet=2)
        share_blas_threads(config.getoption("numprocesses", None))
    if not hasattr(config, "workerinput") and "JAX_COMPILATION_CACHE_DIR" not in os.environ:
        config.jax_cache = tempfile.mkdtemp(prefix="autostrat-jax-cache-")
        os.environ["JAX_COMPILATION_CACHE_DIR"] = config.jax_cache
        os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"  # a small model compiles in under a second
    if hasattr(config, "workerinput") or not config.getoption("numprocesses", None):  # this process runs tests
        import jax

        jax.config.update("jax_enable_compilation_cache", False)


def share_blas_threads(workers) -> None:
    """The cores divided among pytest-xdist's `workers` for numpy's BLAS threads (unless a
    thread count is set), as `runtime.threads` divides them among MPI ranks: each worker's
    OpenBLAS would start a thread per core (measured: test_training and test_runtime in one
    process took 50.2 CPU-s, 45.4 with one BLAS thread). Set before the workers start, so they
    and the processes they start inherit it."""
    if isinstance(workers, int) and workers > 1:
        threads = core_share(os.environ | {"MPI_LOCALNRANKS": str(workers)}, usable_cores()).threads  # the workers as local ranks
        if threads is not None:
            os.environ |= dict.fromkeys(("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS"), str(threads))


def pytest_unconfigure(config):
    if getattr(config, "jax_cache", None):
        shutil.rmtree(config.jax_cache, ignore_errors=True)
        del os.environ["JAX_COMPILATION_CACHE_DIR"], os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"]


def pytest_addoption(parser):
    parser.addoption("--update-golden", action="store_true", help="rewrite golden files (review the diff)")


@pytest.fixture
def constructive_only(monkeypatch):
    """Every redistribution search stops after settling its start, so the planner answers with
    its constructive plan (memos cleared before and after)."""
    from autostrat.redistribution import search
    from autostrat.redistribution.memo import clear_memos

    clear_memos()
    monkeypatch.setattr(search, "SETTLED_LIMIT", 1)
    yield
    clear_memos()


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


# Test files whose tests start MPI ranks (8 processes each) or other Pythons by the dozen. With
# pytest-xdist's two workers (setup.cfg: -n 2) they run one after another on one worker, so that
# two jobs of 8 ranks never share the 2 cores and trip a rank's stall watchdog, while the other
# worker runs the in-process tests. test_readme and test_samples run the tutorial sample
# (bash run.sh N), which writes its run folder inside sample_code, as test_world's do.
SPAWNING = frozenset({"test_faults.py", "test_job_safety.py", "test_memory_measured.py", "test_mindspore_names.py", "test_mindspore_samples.py", "test_mpi.py",
                      "test_optimizer_shard.py", "test_pipeline.py", "test_readme.py", "test_recompute.py",
                      "test_recompute_choice.py", "test_samples.py", "test_world.py", "test_zero3.py"})


# The long tests of those files that start no MPI rank and write nothing there (read, each
# of them: local ranks, brute force, hypothesis; the README's blocks that search or run
# threads in their own folder), by function or by case: they run on either worker, beside
# the spawning ones, instead of in a row with them on one worker.
IN_PROCESS = frozenset({
    "test_memory_measured.py::test_measured_peak_of_a_small_gpt_is_within_5_percent",
    "test_memory_measured.py::test_measured_peak_of_a_training_config_is_within_5_percent",
    "test_memory_measured.py::test_measured_peak_of_the_tutorial_is_within_5_percent",
    "test_optimizer_shard.py::test_sharded_training_equals_one_device_with_the_predicted_bytes",
    "test_pipeline.py::test_a_checkpoint_of_two_stages_continues_on_four",
    "test_pipeline.py::test_a_parameter_read_on_two_stages_is_updated_once_and_sent_on",
    "test_pipeline.py::test_a_pipeline_sums_replicas_as_its_whole_batch_reference_does",
    "test_pipeline.py::test_every_schedule_runs_each_micro_batch_once_and_holds_what_the_split_model_says",
    "test_pipeline.py::test_micro_batches_alone_accumulate_gradients_like_one_big_batch",
    "test_pipeline.py::test_pipeline_training_equals_the_stand_alone_run",
    "test_pipeline.py::test_the_pipeline_config_runs_on_local_ranks_from_the_cli",
    "test_pipeline.py::test_the_searched_split_of_a_real_model_is_the_best_of_every_split",
    "test_recompute.py::test_recompute_trades_time_for_activation_memory",
    "test_recompute.py::test_recomputed_training_equals_one_device",
    "test_readme.py::test_readme_block_runs_as_written[1-python]",
    "test_readme.py::test_readme_block_runs_as_written[2-bash]",
    "test_readme.py::test_readme_block_runs_as_written[3-bash]",
    "test_readme.py::test_readme_block_runs_as_written[4-bash]",
    "test_readme.py::test_readme_block_runs_as_written[5-bash]",
    "test_readme.py::test_readme_block_runs_as_written[6-bash]",
    "test_readme.py::test_readme_block_runs_as_written[7-yaml]",
    "test_readme.py::test_readme_block_runs_as_written[8-bash]",
    "test_readme.py::test_readme_block_runs_as_written[12-python]",
    "test_readme.py::test_readme_block_runs_as_written[13-python]",
    "test_readme.py::test_readme_block_runs_as_written[14-bash]",
    "test_recompute_choice.py::test_auto_recompute_chooses_the_cheapest_count_that_fits",
    "test_recompute_choice.py::test_the_count_search_finds_the_brute_force_best",
    "test_recompute_choice.py::test_yaml_and_the_command_line_turn_auto_recompute_on",
    "test_world.py::test_every_config_runs_on_every_device_count_locally",
    "test_zero3.py::test_a_budget_makes_parameters_rest_sharded_and_training_still_equals_one_device",
    "test_zero3.py::test_the_budgeted_optimum_is_the_brute_force_one_over_every_storage_choice",
})


# The tests of other files that start MPI ranks: they join the one unit of work too.
SPAWNING_TESTS = frozenset({
    "test_cell_stages.py::test_model_train_of_the_marked_sample_on_8_mpi_ranks_checks_itself",
    "test_functional_loop.py::test_the_recompute_loop_runs_on_8_mpi_ranks",
    "test_job_file.py::test_mpi_ranks_refuse_a_changed_job",
    "test_layout_2d.py::test_both_samples_train_on_8_mpi_ranks_as_one_device",
    "test_pipeline_schedules.py::test_virtual_stage_schedules_train_on_4_mpi_ranks",
    "test_sixteen_bit.py::test_bf16_tiny_llama_trains_on_8_mpi_ranks_like_the_mixed_precision_reference",
})


def spawning(nodeid: str) -> bool:
    """Whether the test `nodeid` belongs to the one unit of work that starts processes.

    Example:
        >>> spawning("tests/test_mpi.py::test_config_on_8_mpi_ranks[ffn]"), spawning("tests/test_world.py::test_every_config_runs_on_every_device_count_locally[1-ffn]")
        (True, False)
    """
    path, _, test = nodeid.partition("::")
    name = Path(path).name
    function, case = f"{name}::{test.split('[', 1)[0]}", f"{name}::{test}"
    return function in SPAWNING_TESTS or (name in SPAWNING and function not in IN_PROCESS and case not in IN_PROCESS)


def pytest_xdist_make_scheduler(config, log):
    """Every `spawning` test in one unit of work, every other test in its own. (xdist's
    --dist loadgroup would do it with markers, but pytest 9.2 no longer reads the node ids
    xdist 3.8 rewrites for it.)"""
    from xdist.scheduler import LoadScopeScheduling

    class SpawningTogether(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return "spawning" if spawning(nodeid) else nodeid

    return SpawningTogether(config, log)
