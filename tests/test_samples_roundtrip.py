"""Six of issue #31's samples (tests/fixtures/mindspore_samples) and MindSpore 2.10, both ways
(tests/fixtures/mindspore/README.md, "Six samples both ways"): the strategy checkpoints MindSpore
saved for each sample's training step seed autostrat op for op, and the checkpoints autostrat
writes for the same step are what MindSpore compiled when it loaded them. MindSpore is not
needed: its files are fixtures. Each sample runs here in-process up to its dataset (its context,
``init()`` with ``RANK_SIZE=8``, its network and settings); its step is planned, not run."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

import autostrat as ms
from autostrat import nn
from autostrat.frontend import mindspore_keys, ms_context
from autostrat.search.mindspore_checkpoint import mindspore_names, read_mindspore_plan
from tests.mindspore_samples import SAMPLE_FILES, SAMPLES, rename_imports

FIXTURES = Path(__file__).parent / "fixtures" / "mindspore"
ROUNDTRIP = ("sharding_propagation", "operator_parallel", "optimizer_parallel", "pipeline_parallel", "recompute",
             "strategy_saving")
# MindSpore's dry run is rank 0 of 8: in the pipeline sample, stage 0 of 2 (ranks 0-3). Its files
# hold stage 0's ops and parameters only; these are stage 1's.
STAGE_1 = {"pipeline_parallel": ({"BiasAdd_layer3.bias", "MatMul_layer3.weight"}, {"layer3.bias", "layer3.weight"})}
_SHARD_LINE = re.compile(r"^net\.[\w.]+\.shard\(.*\)$", re.MULTILINE)  # the samples' shard calls, one line each
BATCH = 32  # the samples' dataset batch: each rank's share (full_batch=False)


def sample_network(name: str, sharded: bool = True):
    """The network of sample `name` (a key of SAMPLE_FILES), made by running the renamed sample
    up to its dataset as 8 ranks, with its shard lines left out unless `sharded`."""
    source = rename_imports((SAMPLES / SAMPLE_FILES[name]).read_text())
    prefix = source[:source.index("def create_dataset")]
    if not sharded:
        prefix = _SHARD_LINE.sub("", prefix)
    scope = {"__name__": f"sample_{name}"}
    exec(compile(prefix, SAMPLE_FILES[name], "exec"), scope)
    return scope["net"]


def training_step(name: str, net):
    """The sample's training step as a `TrainOneStepCell`: its loss (CrossEntropyLoss), its
    optimizer and, for the pipeline sample, its ``PipelineCell(WithLossCell(net, loss_fn), 4)``
    (samples_mindspore.py builds the same; for the pipeline it runs the sample's own step)."""
    loss = nn.WithLossCell(net, nn.CrossEntropyLoss())
    if name == "pipeline_parallel":
        loss = nn.PipelineCell(loss, 4)
    if name == "sharding_propagation":
        return nn.TrainOneStepCell(loss, nn.Momentum(net.trainable_params(), 1e-3, 0.1))
    return nn.TrainOneStepCell(loss, nn.SGD(net.trainable_params(), 1e-2))


def plan_sample(name: str, sharded: bool = True, **checkpoint):
    """The plan of sample `name`'s training step on its global batch (its data-parallel ranks'
    shares of 32: 8, or 4 with the pipeline's 2 stages), under its own context and `checkpoint` as
    ``strategy_ckpt_config``."""
    net = sample_network(name, sharded)
    if checkpoint:
        ms.set_auto_parallel_context(strategy_ckpt_config=checkpoint)
    rows = BATCH * ms.get_auto_parallel_context("device_num") // ms.get_auto_parallel_context("pipeline_stages")
    return ms.parallelize(training_step(name, net), nn.Tensor(shape=(rows, 1, 28, 28)),
                          nn.Tensor(shape=(rows,), dtype=ms.int32))


@pytest.fixture(autouse=True)
def _eight_ranks(monkeypatch, tmp_path):
    monkeypatch.setenv("RANK_SIZE", "8")
    monkeypatch.chdir(tmp_path)  # the samples' save_graphs=2 dumps land here
    yield
    ms.reset_auto_parallel_context()
    ms_context.reset_context()
    mindspore_keys.forget_warnings()  # the samples' accepted-but-ignored settings warn again in the next test


def _tuples(strategy) -> list[list[int]]:
    return [list(part) for part in strategy.to_tuples()]


@pytest.mark.parametrize("suffix", ["json", "ckpt"])
@pytest.mark.parametrize("name", ROUNDTRIP)
def test_mindspores_checkpoint_of_each_sample_seeds_its_plan_op_for_op(name, suffix):
    """The sample without its shard calls, seeded by the file MindSpore saved for it (its shard
    calls, or what MindSpore's propagation chose), plans every op MindSpore named with
    MindSpore's strategy."""
    path = FIXTURES / f"samples_{name}_strategy.{suffix}"
    saved = json.loads((FIXTURES / f"samples_{name}_strategy.json").read_text())["parallel_strategy_item"]
    plan = plan_sample(name, sharded=False, load_file=str(path))
    ops = {mindspore: op for op, mindspore in mindspore_names(plan.graph).items()}
    assert set(saved) <= set(ops)
    assert {mindspore: _tuples(plan.ops[ops[mindspore]].strategy) for mindspore in saved} == {
        mindspore: item["parallel_strategy"] for mindspore, item in saved.items()}


@pytest.mark.parametrize("name", ROUNDTRIP)
def test_autostrat_writes_each_samples_checkpoint_as_mindspore_compiled_it(name, tmp_path):
    """MindSpore 2.10 loaded autostrat's checkpoints of the sample's step (no shard call in its
    script) and compiled them; autostrat still writes exactly those strategy items, in both
    formats (the pipeline's stage 1 items, which rank 0 does not compile, on stage 1)."""
    compiled = json.loads((FIXTURES / f"samples_{name}_compiled_from_autostrat.json").read_text())
    plan_sample(name, save_file=str(tmp_path / "s.json"))
    ms.reset_auto_parallel_context()
    plan_sample(name, save_file=str(tmp_path / "s.ckpt"))
    ours = json.loads((tmp_path / "s.json").read_text())["parallel_strategy_item"]
    later = STAGE_1.get(name, (set(), set()))[0]
    assert all(ours[mindspore]["stage"] == 1 for mindspore in later)
    assert {mindspore: item for mindspore, item in ours.items() if mindspore not in later} == compiled["parallel_strategy_item"]
    seeds, _ = read_mindspore_plan(tmp_path / "s.ckpt")
    assert {mindspore: seed for mindspore, seed in seeds.items() if mindspore not in later} == {
        mindspore: (tuple(map(tuple, item["parallel_strategy"])), None) for mindspore, item in compiled["parallel_strategy_item"].items()}


@pytest.mark.parametrize("name", ROUNDTRIP)
def test_mindspore_placed_each_parameter_where_autostrats_checkpoint_puts_it(name, tmp_path):
    """Every parameter layout autostrat writes is the one MindSpore compiled from its file, and
    both shard the same parameters' optimizer updates; MindSpore writes such a group over all
    of a parameter's replicas as size -1 (its ``optimizer_weight_shard_size`` default), autostrat
    as the replica count (8)."""
    compiled = json.loads((FIXTURES / f"samples_{name}_compiled_from_autostrat.json").read_text())["parallel_layout_item"]
    plan_sample(name, save_file=str(tmp_path / "s.json"))
    ours = json.loads((tmp_path / "s.json").read_text())["parallel_layout_item"]
    assert set(ours) - set(compiled) == STAGE_1.get(name, (set(), set()))[1]
    ours = {parameter: item for parameter, item in ours.items() if parameter in compiled}
    size = "opt_weight_shard_size"
    for parameter, item in ours.items():
        theirs = compiled[parameter]
        assert {k: v for k, v in item.items() if k not in ("slice_shape", size)} == {
            k: v for k, v in theirs.items() if k != size}, parameter
        assert (item[size], theirs[size]) in ((0, 0), (8, -1)), parameter
