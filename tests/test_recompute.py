"""Recompute (`Cell.recompute`, YAML ``recompute``): the backward reads recomputed copies of a
cell's activations, training still equals one device with measured = predicted bytes, and the
predicted peak falls while the predicted time rises."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from autostrat import nn, ops
from autostrat.autodiff import Adam, build_training
from autostrat.autodiff.recompute import RECOMPUTE_PREFIX, recompute_cells
from autostrat.errors import ConfigError
from autostrat.frontend import trace
from autostrat.frontend.cell import recomputed_cells
from autostrat.frontend.config import apply_seeds, load_config
from autostrat.frontend.run import plan_config
from autostrat.frontend.train import synthetic_batches
from autostrat.models import TransformerStack, megatron_seeds
from autostrat.runtime.executor import graph_values
from autostrat.runtime.training import reference_graph, train_locally, train_single_device
from autostrat.search import search

ROOT = Path(__file__).resolve().parent.parent
BLOCKS = ("blocks.0", "blocks.1")


def _stack_graph(layers: int = 2, seq: int = 16, batch: int = 4):
    net = TransformerStack(layers=layers, hidden=64, heads=8, seq=seq, batch=batch)
    graph = trace(net, *net.example_inputs(), device_num=8)
    return apply_seeds(graph, megatron_seeds(layers, 4, True, data_parallel=2), 8)


def _block_of(name: str) -> str | None:
    """The block (``blocks.<i>``) a forward, bprop or recomputed op belongs to, read from its name."""
    core = name.removeprefix(RECOMPUTE_PREFIX).removeprefix("bprop/")
    return next((block for block in BLOCKS if core.startswith(block + ".")), None)


def test_a_blocks_backward_reads_its_own_recomputed_activations_and_others_read_originals():
    """The rule: a backward op reads the recomputed copy of what its own block recomputes, and
    the original of what another block produced. Until this rule, every backward op read the
    copies: block 1's first bprop (its layer norm's) read block 0's recomputed output, which block
    0's backward made, so on 2 pipeline stages stage 1's backward waited for stage 0's, and
    interleaved_1f1b, zero_bubble_h1 and zbv deadlocked (`tests/test_pipeline_recompute.py`).
    That original is kept anyway: block 1's forward reads it, and block 1's copies too (their
    input)."""
    forward = _stack_graph()
    plain = build_training(forward, Adam(1e-3))
    graph = build_training(forward, Adam(1e-3), recompute=BLOCKS)
    names = list(graph.ops)
    inside = {name for name in forward.ops if name.startswith(BLOCKS)}
    copies = [name for name in names if name.startswith(RECOMPUTE_PREFIX)]
    assert copies and all(name.removeprefix(RECOMPUTE_PREFIX) in inside for name in copies)
    across = []  # (reader, original) read by another block's backward
    for name in inside:
        for tensor in graph.ops[name].outputs:
            for reader, _ in graph.consumers(tensor):
                if reader in forward.ops or reader.startswith(RECOMPUTE_PREFIX):
                    continue
                assert _block_of(reader) != _block_of(name), (reader, tensor)  # its own block's backward reads the copy
                assert any(r in forward.ops for r, _ in graph.consumers(tensor)), tensor  # kept anyway
                across.append((reader, tensor))
    assert ("bprop/blocks.1.ln1.layer_norm/layer_norm_grad", "blocks.0.residual2:0") in across
    for copy in copies:  # every copy is read by its own block's backward (or its copies) alone
        for tensor in graph.ops[copy].outputs:
            assert all(_block_of(reader) == _block_of(copy) for reader, _ in graph.consumers(tensor)), tensor
    # A block's output, read by no bprop of its own (an add's gradient needs no input), is not recomputed.
    assert RECOMPUTE_PREFIX + "blocks.0.residual2" not in graph.ops and RECOMPUTE_PREFIX + "blocks.0.residual1" in graph.ops
    for copy in copies:  # a copy reads copies of its own block, or what the block reads from outside
        block = next(b for b in BLOCKS if copy.startswith(RECOMPUTE_PREFIX + b))
        for tensor in graph.ops[copy].inputs:
            producer = graph.tensors[tensor].producer or ""
            assert producer.startswith(RECOMPUTE_PREFIX + block) or not producer.startswith(block), (copy, tensor)
    for copy in copies:  # each copy comes after the forward and before every op reading it
        readers = [names.index(reader) for tensor in graph.ops[copy].outputs for reader, _ in graph.consumers(tensor)]
        assert len(forward.ops) <= names.index(copy) < min(readers)
    # The second block's copies come first: its backward runs first.
    first = {block: min(names.index(c) for c in copies if c.startswith(RECOMPUTE_PREFIX + block)) for block in BLOCKS}
    assert first["blocks.1"] < first["blocks.0"]
    assert len(graph.ops) == len(plain.ops) + len(copies)


def test_an_unknown_cell_or_option_is_refused():
    with pytest.raises(ConfigError, match="no forward op belongs to cell 'blocks.7'"):
        build_training(_stack_graph(), Adam(1e-3), recompute=("blocks.7",))
    with pytest.raises(ConfigError, match="unknown option 'slices'"):
        TransformerStack(layers=1, hidden=64, heads=8, seq=16, batch=4).recompute(slices=True)


def test_a_cell_marked_by_recompute_is_listed_by_its_path():
    net = TransformerStack(layers=2, hidden=64, heads=8, seq=16, batch=4)
    net.blocks[1].recompute(mp_comm_recompute=True)
    assert recomputed_cells(net) == ("blocks.1",)


def test_recompute_trades_time_for_activation_memory():
    forward = _stack_graph(layers=4, seq=128, batch=16)  # activations outweigh the weights
    plain = search(build_training(forward, Adam(1e-3)), 8)
    again = search(build_training(forward, Adam(1e-3), recompute=tuple(f"blocks.{i}" for i in range(4))), 8)
    assert again.prediction.peak_bytes < 0.6 * plain.prediction.peak_bytes
    assert again.prediction.step_time_ns > plain.prediction.step_time_ns
    # Recomputed ops run as their forward ops ran (seeded ones keep their seed).
    for name, op in again.ops.items():
        if name.startswith(RECOMPUTE_PREFIX):
            assert op.strategy == again.ops[name.removeprefix(RECOMPUTE_PREFIX)].strategy, name


class _Dropped(nn.Cell):
    """A dense layer and a Dropout in one recomputed cell: the mask must be drawn again alike."""

    def __init__(self):
        super().__init__()
        self.dense = nn.Dense(64, 64)
        self.drop = nn.Dropout(keep_prob=0.7)
        self.relu = ops.ReLU()

    def construct(self, x):
        return self.drop(self.relu(self.dense(x)))


def _config_plan(tmp_path, name: str, extra: str):
    path = tmp_path / f"{name}.yaml"
    path.write_text((ROOT / "configs" / f"{name}.yaml").read_text() + extra)
    plan, _ = plan_config(load_config(path))
    return plan, graph_values(plan.graph, {}), synthetic_batches(plan.graph, 2)


@pytest.mark.parametrize("name", ["transformer_stack", "gpt_train"])
def test_recomputed_training_equals_one_device(tmp_path, name):
    plan, values, batches = _config_plan(tmp_path, name, "recompute: [blocks.0, blocks.1]\n")
    assert any(op.startswith(RECOMPUTE_PREFIX) for op in plan.ops)
    run, alone = train_locally(plan, values, batches), train_single_device(reference_graph(plan), values, batches)
    np.testing.assert_allclose(run.losses, alone.losses, rtol=1e-5)
    for tensor, want in alone.parameters.items():
        np.testing.assert_allclose(run.parameters[tensor], want, rtol=0, atol=1e-5 * max(1.0, float(np.abs(want).max())), err_msg=tensor)
    assert run.bytes_match


def test_a_recomputed_dropout_draws_the_same_mask():
    forward = trace(_Dropped().set_train(), nn.Tensor(shape=(64, 64)), device_num=8)
    graph = recompute_cells(build_training(forward, Adam(1e-3)), ("",), set(forward.ops))
    values = graph_values(graph, {})
    batches = synthetic_batches(graph, 1)
    # One device: the recomputed graph's gradients equal the plain graph's.
    plain = train_single_device(build_training(forward, Adam(1e-3)), values, batches)
    again = train_single_device(graph, values, batches)
    for tensor, want in plain.parameters.items():
        np.testing.assert_array_equal(again.parameters[tensor], want, err_msg=tensor)


def test_a_yaml_recompute_path_must_name_a_cell(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text((ROOT / "configs" / "transformer_stack.yaml").read_text() + "recompute: [block.0]\n")
    with pytest.raises(ConfigError, match=r"recompute: 'block.0' is not a cell of TransformerStack \(did you mean 'blocks.0'\?\)"):
        load_config(path)


def test_recompute_and_optimizer_sharding_on_8_mpi_ranks(tmp_path):
    from tests.test_mpi import assert_nothing_left, run

    path = tmp_path / "stack.yaml"
    path.write_text((ROOT / "configs" / "transformer_stack.yaml").read_text()
                    + "recompute: [blocks.0, blocks.1]\nparallel_optimizer_config: {parallel_optimizer_threshold: 0}\n")
    code, out, err, run_dir, _ = run(tmp_path, str(path), "--device-num", "8", "--steps", "2", "--parallel-optimizer")
    assert code == 0, err
    assert "bytes: measured = predicted on every rank" in out and ": OK" in out
    assert "recompute/blocks.0" in out
    assert_nothing_left(run_dir, 8)


def test_the_command_line_adds_cells_to_recompute(capsys):
    from autostrat.cli import main

    assert main(["search", str(ROOT / "configs" / "transformer_stack.yaml"), "--recompute", "blocks.1"]) == 0
    out = capsys.readouterr().out
    assert "recompute/blocks.1." in out and "recompute/blocks.0." not in out
    assert main(["search", str(ROOT / "configs" / "transformer_stack.yaml"), "--recompute", "block.1"]) != 0
    assert "--recompute: 'block.1' is not a cell of TransformerStack (did you mean 'blocks.1'?)" in capsys.readouterr().err


CORE = ("scores", "scale", "mask", "softmax", "context")  # the attention core (Megatron's selective recompute)


def test_chained_primitives_are_recomputed_together_and_training_equals_one_device():
    net = TransformerStack(layers=2, hidden=64, heads=8, seq=16, batch=4)
    for block in net.blocks:
        for name in CORE:
            getattr(block.attention, name).recompute()
    marked = recomputed_cells(net)
    forward = apply_seeds(trace(net, *net.example_inputs(), device_num=8), megatron_seeds(2, 4, data_parallel=2), 8)
    graph = build_training(forward, Adam(1e-3), recompute=marked)
    copies = sorted(name.removeprefix(RECOMPUTE_PREFIX) for name in graph.ops if name.startswith(RECOMPUTE_PREFIX))
    # What the backward reads of the chain is rebuilt from its unmarked inputs (Q, K, V, the
    # constants): each copy reads only copies of the chain's ops, never their originals.
    assert copies and set(copies) <= set(marked)
    for name in copies:
        for tensor in graph.ops[RECOMPUTE_PREFIX + name].inputs:
            assert graph.tensors[tensor].producer not in marked, (name, tensor)
    for name in marked:  # no backward op reads an original output of the chain
        for tensor in graph.ops[name].outputs:
            assert all(reader in forward.ops for reader, _ in graph.consumers(tensor)), tensor
    plan = search(graph, 8)
    assert_trains_like_one_device(plan)


def assert_trains_like_one_device(plan) -> None:
    """Two steps of `plan` on local ranks equal the stand-alone run's losses and parameters
    (each parameter within 1e-5 of its own scale), with the bytes predicted."""
    values, batches = graph_values(plan.graph, {}), synthetic_batches(plan.graph, 2)
    run, alone = train_locally(plan, values, batches), train_single_device(reference_graph(plan), values, batches)
    np.testing.assert_allclose(run.losses, alone.losses, rtol=1e-5)
    for tensor, want in alone.parameters.items():
        np.testing.assert_allclose(run.parameters[tensor], want, rtol=0, atol=1e-5 * max(1.0, float(np.abs(want).max())), err_msg=tensor)
    assert run.bytes_match
