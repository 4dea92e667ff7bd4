"""Checkpoints: whole parameters and optimiser state saved from one training run continue it
under another strategy and device_num; the strategy checkpoint of a training plan seeds the
same plan again."""

from __future__ import annotations

import io
import json
import os
import struct
import zipfile
import warnings

import numpy as np
import pytest

from autostrat import nn, reset_auto_parallel_context, set_auto_parallel_context
from autostrat.errors import CheckpointError, ConfigError
from autostrat.frontend.api import plan_for
from autostrat.frontend.context import current_context
from autostrat.frontend.train import TrainOneStepCell, WithLossCell, relative_error, train, training_plan
from autostrat.models import FFN
from autostrat.runtime.checkpoint import check_checkpoint, checkpoint_bytes, checkpoint_tensors, load_checkpoint, save_checkpoint
from autostrat.runtime.training import train_locally
from autostrat.search import load_checkpoint_seeds

FFN_INPUTS = (nn.Tensor(shape=(64, 64)), nn.Tensor(shape=(64,), dtype="int32"))
STEPS = 3  # trained before the checkpoint; the runs compared take the step after


@pytest.fixture(autouse=True)
def _reset():
    yield
    reset_auto_parallel_context()


def _ffn_cell(strategy=((2, 1), (1, 4))):
    net = FFN()
    if strategy is not None:
        net.dense1.matmul.shard(strategy)
    loss = WithLossCell(net, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"))
    return TrainOneStepCell(loss, nn.Momentum(net.trainable_params(), 0.1, 0.9))


def _plan(device_num, strategy=((2, 1), (1, 4)), steps=STEPS + 1, initial=None, **context):
    reset_auto_parallel_context()
    set_auto_parallel_context(parallel_mode="auto_parallel", device_num=device_num, **context)
    return training_plan(_ffn_cell(strategy), None, FFN_INPUTS, steps=steps, initial=initial)


def _strategies(plan) -> dict:
    return {name: str(op.strategy) for name, op in plan.ops.items()}


@pytest.fixture(scope="module")
def saved_8_rank_run(tmp_path_factory):
    """An 8-rank run of STEPS steps saved to a checkpoint, and the same run one step longer;
    the gradients are the mean over replicas (gradients_mean=True), so that the continuations
    on 4 ranks below, whose parameters have other replica counts, compute the same steps."""
    plan, values, batches = _plan(8, gradients_mean=True)
    path = tmp_path_factory.mktemp("ckpt") / "ffn.npz"
    save_checkpoint(train_locally(plan, values, batches[:STEPS]), path)
    continued = train_locally(plan, values, batches)
    reset_auto_parallel_context()
    return plan, batches, path, continued


def test_checkpoint_of_8_ranks_continues_on_4_ranks_with_another_strategy(saved_8_rank_run):
    plan8, batches, path, continued = saved_8_rank_run
    plan4, values4, _ = _plan(4, ((1, 4), (4, 1)), initial=load_checkpoint(path), gradients_mean=True)
    # Really another layout: dense1.weight is split by columns on 8 ranks, by rows on 4.
    weight = "dense1.weight"
    assert (plan8.layouts[weight].parts, plan4.layouts[weight].parts) == ((1, 4), (4, 1))
    resumed = train_locally(plan4, values4, batches[STEPS:])
    assert resumed.bytes_match
    np.testing.assert_allclose(resumed.losses[0], continued.losses[-1], rtol=1e-5)
    assert set(resumed.parameters) == set(continued.parameters)
    assert relative_error(resumed.parameters, continued.parameters) <= 1e-5


def test_resuming_needs_the_saved_parameters_and_moments(saved_8_rank_run):
    _, batches, path, continued = saved_8_rank_run
    plan4, fresh, _ = _plan(4, ((1, 4), (4, 1)), gradients_mean=True)
    untrained = train_locally(plan4, fresh, batches[STEPS:])
    assert abs(untrained.losses[0] - continued.losses[-1]) > 1e-3 * abs(continued.losses[-1])
    loaded = load_checkpoint(path)
    restarted = loaded | {name: np.zeros_like(a) for name, a in loaded.items() if name.startswith("moments.")}
    without_moments = train_locally(plan4, fresh | restarted, batches[STEPS:])
    assert relative_error(without_moments.parameters, continued.parameters) > 1e-3


def test_save_then_load_gives_the_same_arrays_and_the_same_bytes(tmp_path):
    rng = np.random.default_rng(0)
    arrays = {"w": rng.normal(size=(4, 3)).astype(np.float32), "b": np.arange(3, dtype=np.int32), "beta1_power": np.float32(0.9)}
    first, second = tmp_path / "first.npz", tmp_path / "second.npz"
    save_checkpoint(arrays, first)
    save_checkpoint(dict(reversed(arrays.items())), second)  # insertion order does not matter
    assert first.read_bytes() == second.read_bytes()
    loaded = load_checkpoint(first)
    assert list(loaded) == ["b", "beta1_power", "w"]
    for name, array in arrays.items():
        assert loaded[name].dtype == np.asarray(array).dtype and np.array_equal(loaded[name], array)
    assert sorted(os.listdir(tmp_path)) == ["first.npz", "second.npz"]  # no temporary file left


def test_train_saves_the_final_parameters_and_optimizer_state(tmp_path):
    set_auto_parallel_context(parallel_mode="auto_parallel", device_num=8)
    path = tmp_path / "run" / "ffn.npz"
    report = train(_ffn_cell(), FFN_INPUTS, steps=2, log=None, save_checkpoint=path)
    saved = load_checkpoint(path)
    assert set(saved) == set(report.result.parameters) and "moments.dense1.weight" in saved
    assert all(np.array_equal(saved[name], array) for name, array in report.result.parameters.items())


def test_a_failed_save_keeps_the_old_file_and_leaves_no_temporary(tmp_path, monkeypatch):
    path = tmp_path / "ffn.npz"
    save_checkpoint({"w": np.ones(2, np.float32)}, path)

    def fail(*_):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(ConfigError, match="cannot write .*ffn.npz: No space left on device"):
        save_checkpoint({"w": np.zeros(2, np.float32)}, path)
    assert os.listdir(tmp_path) == ["ffn.npz"] and load_checkpoint(path)["w"].tolist() == [1.0, 1.0]


def _write_npy(path):
    with open(path, "wb") as file:  # a file object: np.save would add .npy to a name
        np.save(file, np.ones(2))


def _write_text(path):
    path.write_text("not a checkpoint\n")


def _write_truncated(path):
    save_checkpoint({"w": np.ones((8, 8), np.float32)}, path)
    path.write_bytes(path.read_bytes()[:300])


def _write_pickled(path):
    np.savez(path, w=np.array([{"a": 1}], dtype=object))


def _zipped(name: str, data: bytes) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr(name, data)
    return buffer.getvalue()


def _npy(header: bytes) -> bytes:
    header += b" " * (63 - len(header) % 64) + b"\n"  # .npy v1: magic, version, length, header
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header


def _write_bad_header(path):  # numpy parses the header with Python's tokenizer: TokenError
    path.write_bytes(_zipped("w.npy", _npy(b"{'descr': '<f8', 'fortran_order': False, 'shape': (2,")))


def _write_huge_header(path):  # 8 PB of float64: MemoryError
    path.write_bytes(_zipped("w.npy", _npy(b"{'descr': '<f8', 'fortran_order': False, 'shape': (1000000000000000,), }")))


def _with_central_directory_byte(offset: int, value: int):
    def write(path):
        data = bytearray(checkpoint_bytes({"w": np.ones(2)}))
        data[data.index(b"PK\x01\x02") + offset] = value
        path.write_bytes(bytes(data))
    return write


@pytest.mark.parametrize(
    "write, message",
    [
        (None, r"cannot read parameter checkpoint .*bad.npz: No such file or directory"),
        (_write_text, r"bad.npz: not a parameter checkpoint \(expected a numpy .npz archive\)"),
        (_write_npy, r"bad.npz: not a parameter checkpoint \(expected a numpy .npz archive\)"),
        (_write_truncated, r"bad.npz: not a (parameter checkpoint|readable parameter checkpoint)"),
        (_write_pickled, r"bad.npz: not a readable parameter checkpoint \(.npz of numeric arrays\): .*pickle"),
        (_write_bad_header, r"bad.npz: not a readable parameter checkpoint \(.npz of numeric arrays\): \('EOF in multi-line"),
        (_write_huge_header, r"bad.npz: not a readable parameter checkpoint: an array header claims more memory than there is"),
        (_with_central_directory_byte(10, 99), r"bad.npz: not a readable .*: That compression method is not supported"),
        (_with_central_directory_byte(8, 1), r"bad.npz: not a readable .*: File 'w.npy' is encrypted, password required"),
    ],
    ids=["missing", "text", "npy", "truncated", "pickled", "bad header", "huge header", "compression", "encrypted"],
)
def test_unreadable_checkpoints_are_named(tmp_path, write, message):
    path = tmp_path / "bad.npz"
    if write is not None:
        write(path)
    with pytest.raises(CheckpointError, match=message):
        load_checkpoint(path)


def test_saving_an_object_array_is_refused_before_writing(tmp_path):
    with pytest.raises(CheckpointError, match=r"w: a checkpoint holds numeric arrays, got dtype object"):
        save_checkpoint({"w": np.array([None])}, tmp_path / "ffn.npz")
    with pytest.raises(CheckpointError, match=r"expected \{name: array\} or a training result, got list"):
        save_checkpoint([np.ones(2)], tmp_path / "ffn.npz")
    assert os.listdir(tmp_path) == []


@pytest.fixture(scope="module")
def ffn_graph_and_state():
    plan, values, _ = _plan(8, steps=1)
    reset_auto_parallel_context()
    return plan.graph, {name: values[name] for name in checkpoint_tensors(plan.graph)}


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda s: s.pop("moments.dense2.bias"),
         r"initial: missing moments.dense2.bias \(float32 \[64\]\); the plan needs every parameter"),
        (lambda s: s.update({"moments.dense3.weight": np.zeros(2, np.float32)}),
         r"initial: not a parameter or optimizer state of the plan: moments.dense3.weight \(it updates dense1.weight"),
        (lambda s: s.update({"dense1.weight": np.zeros((32, 64), np.float32)}),
         r"initial: dense1.weight has shape \[32, 64\], the plan expects \[64, 64\]"),
        (lambda s: s.update({"dense1.bias": np.zeros(64, np.float64)}),
         r"initial: dense1.bias has dtype float64, the plan expects float32"),
    ],
    ids=["missing", "extra", "shape", "dtype"],
)
def test_a_checkpoint_that_does_not_fit_the_plan_is_named(ffn_graph_and_state, change, message):
    graph, state = ffn_graph_and_state
    state = dict(state)
    change(state)
    with pytest.raises(CheckpointError, match=message):
        check_checkpoint(graph, state, "initial")


