"""Training: optimiser ops, the training graph, the planned training step on LocalBackend
threads against the stand-alone run of the same graph, and the gradient-sync bytes."""

from __future__ import annotations

import numpy as np
import pytest

from autostrat import nn, reset_auto_parallel_context, set_auto_parallel_context
from autostrat.autodiff import Adam, build_training
from autostrat.errors import ConfigError
from autostrat.frontend import trace
from autostrat.frontend.context import current_context
from autostrat.frontend.train import TrainOneStepCell, WithLossCell, compare, train, training_plan
from autostrat.models import FFN, GPT, megatron_seeds
from autostrat.runtime.local import LocalCluster
from autostrat.runtime.training import reference_graph, train_collective, train_locally, train_reference, train_single_device


@pytest.fixture(autouse=True)
def _reset():
    yield
    reset_auto_parallel_context()


def _ffn_cell(learning_rate=0.1):
    net = FFN()
    net.dense1.matmul.shard(((2, 1), (1, 4)))
    loss = WithLossCell(net, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"))
    return TrainOneStepCell(loss, nn.Momentum(net.trainable_params(), learning_rate, 0.9))


FFN_INPUTS = (nn.Tensor(shape=(64, 64)), nn.Tensor(shape=(64,), dtype="int32"))


def _seed_gpt(net, seeds):
    for name, (strategy, _) in seeds.items():
        primitive = net
        for part in name.split("."):
            primitive = primitive[int(part)] if part.isdigit() else getattr(primitive, part)
        primitive.shard(strategy)


def test_training_graph_has_one_update_per_parameter_and_the_loss_as_output():
    graph = build_training(trace(FFN(), nn.Tensor(shape=(64, 64))), Adam())
    updates = dict(graph.updates)
    assert graph.outputs == ("dense2.bias_add:0",)
    assert {"dense1.weight", "moment1.dense1.weight", "moment2.dense1.weight", "beta1_power"} <= set(updates)
    assert graph.ops["optimizer/dense1.weight"].op_type == "ApplyAdam"


def test_tutorial_ffn_trains_20_momentum_steps_like_stand_alone_and_bytes_match():
    set_auto_parallel_context(parallel_mode="auto_parallel", device_num=8)
    report = train(_ffn_cell(), FFN_INPUTS, steps=20, log=None)
    assert report.ok, report.text
    assert report.loss_error <= 1e-5 and report.parameter_error <= 1e-5
    assert report.result.losses[-1] < report.result.losses[0]  # it learns the synthetic labels
    # The gradients of the weights replicated over the data-parallel axis are AllReduced.
    assert report.result.measured[0]["sync"] > 0


def test_gradient_sync_is_an_allreduce_over_exactly_the_replica_axes():
    set_auto_parallel_context(parallel_mode="auto_parallel", device_num=8)
    plan, _, _ = training_plan(_ffn_cell(), None, FFN_INPUTS)
    sync = [e for e in plan.redistributions if e.consumer == "optimizer/dense1.weight"]
    assert [str(s.kind) for e in sync for s in e.plan.steps] == ["AllReduce"]
    stored = plan.layouts["dense1.weight"]
    assert plan.ops["optimizer/dense1.weight"].strategy.input_layouts[0] == stored
    assert sync[0].plan.steps[0].group_size == 2  # dense1.weight is split 4 ways, replicated 2


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["megatron", "data_parallel"])
def test_gpt_two_layers_trains_with_adam_like_stand_alone(mode):
    # The mean over replicas: summed over 8 (gradients_mean=False), the rounding noise of exactly
    # zero gradients (an attention key's bias) grows against Adam's eps 1e-8 and the parameters
    # end 1.07e-5 from one device's (test_the_default_context_sums... checks the sum, with Momentum).
    net = GPT(layers=2, batch=8)
    if mode == "megatron":
        set_auto_parallel_context(parallel_mode="auto_parallel", device_num=8, gradients_mean=True)
        _seed_gpt(net, megatron_seeds(2, 4, data_parallel=2))
    else:
        set_auto_parallel_context(parallel_mode="data_parallel", device_num=8, gradients_mean=True)
    plan, values, batches = training_plan(TrainOneStepCell(net, nn.Adam(net.trainable_params(), 1e-3)), None, net.example_inputs(), 8)
    run, alone = train_locally(plan, values, batches), train_reference(reference_graph(plan), values, batches)
    report = compare(plan, run, alone)
    assert report.ok, report.text
    assert run.measured == run.predicted and all(m["sync"] == plan.phase_bytes()["sync"] for m in run.measured)
    if mode == "data_parallel":
        # Every rank computes on its batch slice; every gradient is AllReduced over all 8.
        assert plan.phase_bytes()["backward"] == 0
        sync = [step for e in plan.redistributions if plan.edge_phase(e) == "sync" for step in e.plan.steps]
        assert {(str(step.kind), step.group_size) for step in sync} == {("AllReduce", 8)}
        assert len(sync) == len(net.trainable_params())


