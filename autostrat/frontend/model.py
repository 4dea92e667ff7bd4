"""MindSpore's high-level loop: ``Model(net, loss_fn, optimizer).train(epoch, dataset, callbacks)``,
with `LossMonitor` (or any `Callback`) seeing the loss of every step, and `eval` / `predict`.

The training step is planned once, for the global batch the first dataset element makes
(MindSpore's ``full_batch`` semantics, `frontend.batches`), under the parallel context of that
moment; every later element must match it. All epochs run in one go on LocalCluster threads,
or under mpiexec one process per rank (callbacks then run on rank 0, except those that write a
file per rank, such as `ModelCheckpoint`). Afterwards the trained values are written into the network's Parameters and the
optimiser state is kept, so `predict`, `eval` or another `train` continue from them.

Example (two epochs of two batches on 8 threads, a loss printed per step; every rank reads the
same 64 rows, its share of a global batch of 512 (MindSpore's ``full_batch=False``); gradients
summed over their replicas, MindSpore's default ``gradients_mean=False``):
    >>> import numpy as np
    >>> from autostrat import nn, set_auto_parallel_context, reset_auto_parallel_context
    >>> from autostrat.models import FFN
    >>> set_auto_parallel_context(parallel_mode="auto_parallel", device_num=8)
    >>> nn.set_seed(0); net = FFN(); _ = net.dense1.matmul.shard(((2, 1), (1, 4)))
    >>> rng = np.random.default_rng(0)
    >>> dataset = [(rng.standard_normal((64, 64)).astype(np.float32), rng.integers(0, 64, 64).astype(np.int32)) for _ in range(2)]
    >>> model = Model(net, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"), nn.Momentum(net.trainable_params(), 0.1, 0.9))
    >>> model.train(2, dataset, callbacks=[LossMonitor(per_print_times=2)])  # doctest: +ELLIPSIS
    Model.train: plan for global batch 512 (64 rows per rank x 8 data-parallel ranks, full_batch=False)
    epoch: 1 step: 2, loss is 4.157...
    epoch: 2 step: 2, loss is 4.121...
    >>> model.predict(dataset[0][0]).shape
    (64, 64)
    >>> reset_auto_parallel_context()
"""

from __future__ import annotations

import warnings

from dataclasses import dataclass, replace

import numpy as np

from autostrat.errors import ConfigError, RuntimeBackendError
from autostrat.frontend.api import plan_for
from autostrat.frontend.batches import batch_split, global_elements
from autostrat.frontend.context import current_context
from autostrat.frontend.world import checking, world_backend
from autostrat.frontend.tensor import Parameter, Tensor
from autostrat.frontend.train import Progress, TrainOneStepCell, WithLossCell, compare, reference_graph
from autostrat.runtime.executor import graph_values
from autostrat.runtime.job import check_indices
from autostrat.runtime.local import execute_on_ranks
from autostrat.runtime.program import lower_programs
from autostrat.runtime.training import loss_value, train_collective, train_locally, train_reference
from autostrat.search.precision import check_fp32_loop


@dataclass(frozen=True)
class CallbackParams:
    """What a callback sees: `cur_step_num` counts steps over all epochs from 1 (0 before the
    first), `net_outputs` is the step's loss (None before the first step); `train_network` the
    network (its Parameters hold the trained values at the train's end), `plan` the training
    plan and `rank` this process's rank (0 when the ranks are threads)."""

    epoch_num: int
    batch_num: int
    cur_epoch_num: int
    cur_step_num: int
    net_outputs: float | None
    train_network: object = None
    plan: object = None
    rank: int = 0

    @property
    def step_in_epoch(self) -> int:
        return (self.cur_step_num - 1) % self.batch_num + 1


class RunContext:
    """Hands a callback its `CallbackParams`, as in MindSpore: ``run_context.original_args()``."""

    def __init__(self, params: CallbackParams):
        self._params = params

    def original_args(self) -> CallbackParams:
        return self._params