def test_training_plan_checks_its_initial_values():
    with pytest.raises(CheckpointError, match=r"initial: missing dense1.weight \(float32 \[64, 64\]\)"):
        _plan(8, initial={})


def test_strategy_checkpoint_of_a_training_plan_seeds_the_same_plan(tmp_path):
    path = tmp_path / "strategy.json"
    saved, _, _ = _plan(8, steps=1, strategy_ckpt_save_file=str(path))
    data = json.loads(path.read_text())
    assert any(item["node_name"].startswith("bprop/") for item in data["autostrat"]["parallel_strategy_item"])
    # MindSpore's part names the forward ops reading parameters, and every parameter and state.
    assert set(data["parallel_strategy_item"]) == {"MatMul_dense1.weight", "BiasAdd_dense1.bias", "MatMul_dense2.weight",
                                                   "BiasAdd_dense2.bias"}
    assert set(data["parallel_layout_item"]) == {f"{kind}dense{i}.{p}" for kind in ("", "moments.") for i in (1, 2)
                                                 for p in ("weight", "bias")}
    weight = data["parallel_layout_item"]["dense1.weight"]
    assert (weight["tensor_shape"], weight["slice_shape"]) == ([64, 64], [64, 16])
    # An unseeded network planned from the checkpoint gets every strategy back: its forward ops
    # are seeded, the search derives the backward ones again (without a disagreement warning).
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loaded, _, _ = _plan(8, strategy=None, steps=1, strategy_ckpt_load_file=str(path))
    assert _strategies(loaded) == _strategies(saved)
    assert loaded.ops["backbone.relu"].origin == "seed"