def test_phase_train_without_an_optimizer_uses_momentum_and_rejects_two_outputs():
    set_auto_parallel_context(parallel_mode="auto_parallel", device_num=8, phase="train")
    plan, _, _ = training_plan(FFN(), None)
    assert plan.graph.ops["optimizer/dense1.weight"].op_type == "ApplyMomentum"
    with pytest.raises(ConfigError, match="phase must be one of predict, train"):
        set_auto_parallel_context(phase="learn")


@pytest.mark.parametrize("mode", ["auto_parallel", "data_parallel"])
def test_gradients_mean_false_sums_the_replicas_gradients(mode):
    """One SGD step: the distributed update of every parameter is its replica count times the
    stand-alone update (MindSpore's sum over replicas of their batch-mean gradients)."""
    set_auto_parallel_context(parallel_mode=mode, device_num=8, gradients_mean=False)
    net = FFN()
    if mode == "auto_parallel":
        net.dense1.matmul.shard(((2, 1), (1, 4)))
    loss = WithLossCell(net, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"))
    plan, values, batches = training_plan(TrainOneStepCell(loss, nn.SGD(net.trainable_params(), 0.1)), None, FFN_INPUTS, 1)
    # plan.graph's updates carry no replica counts: run on one device it is the true
    # stand-alone step, the gradient of the whole batch's loss.
    run, alone = train_locally(plan, values, batches), train_single_device(plan.graph, values, batches)
    assert run.losses == pytest.approx(alone.losses, rel=1e-6)  # the forward pass is unchanged
    replicas = {}
    for name in alone.parameters:
        replicas[name] = len(plan.layouts[name].replica_groups()[0])
        assert plan.replicas(name) == replicas[name]  # the one definition the lowering and the reference use
        step, alone_step = values[name] - run.parameters[name], values[name] - alone.parameters[name]
        np.testing.assert_allclose(step, replicas[name] * alone_step, rtol=1e-4, atol=1e-7)
    # Data parallel replicates every parameter 8 ways; the seeded plan splits the weights 4 ways
    # (and keeps dense2's bias whole: its output's partial sums are scattered by rows).
    assert replicas == (dict.fromkeys(replicas, 8) if mode == "data_parallel" else
                        {"dense1.weight": 2, "dense1.bias": 2, "dense2.weight": 2,
                         "dense2.bias": 8})


def _gpt_momentum_cell():
    net = GPT(layers=2, hidden=64, heads=8, seq=16, batch=8, vocab=128)
    _seed_gpt(net, megatron_seeds(2, 4, data_parallel=2))
    return TrainOneStepCell(net, nn.Momentum(net.trainable_params(), 0.1, 0.9)), net.example_inputs()


@pytest.mark.parametrize("model", ["ffn", "gpt"])
def test_the_default_context_sums_replicas_and_the_reference_sums_them_too(model):
    """MindSpore's default, gradients_mean=False, on 8 threads: the run equals the JAX reference
    of `reference_graph` (each update summing its parameter's replica count of gradients)
    within 1e-5, and that is not the plain stand-alone run (the check can fail)."""
    set_auto_parallel_context(parallel_mode="auto_parallel", device_num=8)
    assert not current_context().gradients_mean
    cell, inputs = (_ffn_cell(), FFN_INPUTS) if model == "ffn" else _gpt_momentum_cell()
    plan, values, batches = training_plan(cell, None, inputs, 3)
    run = train_locally(plan, values, batches)
    summed, plain = train_reference(reference_graph(plan), values, batches), train_single_device(plan.graph, values, batches)
    report = compare(plan, run, summed)
    assert report.ok and report.loss_error <= 1e-5 and report.parameter_error <= 1e-5, report.text
    assert "the stand-alone run sums as many copies" in report.text
    assert compare(plan, run, plain).parameter_error > 1e-3
    assert max(plan.replicas(name) for name, _ in plan.graph.updates if f"grad/{name}" in plan.graph.tensors) > 1


def test_gradients_mean_must_be_a_bool():
    with pytest.raises(ConfigError, match="gradients_mean must be True or False, got 'yes'"):
        set_auto_parallel_context(gradients_mean="yes")


def test_memory_counts_optimizer_state_in_its_parameters_layout():
    """Momentum keeps one accumulation per parameter, stored like the parameter: the peak of the
    same plan grows by exactly the parameters' per-device bytes over SGD's; budgets then work."""
    from autostrat.search.memory import peak_bytes
    from autostrat.search.problem import build_problem
    from autostrat.search.propagate import propagate

    graphs = {}
    for name, optimizer in (("sgd", nn.SGD), ("momentum", nn.Momentum)):
        net = FFN()
        net.dense1.matmul.shard(((2, 1), (1, 4)))
        kwargs = {"momentum": 0.9} if name == "momentum" else {}
        cell = TrainOneStepCell(net, optimizer(net.trainable_params(), 0.1, **kwargs))
        graphs[name] = build_training(trace(net, nn.Tensor(shape=(64, 64)), device_num=8), cell.optimizer)
    problems = {name: build_problem(graph, 8) for name, graph in graphs.items()}
    assert set(problems["momentum"].state_of) == {f"moments.{p}" for p in ("dense1.weight", "dense1.bias", "dense2.weight", "dense2.bias")}
    choice = propagate(problems["sgd"]).choice
    stored = {}
    for parameter in problems["momentum"].state_of.values():
        op, index = graphs["sgd"].consumers(parameter)[0]
        stored[parameter] = 4 * np.prod(problems["sgd"].candidates[op][choice[op]].input_layouts[index].slice_shape)
    assert stored["dense1.weight"] == stored["dense2.weight"] == 4 * 64 * 64 // 4  # both weights split 4 ways
    assert peak_bytes(problems["momentum"], choice) - peak_bytes(problems["sgd"], choice) == sum(stored.values())


def test_train_collective_keeps_adams_scalar_state_scalar():
    set_auto_parallel_context(parallel_mode="auto_parallel", device_num=8)
    net = FFN()
    net.dense1.matmul.shard(((2, 1), (1, 4)))
    cell = TrainOneStepCell(WithLossCell(net, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")),
                            nn.Adam(net.trainable_params(), 1e-3))
    plan, values, batches = training_plan(cell, None, FFN_INPUTS, 2)
    runs = LocalCluster(8).run(lambda backend: train_collective(plan, backend, values, batches))
    alone = train_single_device(reference_graph(plan), values, batches)
    assert runs[1] is None and runs[0].parameters["beta1_power"].shape == ()
    assert compare(plan, runs[0], alone).ok
