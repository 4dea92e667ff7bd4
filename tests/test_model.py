"""`Model.train` (MindSpore's loop): per-step losses equal the stand-alone run, callbacks see every
step, trained values carry over to `predict`, `eval` and the next `train`, bad elements fail early."""

from __future__ import annotations

import re

import numpy as np
import pytest

from autostrat import (
    LossMonitor,
    Model,
    nn,
    reset_auto_parallel_context,
    set_auto_parallel_context,
)
from autostrat.errors import ConfigError
from autostrat.frontend.model import Callback, batch_values
from autostrat.frontend.train import (
    TrainOneStepCell,
    WithLossCell,
    relative_error,
    training_plan,
)
from autostrat.models import FFN
from autostrat.runtime.training import reference_graph, train_single_device

FFN_INPUTS = (nn.Tensor(shape=(64, 64)), nn.Tensor(shape=(64,), dtype="int32"))


@pytest.fixture(autouse=True)
def _context():
    set_auto_parallel_context(parallel_mode="auto_parallel", device_num=8)
    yield
    reset_auto_parallel_context()


class Recorder(Callback):
    """Every moment a callback is told of, with the step, epoch and loss it saw."""

    def __init__(self):
        self.calls = []

    def _note(self, moment, run_context):
        params = run_context.original_args()
        self.calls.append((moment, params.cur_epoch_num, params.cur_step_num, params.net_outputs))

    def on_train_begin(self, run_context):
        self._note("begin", run_context)

    def on_train_step_end(self, run_context):
        self._note("step", run_context)

    def on_train_epoch_end(self, run_context):
        self._note("epoch", run_context)

    def on_train_end(self, run_context):
        self._note("end", run_context)

    def losses(self):
        return tuple(loss for moment, _, _, loss in self.calls if moment == "step")


def _dataset(count=3, seed=1):
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal((64, 64)).astype(np.float32), rng.integers(0, 64, 64).astype(np.int32)) for _ in range(count)]


def _parts():
    nn.set_seed(7)  # the same initial weights for the model and its stand-alone reference
    net = FFN()
    net.dense1.matmul.shard(((2, 1), (1, 4)))
    return net, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"), nn.Momentum(net.trainable_params(), 0.1, 0.9)


def _stand_alone(dataset, epochs):
    net, loss, optimizer = _parts()
    plan, values, _ = training_plan(TrainOneStepCell(WithLossCell(net, loss), optimizer), None, FFN_INPUTS)
    batches = [batch_values(element, plan.graph.inputs(), i) for i, element in enumerate(dataset)]
    return train_single_device(reference_graph(plan), values, batches * epochs)


def test_losses_equal_stand_alone_and_training_continues_from_the_trained_values():
    dataset, recorder = _dataset(), Recorder()
    net, loss, optimizer = _parts()
    model = Model(net, loss_fn=loss, optimizer=optimizer)
    reference = _stand_alone(dataset, epochs=3)
    model.train(2, iter(dataset), callbacks=[recorder])  # a one-pass iterator serves both epochs
    assert [c[:3] for c in recorder.calls] == [("begin", 1, 0), ("step", 1, 1), ("step", 1, 2), ("step", 1, 3), ("epoch", 1, 3),
                                               ("step", 2, 4), ("step", 2, 5), ("step", 2, 6), ("epoch", 2, 6), ("end", 2, 6)]
    assert relative_error(recorder.losses(), reference.losses[:6]) <= 1e-5
    # The loss of the next step is the forward loss with the trained parameters.
    assert abs(model.eval(dataset[:1])["loss"] - reference.losses[6]) <= 1e-5 * reference.losses[6]
    recorder.calls.clear()
    model.train(1, dataset, callbacks=[recorder])  # parameters and momentum carried over
    assert relative_error(recorder.losses(), reference.losses[6:]) <= 1e-5
    trained = {name: parameter.asnumpy() for name, parameter in net.parameters_and_names()}
    expected = {name: reference.parameters[name] for name in trained}
    assert relative_error(trained, expected) <= 1e-5


