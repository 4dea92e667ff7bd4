"""Pipeline schedules on ranks (issue #34): every schedule of `search.schedules` trains on local
ranks equal to the stand-alone run of the whole batch, each rank running the F, B and W of
every micro-batch on each of its chunks once, in the order the schedule gives (read from the
instructions the ranks ran, not from the runner's bookkeeping), with bytes and peak memory as
predicted; virtual stages sit on their device groups; the backward's W part holds the weight
gradients; the keys that choose a schedule, from Python, YAML and the command line; two
schedules on MPI ranks."""

from __future__ import annotations

import pytest

from autostrat import nn, reset_auto_parallel_context, set_auto_parallel_context
from autostrat.errors import ConfigError
from autostrat.frontend.config import parse_config
from autostrat.frontend.train import relative_error, train, train_single_device, training_plan
from autostrat.models import TransformerStack, megatron_seeds
from autostrat.runtime import pipeline as runtime_pipeline
from autostrat.runtime.instructions import Compute, Recv, Send
from autostrat.runtime.stage_program import SLOTS, lower_stage_programs
from autostrat.runtime.training import reference_graph, train_locally
from autostrat.search.schedules import SCHEDULE_ORDERS, schedule_orders

KINDS = {"forward": "F", "backward": "B", "weight": "W"}


@pytest.fixture(autouse=True)
def _clean_context():
    reset_auto_parallel_context()
    yield
    reset_auto_parallel_context()


