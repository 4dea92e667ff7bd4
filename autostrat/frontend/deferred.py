"""The value and gradients of a `value_and_grad` call, computed only when something needs them.

A call returns `DeferredTensor`s. If its gradients reach ``optimizer(grads)`` untouched (or
through a grad reducer), the optimiser runs the whole planned training step and the call's loss
is that step's (`functional_step`). If anything reads a value or a gradient first, the call is
computed by itself (`functional.GradFunction.compute`): the optimiser then gets plain
gradients, as it would after any change the loop makes to them.

Grad reducers are MindSpore's explicit gradient synchronisation. In a planned step they are
what the plan's gradient synchronisation does anyway; what they decide is how a parameter's
replicas' gradients combine: ``DistributedGradReducer(parameters, mean=True)`` averages them
(``gradients_mean=True``), ``mean=False`` sums them, ``mean=None`` (MindSpore's default) follows
the context's `gradients_mean`; `PipelineGradReducer` follows the context.
"""

from __future__ import annotations

import numpy as np

from autostrat.errors import ConfigError
from autostrat.frontend.tensor import Parameter, Tensor


class DeferredTensor(Tensor):
    """A tensor whose data is made when first read (`resolve()`); its shape is known at once
    when given, else it is read too."""

    def __init__(self, resolve, shape=None, dtype=None):
        self._symbol, self._resolve, self._value = None, resolve, None
        self._known = (tuple(shape), dtype) if shape is not None else None

    @property
    def _data(self) -> np.ndarray:
        if self._value is None:
            self._value = np.asarray(self._resolve())
        return self._value

    @property
    def shape(self) -> tuple:
        return self._known[0] if self._known else self._data.shape

    @property
    def dtype(self) -> str:
        return self._known[1] if self._known else self._data.dtype.name


class PendingGradients(tuple):
    """The gradients of one `DeferredCall`, in the order of its weights, with how a grad
    reducer asked their replicas to combine (`mean`: None when no reducer saw them)."""

    def __new__(cls, tensors, call, mean=None, reducer: str = ""):
        gradients = super().__new__(cls, tensors)
        gradients.call, gradients.mean, gradients.reducer = call, mean, reducer
        return gradients


class DeferredCall:
    """One call of a `GradFunction` on this rank's `arrays`: computed by itself when read,
    or run as a whole training step by the optimiser (`step`)."""

    def __init__(self, grad_fn, arrays: list):
        self.grad_fn, self.arrays = grad_fn, arrays
        self.values: list | None = None  # fn's outputs, once computed (by itself or by the step: its loss)
        self.grads: tuple | None = None  # the gradients, once computed by the call itself
        self.stepped = False  # the whole step ran: its gradients were consumed inside the plan
        self.gradients = PendingGradients(
            [DeferredTensor(lambda i=i: self.gradient(i), w.shape, w.dtype) for i, w in enumerate(grad_fn.weights)], self)

    def value_tensors(self) -> list[DeferredTensor]:
        """The call's outputs (with has_aux: the loss, then the auxiliary outputs), deferred."""
        return [DeferredTensor(lambda i=i: self.value(i)) for i in range(self.grad_fn.output_count(self.arrays))]

    def value(self, index: int) -> np.ndarray:
        if self.values is None or (self.stepped and index > 0):
            if self.stepped:
                raise ConfigError(f"value_and_grad(has_aux=True): output {index} of a call whose training step ran "
                                  f"planned (optimizer(grads)) is not computed: the step plans the loss alone; read the "
                                  f"auxiliary outputs before optimizer(grads)")
            self.compute("its value is read")
        return self.values[index]

    def gradient(self, index: int) -> np.ndarray:
        if self.stepped:
            raise ConfigError("value_and_grad: the gradients were used inside the planned training step "
                              "(optimizer(grads)) and are not kept; read them before optimizer(grads)")
        if self.grads is None:
            self.compute("its gradients are read (or changed) before optimizer(grads)")
        return self.grads[index]

    def compute(self, why: str) -> None:
        """Compute the call by itself (the plan of its forward pass and backward), refused
        when a context setting needs the whole step planned."""
        from autostrat.frontend.functional_step import refuse_partial_step  # it imports this module

        refuse_partial_step(f"the functional loop computes value_and_grad by itself ({why})", self.grad_fn.cell)
        values, self.grads = self.grad_fn.compute(self.arrays)
        if self.values is None:
            self.values = values

    def pending(self) -> bool:
        """Whether nothing of the call was computed yet (its gradients can join a whole step)."""
        return self.grads is None and self.values is None and not self.stepped

    def stepped_with(self, loss: np.ndarray) -> None:
        self.values, self.stepped = [loss], True


def _check_parameters(kind: str, parameters) -> tuple:
    if isinstance(parameters, Parameter) or not all(isinstance(p, Parameter) for p in parameters):
        raise ConfigError(f"{kind}: parameters must be a list of Parameters such as optimizer.parameters, "
                          f"got {parameters!r}")
    return tuple(parameters)


class DistributedGradReducer:
    """MindSpore's ``nn.DistributedGradReducer(parameters, mean=None, degree=None, ...)``: the
    gradients' synchronisation over the data-parallel replicas (see the module docstring).

    Example:
        >>> from autostrat.frontend.tensor import Parameter
        >>> weight = Parameter(np.ones(2, np.float32), name="w")
        >>> DistributedGradReducer([weight], mean=True)((Tensor(np.ones(2, np.float32)),))[0].asnumpy().tolist()
        [1.0, 1.0]
    """

    def __init__(self, parameters, mean=None, degree=None, fusion_type: int = 1, group=None):
        self.parameters = _check_parameters("DistributedGradReducer", parameters)
        if mean is not None and not isinstance(mean, bool):
            raise ConfigError(f"DistributedGradReducer: mean must be True, False or None, got {mean!r}")
        if degree is not None:
            raise ConfigError(f"DistributedGradReducer: degree={degree!r} is not supported: the replicas of each "
                              f"parameter come from the plan")
        self.mean = mean

    def __call__(self, grads):
        return reduce_gradients(grads, self.mean, type(self).__name__, self.parameters)


class PipelineGradReducer(DistributedGradReducer):
    """MindSpore's ``nn.PipelineGradReducer(parameters, scale_sense=1.0, opt_shard=None)``:
    the gradients' synchronisation of a pipeline's step, combining replicas as the context's
    `gradients_mean` says."""

    def __init__(self, parameters, scale_sense: float = 1.0, opt_shard=None):
        super().__init__(parameters)
        if scale_sense != 1.0:
            raise ConfigError(f"PipelineGradReducer: scale_sense={scale_sense!r} is not supported (only 1.0)")


def reduce_gradients(grads, mean, reducer: str, parameters: tuple):
    """`grads` as the reducer returns them: deferred gradients carry `mean` into the planned
    step; computed ones were synchronised by their own plan already, as the context's
    `gradients_mean` says, and a reducer asking otherwise is refused."""
    from autostrat.frontend.context import current_context

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