def test_a_strategy_checkpoint_in_the_earlier_list_format_still_loads_as_seeds(tmp_path):
    path, old = tmp_path / "strategy.json", tmp_path / "old.json"
    _plan(8, steps=1, strategy_ckpt_save_file=str(path))
    data = json.loads(path.read_text())
    old.write_text(json.dumps({"device_num": 8, "parallel_strategy_item": data["autostrat"]["parallel_strategy_item"],
                               "parallel_layout_item": []}))  # as autostrat wrote it before MindSpore's format
    assert load_checkpoint_seeds(old) == load_checkpoint_seeds(path)


def test_training_strategy_checkpoint_plans_the_forward_pass_of_the_same_network(tmp_path):
    path = tmp_path / "strategy.json"
    saved, _, _ = _plan(8, steps=1, strategy_ckpt_save_file=str(path))
    reset_auto_parallel_context()
    set_auto_parallel_context(parallel_mode="auto_parallel", device_num=8, strategy_ckpt_load_file=str(path))
    forward = plan_for(_ffn_cell(None).network, FFN_INPUTS, current_context())
    assert _strategies(forward) == {name: _strategies(saved)[name] for name in forward.ops}


@pytest.mark.parametrize("renamed", ["bprop/backbone.relu/relu_grad", "optimizer/dense1.bias"])
def test_unknown_training_op_in_a_strategy_checkpoint_is_named(tmp_path, renamed):
    wrong = renamed.replace("backbone", "body").replace("dense1", "body1")
    path = tmp_path / "strategy.json"
    _plan(8, steps=1, strategy_ckpt_save_file=str(path))
    data = json.loads(path.read_text())
    for item in data["autostrat"]["parallel_strategy_item"]:
        if item["node_name"] == renamed:
            item["node_name"] = wrong
    path.write_text(json.dumps(data))
    with pytest.raises(ConfigError, match=f"strategy.json.{wrong}: the graph has no op named '{wrong}'; did you mean"):
        _plan(8, strategy=None, steps=1, strategy_ckpt_load_file=str(path))