def _cell(schedule: str, stages: int = 2, micro: int = 4, layers: int = 4, device_num: int = 4, chunks=None):
    net = TransformerStack(layers=layers, hidden=32, heads=4, seq=8, batch=8)
    set_auto_parallel_context(parallel_mode="auto_parallel", device_num=device_num, pipeline_stages=stages,
                              pipeline_schedule=schedule, pipeline_interleave_num=chunks)
    primitives = dict(net.primitives_and_names())
    for name, (strategy, _) in megatron_seeds(layers, device_num // stages).items():
        primitives[name].shard(strategy)
    return nn.TrainOneStepCell(nn.PipelineCell(net, micro_size=micro), nn.Adam(net.trainable_params(), learning_rate=1e-3)), net


def _parts_run(program, ran: list) -> list:
    """The (kind, micro-batch, chunk) of each slot the rank ran, read from the instructions it
    ran: every slot is a run of its chunk's instructions; the k-th run of one chunk's slot is
    micro-batch k (every schedule runs a chunk's micro-batches in order per kind, which the
    comparison with the schedule's order then checks)."""
    parts, position, seen = [], 0, {}
    candidates = [(chunk, slot, part.instructions(slot)) for chunk, part in enumerate(program.chunks) for slot in SLOTS
                  if part.instructions(slot)]
    while position < len(ran) - len(program.update):
        found = [(chunk, slot, len(body)) for chunk, slot, body in candidates if tuple(ran[position:position + len(body)]) == body]
        assert len(found) == 1, f"rank {program.rank}: instructions from {position} are no one slot of a chunk: {found}"
        chunk, slot, length = found[0]
        micro_batch = seen.get((chunk, slot), 0)
        seen[(chunk, slot)] = micro_batch + 1
        parts.append((KINDS[slot], micro_batch, chunk))
        position += length
    assert tuple(ran[position:]) == program.update, f"rank {program.rank}: the step does not end with its update slot"
    return parts


@pytest.mark.parametrize("schedule", SCHEDULE_ORDERS)
def test_every_schedule_trains_on_local_ranks_like_stand_alone_in_its_order(schedule, monkeypatch):
    """2 device groups of 2 devices, 4 micro-batches (interleaved_1f1b and zbv: 2 chunks per
    group, 4 model stages), 2 steps: loss and parameters equal one device's on the whole batch,
    bytes and peaks measured = predicted, and every rank ran its schedule's order; no gradient
    is ever held both as a micro-batch's and as the step's sum (each is added in place, as
    Megatron adds it into its main gradient, once the micro-batch has used it)."""
    ran: dict[int, list] = {}
    twice: set[str] = set()  # gradients a micro-batch held next to their sum at an instruction
    run = runtime_pipeline.StageRunner._run

    def recording(self, instruction, *args):
        ran.setdefault(self.program.rank, []).append(instruction)
        summed = {key for chunk in self.program.chunks for key in chunk.accumulated if key in self.shared}
        twice.update(key for store in self.stores.values() for key in store if key in summed)
        return run(self, instruction, *args)

    monkeypatch.setattr(runtime_pipeline.StageRunner, "_run", recording)
    cell, net = _cell(schedule)
    report = train(cell, net.example_inputs(), steps=2, log=None)
    assert report.ok, report.text
    assert report.loss_error <= 1e-5 and report.parameter_error <= 1e-5
    assert not twice, sorted(twice)[:3]
    result = report.result
    assert result.bytes_match and all(phases["pipeline"] > 0 for phases in result.measured)
    assert result.measured_peaks == result.predicted_peaks
    # Per rank its parts' CPU seconds, those over their wall seconds (a thread's own: the other
    # ranks' threads run beside it, so a process's CPU time would exceed them), and its bubble on
    # the virtual clock: the stages wait for one another even on cores of their own. Not every
    # rank: a device group's collectives are not composed on the clock (`pipeline_clock`), so the
    # rank of a group whose passes ran longest (measured: 4.0 ms forwards beside its partner's
    # 2.3, 4 ranks beside 3 busy loops on 2 cores) may never wait on it.
    timings = result.stage_timings
    assert all(forward > 0 and backward > 0 and 0 < share <= 1 and 0 <= virtual < 1
               for _, forward, backward, _, share, virtual in timings), timings
    assert max(virtual for *_, virtual in timings) > 0, timings
    plan, _, _ = training_plan(cell, None, net.example_inputs(), steps=1)
    orders = schedule_orders(schedule, 2, 4, plan.pipeline.chunks)
    for program in lower_stage_programs(plan):
        per_step = len(ran[program.rank]) // 2
        parts = _parts_run(program, ran[program.rank][:per_step])
        # A slot of no instructions runs nothing to read (a chunk of the stack's empty first unit alone).
        running = {(KINDS[slot], chunk) for chunk, part in enumerate(program.chunks) for slot in SLOTS if part.instructions(slot)}
        expected = tuple(tuple(i) for i in orders.orders[program.stage] if (i.kind, i.chunk) in running)
        assert tuple(parts) == expected, program.rank
        kinds = "FBW" if orders.split_backward else "FB"
        assert sorted(parts) == sorted((k, i, c) for k in kinds for i in range(4) for c in range(plan.pipeline.chunks)
                                       if (k, c) in running)


def test_virtual_stages_sit_on_their_device_groups():
    """Megatron's interleaving puts stage k on group k mod p; zbv's V comes back: 0, 1, 1, 0.
    Each rank's chunks are the stages of its group, and a stage sends to the next stage's group."""
    for schedule, groups in (("interleaved_1f1b", (0, 1, 0, 1)), ("zbv", (0, 1, 1, 0))):
        reset_auto_parallel_context()
        cell, net = _cell(schedule)
        plan, _, _ = training_plan(cell, None, net.example_inputs(), steps=1)
        pipeline = plan.pipeline
        assert (pipeline.stages, pipeline.devices, pipeline.chunks, pipeline.device_num) == (4, 2, 2, 4)
        assert tuple(pipeline.device_of(stage) for stage in range(4)) == groups
        assert len(pipeline.peak_bytes) == 2
        # A group runs the updates of both its chunks at the step's end (the shared ones once);
        # the slowest model stage's alone undercounted it.
        once = pipeline.step_time_ns - pipeline.split.step_time_ns
        per_group = [sum(pipeline.once_ns[s] for s in range(4) if groups[s] == g) - pipeline.shared_once_ns for g in (0, 1)]
        assert once == max(per_group) and 0 < pipeline.shared_once_ns <= min(pipeline.once_ns)
        assert any(total > max(pipeline.once_ns[s] for s in range(4) if groups[s] == g) for g, total in enumerate(per_group))
        for program in lower_stage_programs(plan):
            assert sorted(chunk.stage for chunk in program.chunks) == [s for s in range(4) if groups[s] == program.stage]
            for chunk in program.chunks:
                for send in (i for i in chunk.forward if isinstance(i, Send)):
                    assert send.dest // 2 == groups[chunk.stage + 1], (schedule, chunk.stage, send)
        if schedule == "zbv":  # stages 1 and 2 share group 1: the activation between them stays in its buffers
            assert any(chunk.passed for program in lower_stage_programs(plan) for chunk in program.chunks)


def test_the_weight_part_of_a_split_backward_holds_the_weight_gradients():
    """ZB-H1: every chunk's W computes gradients of parameters only and never waits for or sends to
    another stage; its B computes the input gradient a stage sends back."""
    cell, net = _cell("zero_bubble_h1")
    plan, _, _ = training_plan(cell, None, net.example_inputs(), steps=1)
    parameters = {name for name, info in plan.graph.tensors.items() if info.kind == "parameter"}
    for program in lower_stage_programs(plan):
        [chunk] = program.chunks
        assert chunk.weight and not any(isinstance(i, (Send, Recv)) for i in chunk.weight)
        weight_outputs = {key for i in chunk.weight if isinstance(i, Compute) for key in i.outputs}
        assert any(key.removeprefix("grad/") in parameters for key in weight_outputs), program.rank
        assert not any(key.startswith("grad/") and key[5:] in plan.graph.tensors and key[5:] not in parameters
                       for key in weight_outputs), program.rank
        if chunk.stage == 1:
            assert any(isinstance(i, Send) and i.key.startswith("grad/") for i in chunk.backward)


@pytest.mark.parametrize("schedule", ["zbv", "interleaved_1f1b", "zero_bubble_h1"])
def test_a_parameter_read_on_two_stages_is_updated_once_under_every_schedule(schedule):
    """The scale read by the first and the last stage: zbv holds both on group 0 (its update
    stays there), interleaved_1f1b on groups 0 and 1 (the update is sent), ZB-H1 sums the last
    stage's weight-gradient part into the first's."""
    from tests.test_pipeline import _TiedStack, _stack

    net = _TiedStack()
    set_auto_parallel_context(parallel_mode="auto_parallel", device_num=4, pipeline_stages=2, pipeline_schedule=schedule)
    cell = nn.TrainOneStepCell(nn.PipelineCell(net, micro_size=2), nn.SGD(net.trainable_params(), 0.1))
    plan, values, batches = training_plan(cell, None, _stack().example_inputs(), steps=2)
    run, alone = train_locally(plan, values, batches), train_single_device(reference_graph(plan), values, batches)
    assert relative_error(run.losses, alone.losses) <= 1e-5 and relative_error(run.parameters, alone.parameters) <= 1e-5
    assert run.bytes_match and run.measured_peaks == run.predicted_peaks
    sent = any(isinstance(i, Send) and i.key.startswith("optimizer/scale") for p in lower_stage_programs(plan) for i in p.update)
    assert sent == (schedule != "zbv")


def test_the_schedule_keys_of_a_yaml_config():
    text = ("model: {name: TransformerStack, params: {layers: 4, hidden: 32, heads: 4, seq: 8, batch: 8}}\n"
            "inputs: [{shape: [64, 32]}, {shape: [64, 32]}]\noptimizer: {name: sgd, learning_rate: 0.1}\n"
            "device_num: 4\npipeline_stages: 2\nmicro_size: 4\n")
    config = parse_config(text + "pipeline_schedule: zbv\n", "s.yaml")
    assert config.context.pipeline_schedule_chunks() == ("zbv", 2)
    config = parse_config(text + "pipeline_config: {pipeline_interleave: true}\npipeline_interleave_num: 3\n", "s.yaml")
    assert config.context.pipeline_schedule_chunks() == ("interleaved_1f1b", 3)
    with pytest.raises(ConfigError, match=r"^s.yaml: pipeline_schedule is 'zero_bubble_h1' but pipeline_config asks for "
                                          r"'gpipe' \(\{'pipeline_scheduler': 'gpipe'\}\): set one of the two keys$"):
        parse_config(text + "pipeline_schedule: zero_bubble_h1\npipeline_config: {pipeline_scheduler: gpipe}\n", "s.yaml")
    with pytest.raises(ConfigError, match=r"^s.yaml: pipeline_interleave_num = 2, but the pipeline schedule 1f1b"):
        parse_config(text + "pipeline_interleave_num: 2\n", "s.yaml")


def test_the_schedule_options_of_the_command_line(capsys):
    """`autostrat search --pipeline-schedule interleaved_1f1b` plans virtual stages (the option replaces the
    config's pipeline_config); a bad name is refused."""
    from autostrat.cli import main

    code = main(["search", "configs/gpt_pipeline.yaml", "--pipeline-schedule", "interleaved_1f1b",
                 "--pipeline-interleave-num", "2", "--micro-size", "2"])
    out = capsys.readouterr().out
    assert code == 0 and "pipeline: 4 stages (2 on each of 2 device groups) x 4 devices, 2 micro-batches, interleaved_1f1b" in out
    with pytest.raises(SystemExit):
        main(["search", "configs/gpt_pipeline.yaml", "--pipeline-schedule", "dualpipe"])
    assert "invalid choice: 'dualpipe'" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.parametrize("schedule", ["interleaved_1f1b", "zbv"])
def test_virtual_stage_schedules_train_on_4_mpi_ranks(schedule, tmp_path, capsys):
    """`autostrat run` of a 4-block stack as 2 groups of 2 ranks, 2 chunks each, 4 micro-batches,
    one process per rank: loss, parameters, bytes and peaks checked against one device."""
    from autostrat.frontend.run import RunOptions, run_config

    config = tmp_path / "stack.yaml"
    config.write_text("parallel_mode: auto_parallel\ndevice_num: 4\npipeline_stages: 2\nmicro_size: 4\n"
                      "gradients_mean: true\noptimizer: {name: adam, learning_rate: 0.001, eps: 1.0e-6}\n"
                      "model: {name: TransformerStack, params: {layers: 4, hidden: 32, heads: 4, seq: 8, batch: 8}}\n"
                      "inputs: [{shape: [64, 32]}, {shape: [64, 32]}]\n")
    code, text = run_config(str(config), RunOptions(backend="mpi", steps=2, run_dir=str(tmp_path / "run"), pipeline_schedule=schedule))
    printed = capsys.readouterr().out
    assert code == 0, text + printed
    assert f"pipeline: 4 stages (2 on each of 2 device groups) x 2 devices, 4 micro-batches, {schedule} (searched" in printed
    assert "bytes: measured = predicted on every rank" in printed and "measured/predicted 1.000..1.000: equal" in printed
    assert "limit 0.0003): OK" in printed


def test_auto_chooses_the_fastest_schedule_a_named_one_gives_and_trains_like_stand_alone():
    """``pipeline_schedule: auto`` plans the schedule and chunks whose predicted step is the least
    of every schedule named by hand (interleaved_1f1b with 2 chunks: 4 units per group's 2), and
    the plan it gives trains on local ranks like one device."""
    steps = {}
    for schedule in SCHEDULE_ORDERS:
        reset_auto_parallel_context()
        cell, net = _cell(schedule)
        plan, _, _ = training_plan(cell, None, net.example_inputs(), steps=1)
        steps[schedule] = plan.pipeline.split.step_time_ns
    reset_auto_parallel_context()
    cell, net = _cell("auto", chunks=2)
    plan, _, _ = training_plan(cell, None, net.example_inputs(), steps=1)
    assert plan.pipeline.split.step_time_ns == min(steps.values())
    assert steps[plan.pipeline.schedule] == min(steps.values()) and plan.pipeline.origin == "schedule and split searched"
    report = train(cell, net.example_inputs(), steps=2, log=None)
    assert report.ok and report.loss_error <= 1e-5 and report.parameter_error <= 1e-5, report.text


def test_auto_keys_and_their_errors():
    text = ("model: {name: TransformerStack, params: {layers: 4, hidden: 32, heads: 4, seq: 8, batch: 8}}\n"
            "inputs: [{shape: [64, 32]}, {shape: [64, 32]}]\noptimizer: {name: sgd, learning_rate: 0.1}\n"
            "device_num: 4\npipeline_stages: 2\nmicro_size: 4\n")
    assert parse_config(text + "pipeline_schedule: auto\n", "s.yaml").context.pipeline_schedule_chunks() == ("auto", None)
    config = parse_config(text + "pipeline_schedule: auto\npipeline_interleave_num: 3\n", "s.yaml")
    assert config.context.pipeline_schedule_chunks() == ("auto", 3)
    with pytest.raises(ConfigError, match=r"^s.yaml: pipeline_schedule must be one of 1f1b, gpipe, interleaved_1f1b, zbv, "
                                          r"zero_bubble_h1, auto; got 'best'$"):
        parse_config(text + "pipeline_schedule: best\n", "s.yaml")
    with pytest.raises(ConfigError, match=r"^s.yaml: pipeline_schedule is 'auto' but pipeline_config asks for 'gpipe'"):
        parse_config(text + "pipeline_schedule: auto\npipeline_config: {pipeline_scheduler: gpipe}\n", "s.yaml")
    with pytest.raises(ConfigError, match=r"^s.yaml: pipeline_interleave_num must be a positive integer"):
        parse_config(text + "pipeline_schedule: auto\npipeline_interleave_num: 0\n", "s.yaml")


def test_auto_with_marked_stages_is_refused():
    from autostrat.autodiff import Adam, build_training
    from autostrat.frontend import trace
    from autostrat.search import SearchOptions
    from autostrat.search.pipeline import plan_pipeline

    net = TransformerStack(layers=2, hidden=16, heads=2, seq=4, batch=4)
    graph = build_training(trace(net, *net.example_inputs()), Adam())
    with pytest.raises(ConfigError, match="^pipeline_schedule auto chooses the schedule with the split, but cells set "
                                          "pipeline_stage: name a schedule"):
        plan_pipeline(graph, 4, 2, 2, SearchOptions(), "auto", marks={"blocks.0": 0, "blocks.1": 1})
