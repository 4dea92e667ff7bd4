"""MindSpore's ``nn.DistributedGradReducer``: in MindSpore's data-parallel functional loop the
gradients `value_and_grad` returns are each rank's own, and this reducer AllReduces them.
autostrat's `value_and_grad` plans the step over every rank and returns gradients already
synchronised over replicas as the context says (summed, or averaged with ``gradients_mean``):
what the reducer would give. It returns them unchanged, and refuses settings that would ask
for something else (a `mean` other than the context's ``gradients_mean``, a `degree` other
than the world size).
"""

from __future__ import annotations

from autostrat.errors import ConfigError
from autostrat.frontend.context import current_context


class DistributedGradReducer:
    """The gradients of `parameters`, synchronised over the ranks (see the module docstring).

    Example:
        >>> reducer = DistributedGradReducer([])
        >>> reducer((1.0, 2.0))
        (1.0, 2.0)
    """

    def __init__(self, parameters, mean=None, degree=None, fusion_type: int = 1, group=None):
        context = current_context()
        if mean is not None and bool(mean) != context.gradients_mean:
            raise ConfigError(f"DistributedGradReducer: mean={mean} but the context's gradients_mean is "
                              f"{context.gradients_mean}: value_and_grad synchronises gradients as gradients_mean says; "
                              f"set_auto_parallel_context(gradients_mean={bool(mean)}) instead")
        if degree is not None and degree != context.device_num:
            raise ConfigError(f"DistributedGradReducer: degree must be the world size {context.device_num} (or None), got {degree!r}")
        if group is not None:
            raise ConfigError(f"DistributedGradReducer: group is not supported (gradients are reduced over every rank), got {group!r}")
        self.parameters = tuple(parameters)

    def __call__(self, grads):
        return grads