class Callback:
    """Base class of training callbacks; override the moments you need."""

    def on_train_begin(self, run_context: RunContext) -> None:
        pass

    def on_train_step_end(self, run_context: RunContext) -> None:
        pass

    def on_train_epoch_end(self, run_context: RunContext) -> None:
        pass

    def on_train_end(self, run_context: RunContext) -> None:
        pass


class LossMonitor(Callback):
    """Logs the loss at every step whose number, counted over the whole run from 1, is a
    multiple of `per_print_times` (MindSpore's ``cur_step_num % per_print_times == 0``: with
    2 steps an epoch, ``LossMonitor(20)`` prints at the 10th epoch's end), in MindSpore's
    format, the step counted within its epoch (``epoch: 1 step: 2, loss is 0.6931472``)."""

    def __init__(self, per_print_times: int = 1, log=print):
        if not isinstance(per_print_times, int) or per_print_times < 1:
            raise ConfigError(f"LossMonitor: per_print_times must be a positive integer, got {per_print_times!r}")
        self.per_print_times, self.log = per_print_times, log

    def on_train_step_end(self, run_context: RunContext) -> None:
        params = run_context.original_args()
        if params.cur_step_num % self.per_print_times == 0:
            self.log(f"epoch: {params.cur_epoch_num} step: {params.step_in_epoch}, loss is {params.net_outputs:.7f}")


