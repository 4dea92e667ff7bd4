"""MindSpore's explicit gradient synchronisation of data parallelism: ``nn.DistributedGradReducer``.

In MindSpore's data-parallel functional loop the gradients `value_and_grad` returns are each
rank's own and the reducer AllReduces them. In autostrat's planned step (`functional_step`) the
plan synchronises every gradient over the replicas of its parameter anyway, so what a reducer
decides is how those replicas' gradients combine: ``DistributedGradReducer(parameters,
mean=True)`` averages them (as ``gradients_mean=True``: one device's whole-batch gradient),
``mean=False`` sums them, ``mean=None`` (MindSpore's default) follows the context's
`gradients_mean`. Any other pass-through of the gradients (a tuple of them, a reducer that
returns them as they are) keeps the context's. Gradients computed before the
reducer (the loop read them) were synchronised as the context says; a reducer asking otherwise
is refused.
"""

from __future__ import annotations

from autostrat.errors import ConfigError
from autostrat.frontend.context import current_context
from autostrat.frontend.deferred import PendingGradients
from autostrat.frontend.tensor import Parameter


def _check_parameters(kind: str, parameters) -> tuple:
    if isinstance(parameters, Parameter) or not all(isinstance(p, Parameter) for p in parameters):
        raise ConfigError(f"{kind}: parameters must be a list of Parameters such as optimizer.parameters, "
                          f"got {parameters!r}")
    return tuple(parameters)


class DistributedGradReducer:
    """MindSpore's ``nn.DistributedGradReducer(parameters, mean=None, degree=None, ...)``: the
    gradients' synchronisation over the data-parallel replicas (see the module docstring).

    Example:
        >>> import numpy as np
        >>> from autostrat.frontend.tensor import Tensor
        >>> weight = Parameter(np.ones(2, np.float32), name="w")
        >>> DistributedGradReducer([weight])((Tensor(np.ones(2, np.float32)),))[0].asnumpy().tolist()  # computed already
        [1.0, 1.0]
    """

    def __init__(self, parameters, mean=None, degree=None, fusion_type: int = 1, group=None):
        self.parameters = _check_parameters("DistributedGradReducer", parameters)
        if mean is not None and not isinstance(mean, bool):
            raise ConfigError(f"DistributedGradReducer: mean must be True, False or None, got {mean!r}")
        if degree is not None:
            raise ConfigError(f"DistributedGradReducer: degree={degree!r} is not supported: the replicas of each "
                              f"parameter come from the plan")
        if group is not None:
            raise ConfigError(f"DistributedGradReducer: group={group!r} is not supported: gradients are synchronised over "
                              f"each parameter's replicas among all ranks")
        self.mean = mean

    def __call__(self, grads):
        return reduce_gradients(grads, self.mean, type(self).__name__, self.parameters)


def reduce_gradients(grads, mean, reducer: str, parameters: tuple):
    """`grads` as the reducer returns them: deferred gradients carry `mean` into the planned
    step; computed ones were synchronised by their own plan already, as the context's
    `gradients_mean` says, and a reducer asking otherwise is refused."""
    if len(grads) != len(parameters):
        raise ConfigError(f"{reducer}(grads): expected {len(parameters)} gradients (one per parameter), got {len(grads)}")
    if isinstance(grads, PendingGradients) and grads.call.pending():
        return PendingGradients(grads, grads.call, mean, reducer)
    context_mean = current_context().gradients_mean
    if mean is not None and mean != context_mean:
        raise ConfigError(f"{reducer}(mean={mean}): gradients computed before the reducer were synchronised with "
                          f"gradients_mean={context_mean}; set gradients_mean={mean} in set_auto_parallel_context, or "
                          f"pass the gradients of value_and_grad straight to the reducer and the optimizer")
    return tuple(grads)
