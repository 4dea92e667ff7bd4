"""Issue #14's fast paths keep results exact: lazy tables and memos price random layout pairs
at 64 and 1024 devices as the full search does, rank orders come out as the slow per-rank
formula gives them, mesh candidates are full candidates, and small worlds plan as before."""

from __future__ import annotations

import hashlib
import io
import itertools
import json
import math
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from autostrat.autodiff import Adam, build_training
from autostrat.errors import ConfigError
from autostrat.frontend import trace
from autostrat.frontend.config import apply_seeds, load_config
from autostrat.frontend.run import plan_config
from autostrat.layout import DeviceMatrix, Layout, TensorMap, assemble_tensor, split_tensor
from autostrat.models import GPT, megatron_seeds
from autostrat.redistribution import LazyCostTable, plan_redistribution, redistribution_cost, simulate
from autostrat.redistribution.memo import clear_memos
from autostrat.rules import make_rule
from autostrat.search import SearchOptions, search
from autostrat.search.problem import build_problem
from autostrat.search.progress import StatusLine
from autostrat.strategies import generate_strategies, mesh_axes, split_values
from tests.child_signals import sigint_default

ROOT = Path(__file__).parent.parent
GOLDEN = Path(__file__).parent / "golden" / "plan_digests.txt"

# Ops of a transformer layer at 1024-device scale: the search's tables join their layouts.
RULES = {
    "MatMul": [(4096, 1024), (1024, 4096)],
    "BatchMatMul": [(1024, 32, 256, 128), (1024, 32, 128, 256)],
}
CONSUMERS = (("Add", [(4096, 4096), (4096, 4096)]), ("MatMul", [(4096, 4096), (4096, 1024)]))


def random_pairs(device_num: int, count: int, seed: int, values=None):
    """`count` (producer output, consumer input) pairs of one tensor, drawn from random
    candidates of a producing and a consuming op (outputs of split reductions are partial)."""
    rng = np.random.default_rng(seed)
    producer = make_rule("MatMul", RULES["MatMul"])
    producers = [s.output_layouts[0] for s in generate_strategies(producer, device_num, values=values)]
    consumers = [s.input_layouts[0] for op_type, shapes in CONSUMERS
                 for s in generate_strategies(make_rule(op_type, shapes), device_num, values=values)]
    rows = rng.choice(len(producers), count)
    columns = rng.choice(len(consumers), count)
    return producers, consumers, list(zip(rows.tolist(), columns.tolist()))


@pytest.mark.slow
@pytest.mark.parametrize("device_num, values", [(64, None), (1024, split_values((128, 8))), (1024, None)],
                         ids=["64-every-divisor", "1024-mesh", "1024-every-divisor"])
def test_lazy_entries_equal_the_full_search_on_random_pairs(device_num, values):
    producers, consumers, pairs = random_pairs(device_num, 24, seed=device_num + (values is None), values=values)
    clear_memos()
    table = LazyCostTable(producers, consumers)
    lazy = {(i, j): table[i, j] for i, j in pairs}  # each read fills a row, warming memos for the next
    for (i, j), cost in lazy.items():
        clear_memos()  # the full search, with its path, from nothing
        assert cost == plan_redistribution(producers[i], consumers[j]).cost, (producers[i], consumers[j])


@pytest.mark.slow
def test_plans_over_1024_devices_cost_the_proven_optimum_and_move_the_right_data():
    # The coarse-first plans (`planner._coarse_plan`) against the cost search over prime axes,
    # run slice by slice on 1024 ranks. Without them the last pair, at the shape of a 7B
    # model's attention scores ([1024, 32, 2048, 2048]), settled 2 million states and fell back
    # to a greedy plan 9 times the optimum; small shapes keep the simulation quick.
    rng = np.random.default_rng(1024)
    rule = make_rule("MatMul", [(1024, 64), (64, 128)])
    options = generate_strategies(rule, 1024, values=split_values((128, 8)))
    producers = [s.output_layouts[0] for s in options]  # partial where the 64 is split
    consumers = [Layout(s.device_matrix, s.output_layouts[0].tensor_map, (1024, 128)) for s in options]
    pairs = [(producers[i], consumers[j]) for i, j in zip(rng.choice(len(producers), 4), rng.choice(len(consumers), 4))]
    pairs.append((Layout(DeviceMatrix((8, 128)), TensorMap((1, -1)), (8, 1024), partial=(0,)),
                  Layout(DeviceMatrix((1024,)), TensorMap((-1, 0)), (8, 1024))))
    for src, dst in pairs:
        x = rng.standard_normal(src.shape)
        plan = plan_redistribution(src, dst)
        assert plan.exhaustive and plan.cost == redistribution_cost(src, dst) == sum(step.bytes for step in plan.steps)
        pieces = simulate(plan, split_tensor(x, src))
        np.testing.assert_allclose(assemble_tensor(pieces, dst, check_replicas=True), x, err_msg=str(plan))


