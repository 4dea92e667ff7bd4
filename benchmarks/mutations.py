"""Break autostrat on purpose, one mutation at a time, and show which end-to-end checks fail.

Each mutation (`MUTATIONS`) is data: a file, an exact snippet of it, its replacement and the
end-to-end tests that must catch it (runs checked against the JAX reference, bytes counted at
the send against the prediction, peaks measured from the arrays a rank holds against the
prediction, the search's plan against brute force, the pipeline split against every split). For each, the tracked files of this repository are copied into a scratch
folder, the snippet (which must occur exactly once, or the script refuses: the table must never
test an unmutated tree) is replaced there, and pytest runs the mutation's tests with the scratch
copy first on ``PYTHONPATH`` and as the current folder. MPI ranks inherit that path (the
launcher starts them with ``python -P`` and ``PYTHONSAFEPATH``, which keep the current folder
off the path but not ``PYTHONPATH``), and the script checks that a Python started that way
imports autostrat from the scratch copy. The unmutated copy runs every listed test first and
must pass, or the table means nothing (a test failing there runs once more, and the line saying
so shows what it said the first time).

Run from the repository root: ``python benchmarks/mutations.py [--only NAME]... [--list]``.
Prints a table mutation | file | tests run | failed | caught by | caught?, then the first line
of what each failing test said; exits 1 when a mutation survives its tests, 2 on a refused
mutation, a failing baseline or a pytest run that found no verdict.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ElementTree
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # autostrat.tables and autostrat.errors of this checkout

from autostrat.errors import ConfigError  # noqa: E402
from autostrat.tables import format_table  # noqa: E402

RUN_TIMEOUT = 1800  # seconds for one pytest run; past it the table has no verdict and the script stops


@dataclass(frozen=True)
class Mutation:
    """One deliberate bug: in `path`, the one occurrence of `find` becomes `replace`; `tests`
    (pytest node ids or files, relative to the repository root) must catch it."""

    name: str
    path: str
    find: str
    replace: str
    tests: tuple[str, ...]


_TRAFFIC = "tests/test_wire.py::test_the_measured_device_traffic_is_the_predicted_one"
_CONFIG_RUN = "tests/test_runtime.py::test_config_matches_single_device_and_predicted_bytes"
_PEAKS = "tests/test_memory_measured.py"

MUTATIONS = (
    Mutation(
        "ring-dk-dv-unpriced", "autostrat/cost/ring.py",
        '"FlashAttentionScoreKeyValueGrad": (2, 1)',
        '"FlashAttentionScoreKeyValueGrad": (2, 0)',
        ("tests/test_ring_attention.py::test_bytes_counted_on_the_wire_equal_the_prediction",
         "tests/test_context_parallel.py::test_ring_backward_trains_like_one_device"),
    ),
    Mutation(
        "ring-blocks-misplaced", "autostrat/runtime/kernels/ring_attention.py",
        "        part = partial_attention(query, k, v, scale, causal, query_offset, owner * key.shape[2])\n",
        "        part = partial_attention(query, k, v, scale, causal, query_offset, ring.position * key.shape[2])\n",
        ("tests/test_oracle.py::test_every_candidate_matches_the_single_device_result[FlashAttentionScore]",
         "tests/test_context_parallel.py::test_ring_form_trains_like_one_device",
         "tests/test_mpi.py::test_the_three_context_parallel_forms_train_on_8_mpi_ranks"),
    ),
    Mutation(
        "allgather-priced-0", "autostrat/cost/collective.py",
        '    if kind == "AllGather":\n        return (g - 1) * s\n',
        '    if kind == "AllGather":\n        return 0\n',
        (_TRAFFIC, f"{_CONFIG_RUN}[ffn-8]", f"{_CONFIG_RUN}[gpt-8]", "tests/test_mpi.py::test_config_on_8_mpi_ranks[ffn]"),
    ),
    Mutation(
        "allgather-counted-0", "autostrat/runtime/wire.py",
        "        return (yield from self._ring_gather(pieces, [piece.shape] * len(group), group))\n",
        "        counted = len(self.sent)\n"
        "        pieces = yield from self._ring_gather(pieces, [piece.shape] * len(group), group)\n"
        "        del self.sent[counted:]\n"
        "        return pieces\n",
        (_TRAFFIC, f"{_CONFIG_RUN}[ffn-8]", f"{_CONFIG_RUN}[gpt-8]", "tests/test_mpi.py::test_config_on_8_mpi_ranks[ffn]"),
    ),
    Mutation(
        "relu-leaky", "autostrat/runtime/kernels/elementwise.py",
        '    "ReLU": lambda x: np.maximum(x, 0),\n',
        '    "ReLU": lambda x: np.where(x > 0, x, 0.01 * x),\n',
        (f"{_CONFIG_RUN}[ffn-8]", f"{_CONFIG_RUN}[mlp-8]", "tests/test_reference.py::test_autostrat_alone_equals_jax_on_every_tensor",
         "tests/test_training.py::test_tutorial_ffn_trains_20_momentum_steps_like_stand_alone_and_bytes_match",
         "tests/test_mpi.py::test_config_on_8_mpi_ranks[ffn]"),
    ),
    Mutation(
        "live-bytes-x1.1", "autostrat/cost/live_bytes.py",
        "        self.high = self.live + sum(written.values()) - reused\n",
        "        self.high = int((self.live + sum(written.values()) - reused) * 1.1)\n",
        (f"{_PEAKS}::test_measured_peak_of_the_tutorial_is_within_5_percent",
         f"{_PEAKS}::test_measured_peak_of_a_training_config_is_within_5_percent",
         "tests/test_prediction.py::test_the_predicted_peak_is_what_every_rank_measures_on_random_choices"),
    ),
    Mutation(
        "adam-moment-x1.15", "autostrat/runtime/kernels/optimizer.py",
        "    v = v * b2 + (1 - b2) * gradient * gradient\n",
        "    v = (v * b2 + (1 - b2) * gradient * gradient) * np.asarray(1.15, dtype)\n",
        ("tests/test_reference.py::test_autostrat_alone_equals_jax_on_every_tensor[adam]",
         "tests/test_reference.py::test_a_run_names_jax_and_its_worst_tensor",
         "tests/test_runtime.py::test_a_training_run_checks_every_loss_and_the_final_parameters",
         "tests/test_training.py::test_gpt_two_layers_trains_with_adam_like_stand_alone"),
    ),
    Mutation(
        "gradient-allreduce-dropped", "autostrat/runtime/stream.py",
        "        return (yield from backend.allreduce_steps(piece, step.group, step.reduce_op, step.algorithm))\n",
        '        if step.phase == "sync":\n'
        "            return piece.copy()\n"
        "        return (yield from backend.allreduce_steps(piece, step.group, step.reduce_op, step.algorithm))\n",
        ("tests/test_training.py::test_tutorial_ffn_trains_20_momentum_steps_like_stand_alone_and_bytes_match",
         "tests/test_runtime.py::test_a_training_run_checks_every_loss_and_the_final_parameters",
         "tests/test_mpi.py::test_a_training_config_trains_on_8_mpi_ranks"),
    ),
    Mutation(
        "main-copy-dropped", "autostrat/runtime/sixteen_bit.py",
        "        arrays[0] = store[instruction.main[0]]\n",
        "        arrays[0] = widened(np.asarray(inputs[0]))  # each step from the 16-bit weight\n",
        ("tests/test_sixteen_bit.py::test_main_copies_accumulate_updates_below_the_sixteen_bit_spacing_as_the_reference",),
    ),
    Mutation(
        "sixteen-bit-results-unrounded", "autostrat/runtime/sixteen_bit.py",
        "    if not dtype or array.dtype.name == dtype:\n",
        "    if True:\n",
        ("tests/test_sixteen_bit.py::test_sixteen_bits_move_half_the_bytes_and_bf16_syncs_its_fp32_gradients",
         "tests/test_sixteen_bit.py::test_fp16_with_a_loss_scale_trains_the_tiny_llama_on_local_ranks_like_the_reference"),
    ),
    Mutation(
        "solver-returns-start", "autostrat/search/refine.py",
        "    best = min(candidates, key=lambda s: s.bytes)",
        "    best = _hint_start(known, budget)",
        ("tests/test_refine.py::test_cpsat_equals_brute_force_and_never_loses_to_bfs",
         "tests/test_refine.py::test_mindspore_conflict_case_refined_plan_costs_no_more_than_bfs",
         "tests/test_refine.py::test_without_seeds_the_gpt_plan_sends_no_more_than_megatron"),
    ),
    Mutation(
        "fanouts-merged-at-first-cost", "autostrat/search/sharing.py",
        "        merged[key] = CoarseFanout(first.producer, first.costs + fanout.costs, readers, first.resting)\n",
        "        merged[key] = CoarseFanout(first.producer, first.costs, readers, first.resting)\n",
        ("tests/test_coarsen.py::test_merged_fanouts_price_every_choice_as_its_plan_pays",
         "tests/test_coarsen.py::test_merged_fanouts_give_the_unmerged_optimum_with_fewer_booleans"),
    ),
    Mutation(
        "partial-entry-bound-doubled", "autostrat/search/entry_bounds.py",
        "    return receive_bound(problem.spaces[0], goal[1])(start[1])\n",
        "    return 2 * receive_bound(problem.spaces[0], goal[1])(start[1])\n",
        ("tests/test_entry_bounds.py::test_no_bound_exceeds_its_entry_on_a_training_step",
         "tests/test_propagation.py::test_branch_and_bound_chooses_what_pricing_every_candidate_chooses"),
    ),
    Mutation(
        "floor-scores-doubled", "autostrat/report/memory_floor.py",
        "            kept += scores * size + scores * (size + 1) * self.attention_dropout\n",
        "            kept += 2 * scores * size + scores * (size + 1) * self.attention_dropout\n",
        ("tests/test_memory_floor.py::test_the_floor_is_below_every_peak_and_near_it_without_recompute",),
    ),
    Mutation(
        "choice-key-without-row", "autostrat/search/candidate_prices.py",
        '        return "row", self.table, self.row, None if self.free is None else self.free.tobytes()\n',
        '        return "row", self.table, None if self.free is None else self.free.tobytes()\n',
        ("tests/test_propagation.py::test_remembered_choices_are_the_choices_priced_again",),
    ),
    Mutation(
        "plan-gap-inverted", "autostrat/report/plan_results.py",
        "        return 0.0 if bound is None or bound >= self.best.step_ns else self.best.step_ns / max(bound, 1) - 1\n",
        "        return 0.0 if bound is None or bound >= self.best.step_ns else 1 - bound / self.best.step_ns\n",
        ("tests/test_plan_space.py::test_candidates_left_unpriced_bound_how_much_faster_the_space_can_be",),
    ),
    Mutation(
        "pricing-deadline-ignored", "autostrat/report/plan_pricing.py",
        "    return deadline is not None and time.time() >= deadline\n",
        "    return False\n",
        ("tests/test_plan_pricing.py::test_with_a_deadline_workers_price_and_nothing_is_claimed_after_it",),
    ),
    Mutation(
        "stage-split-sum", "autostrat/search/stages.py",
        "                found = (max(before[0], cost), before[1] + (n,))\n",
        "                found = (before[0] + cost, before[1] + (n,))\n",
        ("tests/test_pipeline.py::test_the_searched_split_of_a_real_model_is_the_best_of_every_split",
         "tests/test_stages.py::test_the_least_slowest_stage_split_is_the_brute_force_one",
         "tests/test_stages.py::test_past_every_split_the_descent_is_no_slower_than_the_least_slowest_stage"),
    ),
    Mutation(
        "virtual-clock-stamps-ignored", "autostrat/runtime/pipeline_clock.py",
        "                    now = max(now, stamps[key].popleft())\n",
        "                    stamps[key].popleft()\n",
        ("tests/test_pipeline_clock.py::test_the_clock_composed_along_the_messages_gives_the_bubble_drawn_by_hand",
         "tests/test_pipeline_clock.py::test_a_later_send_stamp_than_the_receivers_clock_sets_the_clock"),
    ),
    Mutation(
        "dropout-grad-ignores-mask", "autostrat/runtime/kernels/grad.py",
        "    return np.where(mask, dy / keep_prob, 0).astype(dy.dtype)\n",
        "    return (dy / keep_prob).astype(dy.dtype)\n",
        ("tests/test_dropout.py::test_a_gpt_with_dropout_on_8_ranks_equals_jax",),
    ),
    Mutation(
        "dropout-mask-4-bytes", "autostrat/ir/dtypes.py",
        'return (dtype, "bool") if op_type == "Dropout" else (dtype,) * count',
        'return (dtype, dtype) if op_type == "Dropout" else (dtype,) * count',
        ("tests/test_published.py::test_a_gpt_layer_with_dropout_keeps_34_sbh_plus_5_as2b_bytes",),
    ),
    Mutation(
        "held-blocks-never-freed", "autostrat/runtime/held_memory.py",
        "            self.total -= size\n",
        "            pass\n",
        ("tests/test_memory_measured.py::test_held_blocks_kept_as_arrays_come_and_go_are_what_a_walk_of_them_finds",
         "tests/test_memory_measured.py::test_held_memory_is_what_tracemalloc_traces_in_numpys_domain"),
    ),
    Mutation(
        "floor-seeded-sums-as-shards", "autostrat/report/memory_floor.py",
        "    summed_shards = 1 if activations is not None and given.sequence_parallel else shards\n",
        "    summed_shards = shards\n",
        ("tests/test_memory_floor.py::test_under_zero_the_sums_count_as_shards_but_whole_where_sequence_parallelism_seeds_them",),
    ),
    Mutation(
        "floor-sums-whole-under-zero", "autostrat/report/memory_floor.py",
        "    shards = given.dp if given.zero else 1",
        "    shards = 1",
        ("tests/test_memory_floor.py::test_the_floor_holds_where_the_weights_and_their_sums_dominate",),
    ),
    Mutation(
        "stream-idle-messages-kept", "autostrat/runtime/stream.py",
        "            del self.backend.sent[before:]\n",
        "            pass\n",
        ("tests/test_overlap.py::test_the_stream_moved_from_inside_a_blocking_wait_keeps_its_messages_off_the_waiting_instruction",),
    ),
    Mutation(
        "job-step-own-rank", "autostrat/runtime/job.py",
        "    first = np.min([v[1:1 + count] for v in gathered], axis=0)\n",
        "    first = np.max([v[1:1 + count] for v in gathered], axis=0)\n",
        ("tests/test_host_profile.py::test_the_job_step_runs_from_the_first_start_to_the_last_end_on_one_host_and_is_the_slowest_rank_across_hosts",),
    ),
    Mutation(
        "crowded-wait-uncapped", "autostrat/search/prediction.py",
        "        return round(min(hardware.collective_wait * since, hardware.collective_wait_most * 1e9))\n",
        "        return round(hardware.collective_wait * since)\n",
        ("tests/test_host_profile.py::test_a_crowded_collective_waits_its_share_of_the_compute_before_it",),
    ),
)


@dataclass(frozen=True)
class Outcome:
    """What one pytest run reported: how many tests ran, the node ids of those that failed or
    errored, and per failed test the first line of its message."""

    ran: int
    failed: tuple[str, ...]
    reasons: tuple[str, ...] = ()


def mutated(text: str, mutation: Mutation) -> str:
    """`text` (the file `mutation.path`) with the mutation applied, refused unless its snippet
    occurs exactly once.

    Example:
        >>> mutated("x = 1\\n", Mutation("m", "a.py", "x = 1", "x = 2", ()))
        'x = 2\\n'
        >>> mutated("x = 1; x = 1", Mutation("m", "a.py", "x = 1", "x = 2", ()))
        Traceback (most recent call last):
        autostrat.errors.ConfigError: mutation m: expected its snippet exactly once in a.py, found it 2 time(s): 'x = 1'
    """
    count = text.count(mutation.find)
    if count != 1:
        raise ConfigError(f"mutation {mutation.name}: expected its snippet exactly once in {mutation.path}, "
                          f"found it {count} time(s): {mutation.find.strip()!r}")
    return text.replace(mutation.find, mutation.replace)


def mutate(root: Path, mutation: Mutation) -> None:
    """Apply `mutation` to the copy of the repository at `root` (see `mutated`)."""
    path = root / mutation.path
    path.write_text(mutated(path.read_text(), mutation))


def failed_tests(junit_xml: str) -> Outcome:
    """What a pytest junit XML report says (`Outcome`); skipped tests are not counted. Node ids
    are rebuilt from the report's dotted class names, whose trailing ``Test...`` parts are
    classes.

    Example:
        >>> report = ('<testsuites><testsuite><testcase classname="tests.test_a" name="test_x[1]">'
        ...           '<failure message="assert 1 == 2&#10;more"/></testcase>'
        ...           '<testcase classname="tests.test_a" name="test_y"/></testsuite></testsuites>')
        >>> failed_tests(report)
        Outcome(ran=2, failed=('tests/test_a.py::test_x[1]',), reasons=('assert 1 == 2',))
    """
    root = ElementTree.fromstring(junit_xml)
    ran, failed, reasons = 0, [], []
    for case in root.iter("testcase"):
        if case.find("skipped") is not None:
            continue
        ran += 1
        problem = case.find("failure") if case.find("failure") is not None else case.find("error")
        if problem is not None:
            failed.append(_node_id(case.get("classname", ""), case.get("name", "")))
            reasons.append((problem.get("message") or "").strip().split("\n")[0][:160])
    return Outcome(ran, tuple(failed), tuple(reasons))


def _node_id(classname: str, name: str) -> str:
    parts = classname.split(".")
    module = len(parts)
    while module > 1 and parts[module - 1].startswith("Test"):  # pytest's classes are named Test...
        module -= 1
    return "::".join(["/".join(parts[:module]) + ".py", *parts[module:], name])


def short(node_id: str) -> str:
    """A node id without the tests folder and the file suffix.

    Example:
        >>> short("tests/test_wire.py::test_traffic[ffn]")
        'test_wire::test_traffic[ffn]'
    """
    path, _, rest = node_id.partition("::")
    return f"{Path(path).stem}::{rest}"


def scratch_copy(destination: Path) -> None:
    """Copy the files git tracks in this checkout, as they are on disk, into `destination`."""
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    for name in filter(None, listed.split("\0")):
        source = ROOT / name
        if source.is_file():
            (destination / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, destination / name)


def scratch_environment(root: Path) -> dict[str, str]:
    """This environment with `root` alone on PYTHONPATH (MPI ranks inherit it) and no bytecode
    written into the scratch copy."""
    return dict(os.environ) | {"PYTHONPATH": str(root), "PYTHONDONTWRITEBYTECODE": "1"}


def check_imports_from(root: Path) -> None:
    """Refuse unless a Python started as the launcher starts a rank (``-P``, PYTHONSAFEPATH,
    another current folder) imports autostrat from `root`."""
    env = scratch_environment(root) | {"PYTHONSAFEPATH": "1"}
    done = subprocess.run([sys.executable, "-P", "-c", "import autostrat; print(autostrat.__file__)"], cwd=tempfile.gettempdir(),
                          env=env, capture_output=True, text=True, check=True)
    found = Path(done.stdout.strip()).resolve()
    if not found.is_relative_to(root.resolve()):
        raise ConfigError(f"a rank would import autostrat from {found}, expected the scratch copy {root}")


def run_tests(root: Path, tests: tuple[str, ...]) -> Outcome:
    """Run `tests` with pytest in the copy at `root` (one process, no xdist workers)."""
    report = root / "mutation-junit.xml"
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", "0", "-q", f"--junitxml={report}", *tests]
    try:
        done = subprocess.run(command, cwd=root, env=scratch_environment(root), capture_output=True, text=True, timeout=RUN_TIMEOUT)
    except subprocess.TimeoutExpired:
        raise ConfigError(f"pytest ran {' '.join(tests)} past {RUN_TIMEOUT} s: no verdict") from None
    # pytest's exit status: 0 all passed, 1 some failed; anything else means the tests did not run as listed.
    if done.returncode not in (0, 1) or not report.exists():
        tail = "\n".join((done.stdout + done.stderr).splitlines()[-15:])
        raise ConfigError(f"pytest could not run {' '.join(tests)} (exit status {done.returncode}):\n{tail}")
    return failed_tests(report.read_text())


def run_mutation(mutation: Mutation | None, tests: tuple[str, ...]) -> Outcome:
    """`tests` on a fresh scratch copy with `mutation` applied (None: the unmutated baseline)."""
    with tempfile.TemporaryDirectory(prefix="autostrat-mutation-") as folder:
        root = Path(folder)
        scratch_copy(root)
        if mutation is not None:
            mutate(root, mutation)
        check_imports_from(root)
        return run_tests(root, tests)


def table_row(mutation: Mutation, outcome: Outcome) -> list[str]:
    """mutation | file | tests run | failed | caught by | caught?"""
    caught = bool(outcome.failed)
    return [mutation.name, mutation.path.removeprefix("autostrat/"), str(outcome.ran), str(len(outcome.failed)),
            ", ".join(map(short, outcome.failed)) or "-", "yes" if caught else "NO"]


def selected(names: list[str] | None) -> tuple[Mutation, ...]:
    """The mutations named (all by default); an unknown name is refused."""
    known = {mutation.name: mutation for mutation in MUTATIONS}
    unknown = [name for name in names or () if name not in known]
    if unknown:
        raise ConfigError(f"--only: expected one of {', '.join(known)}, got {', '.join(unknown)}")
    return tuple(known[name] for name in names) if names else MUTATIONS


def checked_baseline(tests: tuple[str, ...]) -> str:
    """Run `tests` on the unmutated copy; the tests that fail run once more (a loaded machine can
    trip an MPI rank's stall watchdog), and fail the baseline if they fail again. Returns the
    line that says how the baseline went.
    """
    baseline = run_mutation(None, tests)
    if not baseline.failed:
        return f"baseline: {baseline.ran} tests pass unmutated"
    again = run_mutation(None, baseline.failed)
    if again.failed:
        raise ConfigError("the unmutated tree fails its own checks: "
                          + "; ".join(f"{short(test)}: {reason}" for test, reason in zip(again.failed, again.reasons)))
    return (f"baseline: {baseline.ran} tests pass unmutated ({', '.join(map(short, baseline.failed))} failed once and "
            f"passed when run again; it said: {'; '.join(baseline.reasons)})")


def reasons(outcomes: dict[str, Outcome]) -> str:
    """One line per caught test: the mutation, the test and the first line of its failure."""
    return "\n".join(f"  {name} / {short(test)}: {reason}"
                     for name, outcome in outcomes.items() for test, reason in zip(outcome.failed, outcome.reasons))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", action="append", metavar="NAME", help="run this mutation only (repeatable)")
    parser.add_argument("--list", action="store_true", help="list the mutations and their tests, run nothing")
    args = parser.parse_args(argv)
    try:
        mutations = selected(args.only)
        if args.list:
            print(format_table(["mutation", "file", "tests"], [[m.name, m.path, " ".join(m.tests)] for m in mutations]))
            return 0
        for mutation in mutations:  # every snippet checked before anything runs
            mutated((ROOT / mutation.path).read_text(), mutation)
        print(checked_baseline(tuple(dict.fromkeys(test for m in mutations for test in m.tests))), flush=True)
        outcomes = {}
        for mutation in mutations:
            outcomes[mutation.name] = run_mutation(mutation, mutation.tests)
            print(f"{mutation.name}: {len(outcomes[mutation.name].failed)} failed", file=sys.stderr, flush=True)
    except ConfigError as error:
        print(f"mutations: error: {error}", file=sys.stderr)
        return 2
    rows = [table_row(mutation, outcomes[mutation.name]) for mutation in mutations]
    print(format_table(["mutation", "file", "tests run", "failed", "caught by", "caught?"], rows))
    print("what each failing test said:\n" + reasons(outcomes))
    return 0 if all(row[-1] == "yes" for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
