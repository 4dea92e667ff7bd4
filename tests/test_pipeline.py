"""Pipeline training (`search.pipeline`, `runtime.stage_program`, `runtime.pipeline`): stage
splits against brute force on a real model, schedules, and runs on threads and MPI ranks equal
to the stand-alone run of the whole batch, with measured bytes = predicted."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from autostrat import nn, reset_auto_parallel_context, set_auto_parallel_context
from autostrat.autodiff import SGD, Adam, build_training
from autostrat.errors import ConfigError
from autostrat.frontend import trace
from autostrat.frontend.train import relative_error, train, train_single_device, training_plan
from autostrat.models import FFN, GPT, TransformerStack, megatron_seeds
from autostrat.runtime import launcher
from autostrat.runtime.checkpoint import save_checkpoint, load_checkpoint
from autostrat.runtime.stage_program import Recv, Send, lower_stage_programs
from autostrat.runtime.training import reference_graph, train_locally
from autostrat.search import SearchOptions
from autostrat.search.pipeline import plan_pipeline, shared_update_ops
from autostrat.search.schedules import schedule_orders
from autostrat.search.schedule_split import priced_split
from autostrat.search.stages import op_units, unit_costs

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def _clean_context():
    reset_auto_parallel_context()
    yield
    reset_auto_parallel_context()


def _stack(layers: int = 4, batch: int = 8):
    return TransformerStack(layers=layers, hidden=32, heads=4, seq=8, batch=batch)


def _pipeline_cell(net, layers: int, stages: int, micro: int = 4, schedule: str = "1f1b", seeded: bool = True,
                   optimizer=None):
    set_auto_parallel_context(parallel_mode="auto_parallel", device_num=8, pipeline_stages=stages,
                              pipeline_config={"pipeline_scheduler": schedule})
    if seeded:
        primitives = dict(net.primitives_and_names())
        for name, (strategy, _) in megatron_seeds(layers, 8 // stages).items():
            primitives[name].shard(strategy)
    optimizer = optimizer or nn.Adam(net.trainable_params(), learning_rate=1e-3)
    return nn.TrainOneStepCell(nn.PipelineCell(net, micro_size=micro), optimizer)


# -- the split -----------------------------------------------------------------------------


def test_the_searched_split_of_a_real_model_is_the_best_of_every_split():
    """A 5-block GPT's units (embedding, 5 blocks, head) on 3 stages: the split `plan_pipeline`
    returns has the least simulated step of every split, priced from the same plan."""
    net = GPT(layers=5, hidden=32, heads=4, seq=8, batch=2, vocab=256)
    graph = build_training(trace(net, *net.example_inputs()), Adam())
    plan = plan_pipeline(graph, 6, 3, 4, SearchOptions())
    costs = unit_costs(plan, SearchOptions().hardware)
    orders = schedule_orders("1f1b", 3, 4)
    best = min(priced_split(costs, tuple(zip((0,) + ends[:-1], ends)), orders).step_time_ns
               for ends in (cuts + (7,) for cuts in itertools.combinations(range(1, 7), 2)))
    assert plan.pipeline.split.step_time_ns == best
    units = op_units(graph)
    for name, stage in plan.pipeline.op_stages.items():  # every op on the stage of its unit's range
        first, end = plan.pipeline.split.bounds[stage]
        assert first <= units[name] < end or name.startswith("accumulate/"), name


def test_the_memory_budget_moves_the_split():
    """Under a budget just below the exact peak of the free split, only a split with a lighter
    first stage fits (1F1B's first stage holds the most micro-batches): the split's model puts
    the free split under that budget, so the search finds its exact peak over and searches
    again; the split it returns is slower, and its stages' exact peaks fit."""
    graph = build_training(trace(_stack(6, 4), *_stack(6, 4).example_inputs()), Adam())
    free = plan_pipeline(graph, 4, 2, 2, SearchOptions())  # 2 micro-batches: at 4 no other split fits
    budget = max(free.pipeline.peak_bytes) - 1
    assert max(free.pipeline.split.peak_bytes) <= budget  # the model alone would keep the free split
    tight = plan_pipeline(graph, 4, 2, 2, SearchOptions(max_device_memory=budget))
    assert max(tight.pipeline.peak_bytes) <= budget
    assert tight.pipeline.split.bounds != free.pipeline.split.bounds
    assert tight.pipeline.split.step_time_ns >= free.pipeline.split.step_time_ns


def test_adams_step_counters_run_on_every_stage():
    graph = build_training(trace(FFN(), nn.Tensor(shape=(64, 64))), Adam())
    shared = shared_update_ops(graph)
    assert "optimizer/next_beta1_power" in shared and "optimizer/step_rate" in shared
    assert not any(name.startswith("optimizer/dense") for name in shared)  # they read gradients


# -- the schedule --------------------------------------------------------------------------


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
@pytest.mark.parametrize("stages, micro", [(1, 3), (2, 1), (2, 4), (4, 2), (4, 8)])
def test_every_schedule_runs_each_micro_batch_once_and_holds_what_the_split_model_says(schedule, stages, micro):
    for stage in range(stages):
        kinds = {"F": "forward", "B": "backward"}
        slots = tuple((kinds[i.kind], i.micro_batch) for i in schedule_orders(schedule, stages, micro).orders[stage])
        assert sorted(slots) == sorted([(kind, i) for kind in ("backward", "forward") for i in range(micro)])
        held, most = 0, 0
        for kind, index in slots:
            assert kind == "forward" or ("forward", index) in slots[:slots.index((kind, index))]
            held += 1 if kind == "forward" else -1
            most = max(most, held)
        assert most == (micro if schedule == "gpipe" else min(stages - stage, micro))


# -- runs ----------------------------------------------------------------------------------


@pytest.mark.parametrize("model, stages, schedule", [("gpt", 2, "1f1b"), ("stack", 4, "1f1b"), ("stack", 2, "gpipe")])
def test_pipeline_training_equals_the_stand_alone_run(model, stages, schedule):
    """On 8 threads: the loss curve and the final parameters equal one device's on the whole
    batch, every rank's measured bytes per phase equal its program's, and stages exchange
    activations and gradients (phase pipeline) and nothing else between them."""
    net = GPT(layers=2, hidden=32, heads=4, seq=8, batch=8, vocab=64) if model == "gpt" else _stack()
    layers = 2 if model == "gpt" else 4
    report = train(_pipeline_cell(net, layers, stages, schedule=schedule), net.example_inputs(), steps=3, log=None)
    assert report.ok, report.text
    assert report.loss_error <= 1e-5 and report.parameter_error <= 1e-5
    measured = report.result.measured
    assert all(phases["pipeline"] > 0 for phases in measured)
    # Every rank's peak memory, measured from the arrays it holds, is its stage's in the plan (`Pipeline.peak_bytes`).
    assert report.result.measured_peaks == report.result.predicted_peaks and len(set(report.result.predicted_peaks)) > 1
    assert "pipeline bubble: predicted" in report.text and "measured" in report.text


def test_micro_batches_alone_accumulate_gradients_like_one_big_batch():
    """``PipelineCell`` without stages: 4 micro-batches per step on 8 devices, Momentum."""
    net = FFN()
    net.dense1.matmul.shard(((2, 1), (1, 4)))
    set_auto_parallel_context(parallel_mode="auto_parallel", device_num=8)
    loss = nn.WithLossCell(net, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"))
    cell = nn.TrainOneStepCell(nn.PipelineCell(loss, micro_size=4), nn.Momentum(net.trainable_params(), 0.1, 0.9))
    report = train(cell, (nn.Tensor(shape=(64, 64)), nn.Tensor(shape=(64,), dtype="int32")), steps=3, log=None)
    assert report.ok, report.text
    assert all(phases["pipeline"] == 0 for phases in report.result.measured)


class _TiedStack(nn.Cell):
    """Two blocks with one scale parameter read before the first and after the last (the
    stages that read it differ: its update is sent from the first to the last stage)."""

    def __init__(self):
        from autostrat import ops
        super().__init__()
        self.scale = nn.Parameter(nn.Tensor(np.full((32,), 1.5, np.float32)))
        self.scale_in, self.scale_out = ops.Mul(), ops.Mul()
        self.blocks = _stack(2).blocks
        self.loss = nn.MSELoss()

    def construct(self, x, targets):
        x = self.scale_in(x, self.scale)
        for block in self.blocks:
            x = block(x)
        return self.loss(self.scale_out(x, self.scale), targets)


def test_a_parameter_read_on_two_stages_is_updated_once_and_sent_on():
    net = _TiedStack()
    cell = _pipeline_cell(net, 2, 2, seeded=False, optimizer=nn.SGD(net.trainable_params(), 0.1))
    plan, values, batches = training_plan(cell, None, _stack().example_inputs(), steps=3)
    programs = lower_stage_programs(plan)
    last = programs[-1]
    assert any(isinstance(i, Recv) and i.key.startswith("optimizer/scale") for i in last.update)
    assert any(isinstance(i, Send) for i in programs[0].update)
    run, alone = train_locally(plan, values, batches), train_single_device(reference_graph(plan), values, batches)
    assert relative_error(run.losses, alone.losses) <= 1e-5
    assert relative_error(run.parameters, alone.parameters) <= 1e-5
    assert run.bytes_match
    # The last stage's buffer for the parameter's next value, received, is in its predicted peak.
    group = plan.pipeline.group_size
    assert run.measured_peaks == tuple(plan.pipeline.peak_bytes[rank // group] for rank in range(plan.pipeline.device_num))


def test_a_pipeline_sums_replicas_as_its_whole_batch_reference_does():
    """gradients_mean=False (the default) in a pipeline: the micro-batches' gradients are summed
    (each micro-batch's loss weighs 1/m, so the sum is the whole batch's gradient), then a
    stage's devices holding the same slice of a parameter sum theirs. The reference, the whole
    batch on one device, sums as many copies as the stage plan has replicas of each parameter;
    the plain stand-alone run differs, so the check can fail."""
    net = _stack()
    cell = _pipeline_cell(net, 4, 2, optimizer=nn.Momentum(net.trainable_params(), 0.1, 0.9))
    plan, values, batches = training_plan(cell, None, net.example_inputs(), steps=3)
    assert plan.pipeline.batch_graph.ops["optimizer/blocks.0.ln1.gamma"].attr_dict["gradients_mean"] is False
    assert plan.replicas("blocks.0.ln1.gamma") == 4 and plan.replicas("blocks.0.ffn1.weight") == 1
    run = train_locally(plan, values, batches)
    summed, plain = (train_single_device(graph, values, batches) for graph in (reference_graph(plan), plan.pipeline.batch_graph))
    assert relative_error(run.losses, summed.losses) <= 1e-5 and relative_error(run.parameters, summed.parameters) <= 1e-5
    assert relative_error(run.parameters, plain.parameters) > 1e-3


def test_marked_stages_are_kept_and_shown(tmp_path):
    net = _stack()
    for index, block in enumerate(net.blocks):
        block.pipeline_stage = 0 if index == 0 else 1  # uneven on purpose: the search would split 2/2
    set_auto_parallel_context(strategy_ckpt_save_file=str(tmp_path / "strategy.json"))
    cell = _pipeline_cell(net, 4, 2)
    plan = training_plan(cell, None, net.example_inputs())[0]
    assert plan.pipeline.origin == "pipeline_stage of cells" and plan.pipeline.split.bounds == ((0, 1), (1, 2))
    assert plan.pipeline.op_stages["blocks.0.ffn1.matmul"] == 0 and plan.pipeline.op_stages["blocks.1.ffn1.matmul"] == 1
    table = plan.table()
    assert table.splitlines()[0].split()[:3] == ["op", "stage", "type"]
    assert "pipeline: 2 stages x 4 devices, 4 micro-batches, 1f1b (pipeline_stage of cells" in table
    ops = {op["name"]: op for op in plan.to_dict()["ops"]}
    assert ops["blocks.3.ffn2.matmul"]["stage"] == "1" and ops["optimizer/next_beta1_power"]["stage"] == "all"
    ir = plan.dump_ir(tmp_path / "ir")[0].read_text()
    assert "4 devices per stage, 2 stages, one of 4 micro-batches" in ir and "{pipeline_stage: 1}" in ir
    saved = json.loads((tmp_path / "strategy.json").read_text())
    stages = {item["node_name"]: item["parallel_strategys"]["stage"] for item in saved["autostrat"]["parallel_strategy_item"]}
    assert stages["blocks.0.attention.query.matmul"] == 0 and stages["blocks.2.attention.query.matmul"] == 1
    mindspore = saved["parallel_strategy_item"]  # MindSpore's part: the same stages
    assert mindspore["MatMul_blocks.0.attention.query.weight"]["stage"] == 0
    assert mindspore["MatMul_blocks.2.attention.query.weight"]["stage"] == 1


def test_a_checkpoint_of_two_stages_continues_on_four(tmp_path):
    """Parameters saved by a 2-stage run continue on 4 stages as the stand-alone run continues."""
    net = _stack()
    first = train(_pipeline_cell(net, 4, 2), net.example_inputs(), steps=2, log=None, save_checkpoint=tmp_path / "c.npz")
    assert first.ok
    reset_auto_parallel_context()
    net = _stack()
    cell = _pipeline_cell(net, 4, 4)
    second = train(cell, net.example_inputs(), steps=2, log=None, initial=load_checkpoint(tmp_path / "c.npz"))
    assert second.ok, second.text
    assert second.result.losses[0] < first.result.losses[0]  # it continued, not restarted


@pytest.mark.parametrize("setup, message", [
    (lambda: set_auto_parallel_context(pipeline_stages=3), "pipeline_stages 3 must divide device_num 8"),
    (lambda: set_auto_parallel_context(pipeline_config={"pipeline_interleave": True, "pipeline_scheduler": "gpipe"}),
     r"pipeline_config.pipeline_interleave = True interleaves 1f1b \(or runs zbv\), but pipeline_config.pipeline_scheduler is 'gpipe'"),
    (lambda: set_auto_parallel_context(pipeline_config={"pipeline_interleave": "yes"}),
     "pipeline_config.pipeline_interleave must be True or False, got 'yes'"),
    (lambda: set_auto_parallel_context(pipeline_schedule="zbv", pipeline_config={"pipeline_scheduler": "1f1b"}),
     r"pipeline_schedule is 'zbv' but pipeline_config asks for '1f1b' \(\{'pipeline_scheduler': '1f1b'\}\): set one of the two keys"),
    (lambda: set_auto_parallel_context(pipeline_config=None, pipeline_schedule="dualpipe"),
     "pipeline_schedule must be one of"),
    (lambda: set_auto_parallel_context(pipeline_config=None, pipeline_schedule="zbv", pipeline_interleave_num=3),
     r"pipeline_interleave_num = 3, but the pipeline schedule zbv \(pipeline_schedule or pipeline_config\) runs 2 model"),
    (lambda: set_auto_parallel_context(pipeline_interleave_num=0),
     "pipeline_interleave_num must be a positive integer \\(model stages per device group\\), got 0"),
    (lambda: set_auto_parallel_context(pipeline_config=None, pipeline_schedule="interleaved_1f1b", pipeline_stages=8),
     "interleaved_1f1b runs micro-batches in groups of the 8 devices: micro_batches must be a multiple of 8, got 4"),
    (lambda: set_auto_parallel_context(pipeline_config={"stages": 2}), "takes the keys pipeline_scheduler"),
    (lambda: set_auto_parallel_context(pipeline_config={"pipeline_scheduler": [1]}),
     r"pipeline_config.pipeline_scheduler must be one of .*; got \[1\]"),  # the fuzz's list, once a TypeError
])
def test_bad_pipeline_settings_are_refused(setup, message):
    net = _stack()
    with pytest.raises(ConfigError, match=message):
        cell = _pipeline_cell(net, 4, 2, seeded=False)
        setup()
        train(cell, net.example_inputs(), steps=1, log=None)


def test_a_batch_that_micro_batches_cannot_cut_is_refused():
    net = _stack(batch=2)
    with pytest.raises(ConfigError, match=r"input 0 of shape \[16, 32\] cannot be cut into 3 micro-batches"):
        train(_pipeline_cell(net, 4, 2, micro=3, seeded=False), net.example_inputs(), steps=1, log=None)


def test_marks_against_the_models_order_are_refused():
    net = _stack()
    net.blocks[0].pipeline_stage, net.blocks[1].pipeline_stage = 1, 0
    with pytest.raises(ConfigError, match=r"cell blocks.1 \(stage 0\) reads the output of cell blocks.0 \(stage 1\); stages must follow"):
        train(_pipeline_cell(net, 4, 2, seeded=False), net.example_inputs(), steps=1, log=None)


def test_a_pipeline_needs_an_optimizer():
    set_auto_parallel_context(parallel_mode="auto_parallel", device_num=8, pipeline_stages=2)
    from autostrat.frontend.api import parallelize
    net = _stack()
    with pytest.raises(ConfigError, match="plans a training step: give an optimizer"):
        parallelize(nn.PipelineCell(net, 2), *net.example_inputs())


@pytest.mark.slow
def test_pipelines_train_on_8_mpi_ranks_like_stand_alone():
    """The pipeline sample, one process per rank: the 2-layer GPT and a 4-block stack, each as
    2 stages x 4 devices and 4 x 2 (the stack's by hand, GPipe), in one launch."""
    sample = ROOT / "sample_code" / "pipeline"
    command = [str(launcher.find_mpiexec()), "-n", "8", sys.executable, "-m", "mpi4py", "train.py", "all", "2"]
    result = subprocess.run(command, cwd=sample, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    for case in ("gpt as 2 stages (1f1b)", "gpt as 4 stages (1f1b)", "stack as 2 stages (1f1b)", "stack as 4 stages (gpipe)"):
        assert f"{case}: OK" in result.stdout
    assert result.stdout.count("measured = predicted on every rank") == 4 and result.stdout.count("(limit 1e-05): OK") == 4
    assert result.stdout.count("measured/predicted 1.000..1.000: equal") == 4  # peak memory, every rank
    assert all(int(part.split(",")[0]) > 0 for part in result.stdout.split(", pipeline ")[1:])


def test_the_pipeline_config_runs_on_local_ranks_from_the_cli(capsys):
    """`autostrat run configs/gpt_pipeline.yaml --backend local`: the job path (stage programs
    in the job, the report grouping collectives by stage) checks loss, parameters and bytes."""
    from autostrat.frontend.run import RunOptions, run_config

    code, text = run_config("configs/gpt_pipeline.yaml", RunOptions(backend="local", steps=2))
    assert code == 0, text
    assert "bytes: measured = predicted on every rank" in text and "limit 0.0003): OK" in text
    assert " ranks 0-3:" in text and " ranks 4-7:" in text and "Send (pipeline)" in text


def test_stage_programs_survive_the_job_file(tmp_path):
    from autostrat.frontend.run import RunOptions, prepare_run
    from autostrat.runtime.job_file import load_job, save_job

    job, _, _ = prepare_run("configs/gpt_pipeline.yaml", RunOptions(steps=1, pipeline_stages=4, micro_size=2))
    assert job.device_num == 8 and {program.stage for program in job.programs} == {0, 1, 2, 3}
    assert load_job(tmp_path, save_job(job, tmp_path)).programs == job.programs


def test_every_pipeline_rank_reports_each_instruction_it_runs():
    """A rank's watchdog sees progress through `on_instruction`: a pipeline rank that never
    called it counted its whole run as start-up and was ended as stalled on a busy machine."""
    from autostrat.frontend.run import RunOptions, prepare_run
    from autostrat.runtime.job import run_steps
    from autostrat.runtime.local import LocalCluster

    job, _, _ = prepare_run("configs/gpt_pipeline.yaml", RunOptions(steps=2))
    seen = {rank: [] for rank in range(job.device_num)}

    def run(backend):
        return run_steps(job, backend, lambda index, instruction: seen[backend.rank].append((index, type(instruction).__name__)))

    LocalCluster(job.device_num).run(run)
    for rank, program in enumerate(job.programs):
        per_micro_batch = sum(len(chunk.forward) + len(chunk.backward) + len(chunk.weight) for chunk in program.chunks)
        per_step = per_micro_batch * program.micro_batches + len(program.update)
        assert [index for index, _ in seen[rank]] == list(range(2 * per_step)), rank
        assert {"Recv", "Send"} <= {kind for _, kind in seen[rank]}, rank  # waits on other stages are reported too


def test_every_micro_batch_pays_its_communication_in_the_strategy_search():
    """Issue #34's finding 1: the search of a pipeline's micro-batch graph weighed a micro-batch's
    redistributions once against the once-per-step gradient synchronisation, and kept the LM
    head's weight-gradient matmul on one device (all ones) to spare the sync. Weighing the
    once-per-step costs 1/m, 32 micro-batches split it over the devices, its unit several times
    cheaper per micro-batch; the sync tables are the unweighted ones over m, the others equal."""
    from autostrat.frontend.config import apply_seeds
    from autostrat.search.problem import build_problem
    from autostrat.search.search import search

    net = GPT(layers=2, hidden=128, heads=8, seq=64, batch=2, vocab=8192)
    graph = build_training(apply_seeds(trace(net, *net.example_inputs(), device_num=16), megatron_seeds(2, 8, data_parallel=2), 16),
                           Adam())
    once = search(graph, 16, SearchOptions())
    pipelined = plan_pipeline(graph, 32, 2, 32, SearchOptions())
    head = "bprop/lm_head.matmul/mat_mul_1"
    assert set(once.ops[head].strategy.splits) == {1}  # the finding, with one micro-batch: on one device
    assert set(pipelined.ops[head].strategy.splits) != {1}
    hardware = SearchOptions().hardware
    assert unit_costs(pipelined, hardware).time_ns[-1] * 5 < unit_costs(once, hardware).time_ns[-1]
    one, four = build_problem(graph, 16), build_problem(graph, 16, micro_batches=4)
    for a, b in zip(one.edges, four.edges):
        assert a.sync == b.sync and np.allclose(b.table[0], a.table[0] / (4 if a.sync else 1))  # a row: every table whole is slow
    with pytest.raises(ConfigError, match="micro_batches must be a positive integer, got 0"):
        SearchOptions(micro_batches=0)