def slow_shard_index(layout: Layout, rank: int) -> tuple[int, ...]:
    """The per-rank formula `Layout.dim_shards` replaces: coordinates of the dim's axes, major first."""
    matrix = layout.device_matrix
    coordinate = np.unravel_index(rank, matrix.shape)
    return tuple(_combine(matrix, coordinate, entry) for entry in layout.tensor_map.entries)


def _combine(matrix: DeviceMatrix, coordinate, entry) -> int:
    value = 0
    for axis in entry:
        position = matrix.ndim - 1 - axis
        value = value * matrix.shape[position] + int(coordinate[position])
    return value


@pytest.mark.parametrize("shape, entries", [((2, 3, 4), ((0, 2), -1, 1)), ((8, 1, 4, 2), ((1,), (3, 0), -1)),
                                            ((128, 8), (1, 0, -1))])
def test_shard_indices_of_every_rank_match_the_per_rank_formula(shape, entries):
    layout = Layout(DeviceMatrix(shape), TensorMap(entries), _fitting_shape(shape, entries))
    for rank in range(layout.device_num):
        assert layout.shard_index(rank) == slow_shard_index(layout, rank)


def _fitting_shape(matrix_shape, entries) -> tuple[int, ...]:
    matrix = DeviceMatrix(matrix_shape)
    entries = TensorMap(entries).entries
    return tuple(2 * math.prod(matrix.axis_size(a) for a in entry) for entry in entries)


def test_mesh_candidates_are_the_full_candidates_whose_splits_are_mesh_products():
    rule = make_rule("BatchMatMul", RULES["BatchMatMul"])
    values = split_values((128, 8))
    full, mesh = generate_strategies(rule, 1024), generate_strategies(rule, 1024, values=values)
    assert set(mesh) == {s for s in full if set(s.splits) <= values}
    assert [s.splits for s in mesh] == sorted(s.splits for s in mesh)  # still in the deterministic order
    assert len(mesh) < len(full) // 20
    assert {s.splits for s in mesh} >= {(128, 8, 1, 1, 1), (128, 1, 1, 1, 8), (1024, 1, 1, 1, 1)}


def test_mesh_candidates_do_not_grow_with_the_device_count():
    rule = make_rule("MatMul", [(2**14, 2**14), (2**14, 2**14)])
    counts = {n: len(generate_strategies(rule, n, values=split_values(mesh_axes(n)))) for n in (64, 256, 1024, 4096)}
    # All ones; one factor takes every device; or one the servers and another the 8 (two 8s at 64).
    assert counts == {64: 7, 256: 10, 1024: 10, 4096: 10}
    assert len(generate_strategies(rule, 4096)) == 92  # every divisor: C(14, 2) ways to split 2**12, and all ones


def test_auto_mesh_keeps_every_divisor_in_small_worlds_and_checks_explicit_meshes():
    assert [mesh_axes(n) for n in (1, 8, 16)] == [None, None, None]
    assert mesh_axes(32) == (4, 8) and mesh_axes(24) == (3, 8) and mesh_axes(20) == (5, 4) and mesh_axes(17) == (17,)
    assert mesh_axes(64, "full") is None and mesh_axes(64, [4, 16]) == (4, 16)
    with pytest.raises(ConfigError, match=r"mesh \[4, 8\] has 32 devices but device_num is 64"):
        mesh_axes(64, (4, 8))
    for bad in ("8x8", [0, 64], [], [8.0, 8], "servers"):
        with pytest.raises(ConfigError, match="mesh must be 'auto', 'full' or a list of positive axis sizes"):
            SearchOptions(mesh=bad)


@pytest.mark.parametrize("device_num", [16, 24, 32])
def test_the_auto_mesh_loses_at_most_5_percent_against_every_divisor(device_num):
    # An unseeded GPT training step; measured: auto (servers x 8) sends as much as every divisor
    # on 16 and 24 devices, and less on 32 (239 196 against 245 508 bytes per device: the
    # propagation is greedy; a mesh of 4 x 2 x 2 x 2, 2- and 4-way splits inside a server, sent
    # 249 396).
    net = GPT(layers=1, hidden=48, heads=8, seq=8, batch=24, vocab=96)
    graph = build_training(trace(net, *net.example_inputs(), device_num=device_num), Adam())
    auto, full = (search(graph, device_num, SearchOptions(mesh=mesh)).total_bytes for mesh in ("auto", "full"))
    assert auto <= 1.05 * full


