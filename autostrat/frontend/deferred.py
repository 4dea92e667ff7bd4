"""The value and gradients of a `value_and_grad` call, computed only when something needs them.

A call returns `DeferredTensor`s. If its gradients reach ``optimizer(grads)`` untouched (or
through a grad reducer), the optimiser runs the whole planned training step and the call's loss
is that step's (`functional_step`). If anything reads a value or a gradient first, the call is
computed by itself (`functional.GradFunction.compute`): the optimiser then gets plain
gradients, as it would after any change the loop makes to them. A grad reducer passes deferred
gradients on, with how it combines replicas (`grad_reducer`).
"""

from __future__ import annotations

import numpy as np

from autostrat.errors import ConfigError
from autostrat.frontend.tensor import Tensor


class DeferredTensor(Tensor):
    """A tensor whose data is made when first read (`resolve()`); its shape is known at once
    when given, else it is read too."""

    def __init__(self, resolve, shape=None, dtype=None, call=None, index: int = 0):
        self._symbol, self._resolve, self._value = None, resolve, None
        self._known = (tuple(shape), dtype) if shape is not None else None
        self.call, self.index = call, index  # a gradient's: its `DeferredCall` and weight index

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
    or run as a whole training step by the optimiser (`functional_step`)."""

    def __init__(self, grad_fn, arrays: list):
        self.grad_fn, self.arrays = grad_fn, arrays
        self.values: list | None = None  # fn's outputs, once computed (by itself or by the step: its loss)
        self.grads: tuple | None = None  # the gradients, once computed by the call itself
        self.stepped = False  # the whole step ran: its gradients were consumed inside the plan
        self.gradients = PendingGradients(
            [DeferredTensor(lambda i=i: self.gradient(i), w.shape, w.dtype, self, i) for i, w in enumerate(grad_fn.weights)],
            self)

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


def pending_call(grads) -> tuple:
    """(the `DeferredCall`, how a reducer combines replicas) when `grads` are a pending call's
    gradients, all of them in order and not computed, in any container; else (None, None).

    Example:
        >>> pending_call((np.zeros(2),))
        (None, None)
    """
    items = list(grads)
    call = getattr(items[0], "call", None) if items else None
    if call is None or not call.pending() or len(items) != len(call.gradients):
        return None, None
    if any(item is not mine for item, mine in zip(items, call.gradients)):
        return None, None
    return call, (grads.mean if isinstance(grads, PendingGradients) else None)