def test_predict_uses_the_trained_parameters():
    net, loss, optimizer = _parts()
    model = Model(net, loss, optimizer)
    model.train(1, _dataset(2))
    x = _dataset(1, seed=5)[0][0]
    weights = {name: p.asnumpy() for name, p in net.parameters_and_names()}
    hidden = np.maximum(x @ weights["dense1.weight"] + weights["dense1.bias"], 0)
    expected = hidden @ weights["dense2.weight"] + weights["dense2.bias"]
    assert np.allclose(model.predict(x).asnumpy(), expected, rtol=1e-5, atol=1e-6)


def test_loss_monitor_logs_every_per_print_times_steps_of_an_epoch():
    lines = []
    net, loss, optimizer = _parts()
    Model(net, loss, optimizer).train(2, _dataset(4), callbacks=[LossMonitor(per_print_times=2, log=lines.append)])
    assert [line.split(", loss is")[0] for line in lines] == ["epoch: 1 step: 2", "epoch: 1 step: 4", "epoch: 2 step: 2", "epoch: 2 step: 4"]
    assert all(re.fullmatch(r"epoch: \d step: \d, loss is \d+\.\d{7}", line) for line in lines)  # MindSpore's format


def test_the_synthetic_dataset_trains_too():
    net, loss, optimizer = _parts()
    _, _, batches = training_plan(TrainOneStepCell(WithLossCell(net, loss), optimizer), None, FFN_INPUTS, steps=2)
    recorder = Recorder()
    Model(net, loss, optimizer).train(1, batches, callbacks=[recorder])
    assert len(recorder.losses()) == 2


def _good():
    return _dataset(1)[0]


BAD_ELEMENTS = {
    "shape": ((np.zeros((32, 64), np.float32), _good()[1]),
              (r"dataset element 1: input data must be \[64, 64\] float32 \(a rank's share of the plan's inputs, 1/8 of the batch, "
               r"is data \[64, 64\] float32, label \[64\] int32\), got \[32, 64\] float32")),
    "dtype": ((_good()[0], _good()[1].astype(np.int64)), r"dataset element 1: input label must be \[64\] int32 .*, got \[64\] int64"),
    "count": ((_good()[0],), r"dataset element 1: expected 2 arrays \(data \[64, 64\] float32, label \[64\] int32\), got a tuple of 1: \[64, 64\] float32"),
    "not a tuple": (np.zeros((64, 64), np.float32), r"dataset element 1: expected a tuple of arrays such as \(data, label\), got \[64, 64\] float32"),
    "dict keys": ({"x": _good()[0], "y": _good()[1]}, r"dataset element 1: expected inputs data \[64, 64\] float32, label \[64\] int32, got a dict of x: "),
}


@pytest.mark.parametrize("case", sorted(BAD_ELEMENTS))
def test_a_bad_dataset_element_is_named_before_any_step(case):
    element, message = BAD_ELEMENTS[case]
    net, loss, optimizer = _parts()
    recorder = Recorder()
    with pytest.raises(ConfigError, match=message):
        Model(net, loss, optimizer).train(1, [_good(), element], callbacks=[recorder])
    assert recorder.calls == []


@pytest.mark.parametrize(("arguments", "message"), [
    ({"optimizer": None}, r"Model.train needs an optimizer: Model\(network, loss_fn, optimizer\)"),
    ({"epoch": 0}, r"Model.train: epoch must be a positive integer, got 0"),
    ({"dataset": []}, r"Model.train: the dataset has no elements"),
])
def test_train_arguments_are_checked(arguments, message):
    net, loss, optimizer = _parts()
    model = Model(net, loss, arguments.get("optimizer", optimizer))
    with pytest.raises(ConfigError, match=message):
        model.train(arguments.get("epoch", 1), arguments.get("dataset", _dataset(1)))


def test_model_train_refuses_a_sixteen_bit_plan_it_would_not_carry():
    set_auto_parallel_context(precision="bf16")
    net, loss, optimizer = _parts()
    with pytest.raises(ConfigError, match=r"^Model.train trains in precision fp32 only, got precision 'bf16' \(its fp32 "
                                          r"main copies are not carried between calls\): train 16-bit plans with autostrat run$"):
        Model(net, loss, optimizer).train(1, _dataset(2))