def test_a_seed_off_the_mesh_lends_its_splits_to_every_op():
    # Megatron TP 4 x DP 16 on 64 devices: 4 and 16 are not products of the 8 x 8 mesh, yet the
    # seed's neighbours must be able to follow it without a redistribution.
    net = GPT(2, 64, 4, 16, 64, 128)
    graph = apply_seeds(trace(net, *net.example_inputs(), device_num=64),
                        megatron_seeds(2, 4, first_layer_only=True, data_parallel=16), 64)
    problem = build_problem(graph, 64)
    assert problem.split_values == frozenset({1, 4, 8, 16, 64})
    splits = {s.splits for options in problem.candidates.values() for s in options}
    assert any(16 in s and 4 in s for s in splits)


def test_candidates_on_a_mesh_are_made_of_its_axes():
    # 1024 = 128 servers x 8. LayerNorm beside Megatron's MatMuls: its batch split over the
    # servers, repeated inside each, is a candidate; a split over 8 of the servers is not.
    axes = mesh_axes(1024)
    norm = make_rule("LayerNorm", [(1024, 2048, 4096), (4096,), (4096,)])
    candidates = generate_strategies(norm, 1024, True, split_values(axes), axes)
    assert {s.repeat for s in candidates} == {1, 8, 1024}
    assert any(s.splits[0] == 128 and s.repeat == 8 for s in candidates)
    anywhere = generate_strategies(norm, 1024, True, split_values(axes))
    assert {s.repeat for s in anywhere} > {1, 8, 128, 1024}
    # A MatMul splits its rows over the servers and its columns inside them, not the reverse.
    matmul = generate_strategies(make_rule("MatMul", [(4096, 1024), (1024, 4096)]), 1024, False, split_values(axes), axes)
    assert "((128, 1), (1, 8))" in map(str, matmul) and "((8, 1), (1, 128))" not in map(str, matmul)
    # 64 = 8 x 8: every candidate is made of its axes already.
    axes = mesh_axes(64)
    assert generate_strategies(norm, 64, True, split_values(axes), axes) == generate_strategies(norm, 64, True, split_values(axes))


def test_a_seed_off_the_mesh_keeps_every_device_matrix():
    net = GPT(2, 64, 4, 16, 64, 128)
    graph = trace(net, *net.example_inputs(), device_num=64)
    assert build_problem(graph, 64).mesh == (8, 8)
    graph = apply_seeds(graph, megatron_seeds(2, 4, first_layer_only=True, data_parallel=16), 64)
    assert build_problem(graph, 64).mesh is None  # TP 4 x DP 16 is not made of 8 x 8


GOLDEN_HEADER = "# config phase device_num bytes_per_device predicted_step_ns plan_json_sha256\n"


def plan_digests() -> str:
    lines = []
    for path, phase, device_num in itertools.product(sorted((ROOT / "configs").glob("*.yaml")), ("predict", "train"), (8, 16)):
        plan, _ = plan_config(load_config(path, phase=phase), device_num)
        # The plan's own keys: the prediction keys appended after them came later than the digests.
        own = {key: value for key, value in plan.to_dict().items() if key not in ("cost_model", "hardware", "predicted")}
        text = json.dumps(own, indent=1) + "\n"
        lines.append(f"{path.name} {phase} {device_num} {plan.total_bytes} {plan.prediction.step_time_ns} "
                     f"{hashlib.sha256(text.encode()).hexdigest()}")
    return GOLDEN_HEADER + "\n".join(lines) + "\n"


@pytest.mark.slow
def test_shipped_configs_plan_at_8_and_16_devices_as_recorded():
    # The bytes, predicted step time and digest of every shipped config's plan at 8 and 16
    # devices. A change here must be meant: the message shows the recorded and the new figures;
    # regenerate (tests/golden/) only with a commit saying why they moved.
    recorded, now = GOLDEN.read_text().splitlines(), plan_digests().splitlines()
    changed = [f"{old!r} -> {new!r}" for old, new in zip(recorded, now) if old != new]
    assert len(recorded) == len(now) and not changed, "plans changed:\n" + "\n".join(changed)


class Recorder:
    """A `SearchProgress` keeping every report."""

    def __init__(self):
        self.steps, self.solutions = [], []

    def step(self, what, done, total):
        self.steps.append((what, done, total))

    def solution(self, objective, bound, seconds):
        self.solutions.append((objective, bound))