class _Notifier:
    """The `on_step(step, loss)` of a run, turned into the callbacks' moments and a progress bar."""

    def __init__(self, callbacks, epoch_num: int, batch_num: int, about: tuple = (None, None, 0)):
        self.callbacks, self.epoch_num, self.batch_num = list(callbacks or ()), epoch_num, batch_num
        self.about = about  # (network, plan, rank) for CallbackParams
        self.progress = Progress(epoch_num * batch_num, log=None)  # a bar on a terminal, for long runs

    def tell(self, moment: str, step: int, loss: float | None) -> None:
        params = CallbackParams(self.epoch_num, self.batch_num, max(step - 1, 0) // self.batch_num + 1, step, loss, *self.about)
        for callback in self.callbacks:
            getattr(callback, moment)(RunContext(params))

    def __call__(self, step: int, loss: float) -> None:
        self.progress(step, loss)
        self.tell("on_train_step_end", step + 1, loss)
        if (step + 1) % self.batch_num == 0:
            self.tell("on_train_epoch_end", step + 1, loss)


def _array(value) -> np.ndarray:
    return value.asnumpy() if isinstance(value, Tensor) else np.asarray(value)


def _describe(value) -> str:
    if isinstance(value, (tuple, list)):
        return f"a {type(value).__name__} of {len(value)}: " + ", ".join(_describe(v) for v in value)
    if isinstance(value, dict):
        return "a dict of " + ", ".join(f"{k}: {_describe(v)}" for k, v in value.items())
    if isinstance(value, (np.ndarray, Tensor)):
        return f"{list(value.shape)} {np.dtype(value.dtype).name}"
    return type(value).__name__


def element_arrays(element, index: int) -> list[np.ndarray]:
    """The arrays of one dataset element: a tuple or list in input order, or a dict by input
    name (as `synthetic_batches` makes them); numpy arrays or Tensors."""
    if isinstance(element, dict):
        return [_array(value) for value in element.values()]
    if isinstance(element, (tuple, list)):
        return [_array(value) for value in element]
    raise ConfigError(f"dataset element {index}: expected a tuple of arrays such as (data, label), got {_describe(element)}")


def batch_values(element, inputs, index: int, label: str = "the plan's inputs are") -> dict:
    """Dataset element `index` as arrays by graph input name, checked against `inputs` (the
    planned graph inputs, or a rank's share of them, as `label` says) so that a bad element
    fails here, naming itself, not inside a rank.

    Example:
        >>> from autostrat.ir import TensorInfo
        >>> inputs = (TensorInfo("x", (2, 3), "float32", "input"),)
        >>> batch_values((np.zeros((2, 3), np.float32),), inputs, 0)["x"].shape
        (2, 3)
        >>> batch_values((np.zeros((3, 2)),), inputs, 4)
        Traceback (most recent call last):
        autostrat.errors.ConfigError: dataset element 4: input x must be [2, 3] float32 (the plan's inputs are x [2, 3] float32), got [3, 2] float64
    """
    expected = ", ".join(f"{info.name} {list(info.shape)} {info.dtype}" for info in inputs)
    names = [info.name for info in inputs]
    if isinstance(element, dict) and set(element) != set(names):
        raise ConfigError(f"dataset element {index}: expected inputs {expected}, got {_describe(element)}")
    arrays = [element[name] for name in names] if isinstance(element, dict) else element_arrays(element, index)
    if len(arrays) != len(inputs):
        raise ConfigError(f"dataset element {index}: expected {len(inputs)} arrays ({expected}), got {_describe(element)}")
    batch = {}
    for info, value in zip(inputs, arrays):
        array = _array(value)
        if array.shape != tuple(info.shape) or array.dtype.name != info.dtype:
            raise ConfigError(f"dataset element {index}: input {info.name} must be {list(info.shape)} {info.dtype} "
                              f"({label} {expected}), got {_describe(array)}")
        batch[info.name] = array
    return batch


def stand_ins(arrays) -> tuple[Tensor, ...]:
    """Shape-only tensors like `arrays` (what a plan is traced with)."""
    return tuple(Tensor(shape=array.shape, dtype=array.dtype) for array in arrays)


def check_against_one_device(plan, result, values: dict, batches) -> None:
    """Print the comparison of a run with the stand-alone run of the same steps (`train.compare`);
    a run that differs raises `RuntimeBackendError` (``AUTOSTRAT_CHECK=1``: a MindSpore
    script, unchanged, checked by its launcher)."""
    report = compare(plan, result, train_reference(reference_graph(plan), values, batches))
    print(report.text, flush=True)
    if not report.ok:
        raise RuntimeBackendError("the distributed run differs from the stand-alone run (see the report above)")


class Model:
    """A network with its loss and optimiser, trained and run as MindSpore's `Model`.

    `loss_fn` None means the network returns its loss itself (as `models.GPT`). See the
    module docstring for an example.
    """

    def __init__(self, network, loss_fn=None, optimizer=None):
        self.network, self.loss_fn, self.optimizer = network, loss_fn, optimizer
        self.loss_network = WithLossCell(network, loss_fn) if loss_fn is not None else network
        self._training = None  # the training plan, made by the first `train`
        self._state: dict = {}  # the optimiser state after the last `train`
        self._forward: dict = {}  # (network, input shapes and dtypes) -> forward plan

    def train(self, epoch: int, train_dataset, callbacks=None, dataset_sink_mode: bool = False, sink_size: int = -1) -> None:
        """Train `epoch` passes over `train_dataset` (an iterable of (data, label) arrays, read
        once; what a rank reads is its share of the global batch unless ``full_batch``, see
        `frontend.batches`); `callbacks` see every step's loss and every epoch's end. MindSpore's
        `dataset_sink_mode` and `sink_size` are accepted (a warning when set: there is no
        device queue to sink into)."""
        if dataset_sink_mode or sink_size != -1:
            warnings.warn("Model.train: dataset_sink_mode and sink_size are accepted and have no effect in autostrat "
                          "(every step is fed from the host)", stacklevel=2)
        if self.optimizer is None:
            raise ConfigError("Model.train needs an optimizer: Model(network, loss_fn, optimizer)")
        if not isinstance(epoch, int) or epoch < 1:
            raise ConfigError(f"Model.train: epoch must be a positive integer, got {epoch!r}")
        backend = world_backend()
        plan, graph, batches = self._plan_and_batches(train_dataset, backend)
        check_fp32_loop(plan.precision, "Model.train")
        values = graph_values(graph, {}) | self._state
        rank = 0 if backend is None else backend.rank
        # Callbacks run on rank 0 (one log), those that write per-rank files (`every_rank`) on every rank.
        chosen = [callback for callback in callbacks or () if rank == 0 or getattr(callback, "every_rank", False)]
        notifier = _Notifier(chosen, epoch, len(batches), (self.network, plan, rank))
        notifier.tell("on_train_begin", 0, None)
        if backend is None:
            result = train_locally(plan, values, batches * epoch, notifier)
        else:
            result = train_collective(plan, backend, values, batches * epoch, notifier, every_rank=True)
        self._keep(result.parameters)
        notifier.tell("on_train_end", epoch * len(batches), result.losses[-1])
        if checking() and (backend is None or backend.rank == 0):
            check_against_one_device(plan, result, values, batches * epoch)

    def _plan_and_batches(self, train_dataset, backend) -> tuple:
        """The training plan (made by the first call, for the global batch), its reference graph
        and the global batches: this rank's elements checked against its share of the plan's
        inputs, so that a bad one is named in the terms the script wrote it, then joined with the
        other ranks' (`frontend.batches`)."""
        elements = list(train_dataset)
        if not elements:
            raise ConfigError("Model.train: the dataset has no elements")
        context = current_context()
        split = batch_split(context)
        first = element_arrays(elements[0], 0)
        if self._training is None:
            if backend is None or backend.rank == 0:
                print(f"Model.train: plan for {split.describe(len(first[0]) if first and first[0].ndim else 1)}", flush=True)
            cell = TrainOneStepCell(self.loss_network, self.optimizer)
            self._training = plan_for(cell, stand_ins(split.global_arrays(first)), context)
        graph = reference_graph(self._training)  # a pipeline plan's graph is one micro-batch's
        inputs, label = split.local_inputs(graph.inputs())
        local = [batch_values(element, inputs, index, label) for index, element in enumerate(elements)]
        for index, batch in enumerate(local):
            check_indices(graph, batch, f"dataset element {index}")
        names = [info.name for info in inputs]
        joined = global_elements(train_dataset, [[batch[name] for name in names] for batch in local], split, backend)
        return self._training, graph, [dict(zip(names, element)) for element in joined]

    def _keep(self, trained: dict) -> None:
        """Trained parameters into the network's Parameters, the optimiser state into the model."""
        owners = self._training.graph.values
        for name, array in trained.items():
            if isinstance(owners[name], Parameter):
                owners[name].set_data(array)
        self._state = {name: array for name, array in trained.items() if not isinstance(owners[name], Parameter)}

    def predict(self, *predict_data) -> Tensor:
        """The network's output on `predict_data` (arrays or Tensors) with the current parameters."""
        outputs = self._run_forward(self.network, [_array(value) for value in predict_data])
        return Tensor(outputs[0]) if len(outputs) == 1 else tuple(Tensor(output) for output in outputs)

    def eval(self, valid_dataset) -> dict:
        """``{"loss": mean loss over valid_dataset}`` with the current parameters."""
        losses = [loss_value(self._run_forward(self.loss_network, element_arrays(element, index))[0])
                  for index, element in enumerate(valid_dataset)]
        if not losses:
            raise ConfigError("Model.eval: the dataset has no elements")
        return {"loss": float(np.mean(losses))}

    def _run_forward(self, network, arrays: list) -> list:
        """`network`'s outputs on `arrays`, its forward plan made once per input shapes and dtypes."""
        key = (id(network), tuple((array.shape, array.dtype.name) for array in arrays))
        if key not in self._forward:
            self._forward[key] = plan_for(network, stand_ins(arrays), replace(current_context(), phase="predict"))
        plan = self._forward[key]
        given = {info.name: array for info, array in zip(plan.graph.inputs(), arrays)}
        check_indices(plan.graph, given, f"{type(network).__name__} inputs")
        values = graph_values(plan.graph, given)
        result = execute_on_ranks(lower_programs(plan), values, world_backend())
        return [result.outputs[name] for name in plan.graph.outputs]
