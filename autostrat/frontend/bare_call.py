"""A bare ``net(x)`` call under a parallel mode (data, semi-auto or auto parallel): planned and
run on the ranks.

MindSpore compiles such a call as a parallel graph; so does autostrat, rather than running it
unsplit on every rank: the call is planned as a forward pass (`api.plan_for` under
``phase="predict"``, as `Model.predict` plans it: seeds, the strategy checkpoint and
``save_graphs`` honoured), once per input shapes, and run on the ranks (threads, or the MPI
ranks under mpiexec). The inputs are this rank's share of the batch, or the whole batch with
``full_batch=True`` (`frontend.global_batch`); each output comes back as this rank's rows. With
``AUTOSTRAT_CHECK=1`` every call is checked against the same graph on one device.

Settings that only act on a training step (`TRAINING_KEYS`) have nothing to act on in a forward
pass: a call made while one is set says so once, naming it, rather than ignoring it silently.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from autostrat.errors import RuntimeBackendError
from autostrat.frontend.api import plan_for
from autostrat.frontend.context import ParallelContext, current_context
from autostrat.frontend.mindspore_keys import warn_once
from autostrat.frontend.batches import batch_split
from autostrat.frontend.global_batch import global_arrays, rank_share
from autostrat.frontend.tensor import Tensor
from autostrat.frontend.world import CheckTally, checking, get_rank, world_backend
from autostrat.runtime.executor import graph_values, run_single_device
from autostrat.runtime.job import check_indices
from autostrat.runtime.local import execute_on_ranks
from autostrat.runtime.program import lower_programs

PLANNED_MODES = ("auto_parallel", "data_parallel", "semi_auto_parallel")
# Context keys that shape only a training step (its backward, sync, update or micro-batches).
TRAINING_KEYS = ("auto_recompute", "enable_parallel_optimizer", "gradients_mean", "loss_scale", "parallel_optimizer_config", "phase",
                 "pipeline_config", "pipeline_interleave_num", "pipeline_schedule", "pipeline_stages")


def is_planned(inputs) -> bool:
    """Whether a call of a Cell on `inputs`, outside a trace, is planned: a parallel mode that
    plans, more than one device, and every input a Tensor with data."""
    context = current_context()
    return (context.parallel_mode in PLANNED_MODES and context.device_num > 1 and bool(inputs)
            and all(isinstance(x, Tensor) and x.has_data for x in inputs))


def run_planned(net, inputs) -> Tensor | tuple:
    """`net`'s outputs on `inputs` (Tensors with data), planned and run on the ranks.

    Example:
        >>> from autostrat import set_auto_parallel_context, reset_auto_parallel_context
        >>> from autostrat.models import FFN
        >>> set_auto_parallel_context(parallel_mode="semi_auto_parallel", device_num=2, full_batch=True)
        >>> net = FFN()
        >>> run_planned(net, (Tensor(np.ones((4, 64), np.float32)),)).shape  # doctest: +ELLIPSIS
        FFN(x) planned ...
        (4, 64)
        >>> reset_auto_parallel_context()
    """
    context = current_context()
    _say_training_keys(context)
    arrays = [x.asnumpy() for x in inputs]
    split = batch_split(context)
    whole = global_arrays(arrays, split)
    plan = _plan(net, whole, context)
    given = {info.name: array for info, array in zip(plan.graph.inputs(), whole)}
    check_indices(plan.graph, given, f"{type(net).__name__} inputs")
    values = graph_values(plan.graph, given)
    result = execute_on_ranks(lower_programs(plan), values, world_backend()).outputs
    if checking():
        _check(type(net).__name__, plan.graph, values, result)
    rows = arrays[0].shape[0] if arrays[0].ndim else 0
    outputs = [Tensor(rank_share(np.reshape(result[name], plan.graph.tensors[name].shape), rows, split))
               for name in plan.graph.outputs]
    return outputs[0] if len(outputs) == 1 else tuple(outputs)


def _plan(net, whole: list, context: ParallelContext):
    key = (repr(context), tuple((array.shape, array.dtype.name) for array in whole))
    plans = net.__dict__.setdefault("_bare_plans", {})
    if key not in plans:
        from autostrat.frontend.model import stand_ins  # model imports what imports this module

        plans[key] = plan = plan_for(net, stand_ins(whole), replace(context, phase="predict"))
        if get_rank() == 0:
            rows = whole[0].shape[0] if whole[0].ndim else 0
            source = "full_batch" if context.full_batch else "the ranks' shares"
            print(f"{type(net).__name__}(x) planned as a forward pass on {plan.device_num} devices, {plan.mode}, for a "
                  f"global batch of {rows} rows ({source})", flush=True)
    return plans[key]


def _say_training_keys(context: ParallelContext) -> None:
    default = ParallelContext()
    for key in TRAINING_KEYS:
        if getattr(context, key) != getattr(default, key):
            warn_once(f"bare_call.{key}", f"{key}={getattr(context, key)!r} shapes a training step; a bare net(x) call "
                                          f"is a forward pass, which it does not change", stacklevel=4)


TOLERANCE = 1e-5
_TALLY = CheckTally(lambda t: f"net(x): {t.count} planned call(s) checked against one device: max relative error "
                              f"{t.error:.3g} (limit {TOLERANCE:g}): OK")


def _check(name: str, graph, values: dict, result: dict, tolerance: float = TOLERANCE) -> None:
    """Compare a call's outputs with the graph run on one device; a difference raises."""
    from autostrat.frontend.train import relative_error  # train imports what imports this module

    error = relative_error({k: result[k] for k in graph.outputs}, run_single_device(graph, values))
    if error > tolerance:
        raise RuntimeBackendError(f"{name}(x): the distributed outputs differ from one device's by {error:.3g} "
                                  f"(relative; limit {tolerance:g})")
    _TALLY.add(error)