def test_a_search_reports_every_phase_and_a_status_line_shows_it():
    config = load_config(ROOT / "configs" / "gpt.yaml", refine="cpsat")
    recorder = Recorder()
    plan, _ = plan_config(config, 8, progress=recorder)
    ops = len(plan.graph.ops)
    propagated = [done for what, done, total in recorder.steps if what == "propagating"]
    assert propagated == sorted(propagated) and propagated[-1] <= ops and len(propagated) > ops // 2
    planned = [done for what, done, _ in recorder.steps if what == "planning redistributions"]
    assert planned == list(range(ops))
    assert recorder.solutions and recorder.solutions[-1][0] == plan.total_bytes
    stream = io.StringIO()
    line = StatusLine(stream, quiet=0, log_interval=0)
    for report in recorder.steps[:3]:
        line.step(*report)
    line.solution(1234, 1000, 0.5)
    line.end()
    lines = stream.getvalue().splitlines()
    assert lines[0].startswith("autostrat: propagating ") and "s left in this phase" in lines[0]
    assert lines[-1].startswith("autostrat: CP-SAT: best 1,234 bytes per device, bound 1,000, 0.5 s")
    quiet = io.StringIO()
    StatusLine(quiet).step("propagating", 1, 2)  # the first second shows nothing
    assert quiet.getvalue() == ""


CTRL_C_SOLVE = """
import time
from ortools.sat.python import cp_model
from autostrat.search.solver_run import ctrl_c_stops, new_solver
model = cp_model.CpModel()
x = [model.NewIntVar(0, 60, f"x{i}") for i in range(60)]
model.AddAllDifferent(x)
model.Minimize(sum((i * 7919 % 97) * v for i, v in enumerate(x)))
for a, b in zip(x, x[1:]):
    model.Add(a + b != 10)
solver = new_solver(60, 0)
solver.parameters.linearization_level = 1  # at 2 the LP solves this assignment problem at once
print("solving", flush=True)
start = time.perf_counter()
try:
    with ctrl_c_stops(solver):
        solver.Solve(model)
    print("returned", flush=True)
except KeyboardInterrupt:
    print(f"interrupted after {time.perf_counter() - start:.1f} s", flush=True)
"""


def test_ctrl_c_stops_cp_sat_at_once_and_raises_keyboard_interrupt():
    # CP-SAT alone would catch the signal and return its best plan as if its time limit struck.
    child = subprocess.Popen([sys.executable, "-c", CTRL_C_SOLVE], stdout=subprocess.PIPE, text=True, cwd=ROOT,
                             preexec_fn=sigint_default)
    assert child.stdout.readline() == "solving\n"
    time.sleep(1.0)
    child.send_signal(signal.SIGINT)
    out, _ = child.communicate(timeout=30)
    assert out.startswith("interrupted after ") and float(out.split()[2]) < 10, out


@pytest.mark.slow
def test_ctrl_c_ends_a_long_cli_search_without_writing_its_outputs(tmp_path):
    # Every divisor a split on 1024 devices: a search of minutes, interrupted after a few seconds.
    out = tmp_path / "plan.json"
    command = [sys.executable, "-m", "autostrat", "search", "configs/gpt.yaml", "--device-num", "1024", "--mesh", "full",
               "--out", str(out), "--dump-ir", str(tmp_path / "ir")]
    child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                             preexec_fn=sigint_default)
    # Interrupted once the search is under way, whatever the load: its status line (after its
    # first second) says so, where a fixed sleep may end before the imports on a busy machine.
    status = child.stderr.readline()
    assert re.match(r"autostrat: .*, \d+\.\d s", status), status
    child.send_signal(signal.SIGINT)
    stdout, stderr = child.communicate(timeout=300)
    assert child.returncode == 130, stderr
    assert stderr.rstrip().endswith("autostrat: interrupted, nothing written") and "Traceback" not in stderr
    assert stdout == "" and list(tmp_path.iterdir()) == []


def test_a_rank_tables_servers_are_the_auto_mesh_of_a_run():
    from autostrat.frontend.run import with_table_mesh, with_table_servers
    from autostrat.runtime.rank_table import parse_rank_table

    def table(servers: int, per_server: int):
        return parse_rank_table({"version": "1.0", "server_count": str(servers), "status": "completed", "server_list": [
            {"server_id": f"node{s}.invalid", "host_nic_ip": "reserve", "device": [
                {"device_id": str(d), "device_ip": f"10.0.{s}.{d}", "rank_id": str(s * per_server + d)}
                for d in range(per_server)]} for s in range(servers)]})

    config = load_config(ROOT / "configs" / "gpt.yaml")
    assert with_table_mesh(config, table(16, 4), 64).context.mesh == (16, 4)  # not the default 8 x 8
    assert with_table_mesh(config, table(2, 4), 8) is config  # every divisor up to 16 devices
    assert with_table_mesh(load_config(ROOT / "configs" / "gpt.yaml", mesh=(8, 8)), table(16, 4), 64).context.mesh == (8, 8)
    # The step-time model takes its servers from the table too (and its speeds from the context).
    assert with_table_servers(config, table(2, 4)).context.hardware_profile().alpha_beta(8).device_matrix == DeviceMatrix((2, 4))
    assert with_table_servers(config, table(1, 8)) is config
