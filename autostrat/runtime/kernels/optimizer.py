"""Kernels of the optimiser update ops (rules in `autostrat.rules.optimizer`), as MindSpore's
``ApplyGradientDescent``, ``ApplyMomentum`` and ``Adam`` compute them.

With ``gradients_mean=False`` a rank's synchronised gradient is the sum over the parameter's
`replicas` (the devices holding its slice; the program lowering passes the count) of their own
gradients, which is `replicas` times the gradient of the whole-batch loss the graph computes.
On one device `replicas` is 1 and the attribute changes nothing.
"""

from __future__ import annotations

import numpy as np

from autostrat.runtime.kernels.registry import kernel


def _summed(gradient, gradients_mean: bool, replicas: int):
    return gradient if gradients_mean or replicas == 1 else gradient * np.asarray(replicas, gradient.dtype)


@kernel("ApplyGradientDescent")
def apply_gradient_descent(parameter, gradient, learning_rate=0.01, gradients_mean=True, replicas=1):
    gradient = _summed(gradient, gradients_mean, replicas)
    return (parameter - np.asarray(learning_rate, parameter.dtype) * gradient).astype(parameter.dtype)


@kernel("ApplyMomentum")
def apply_momentum(parameter, accumulation, gradient, learning_rate=0.01, momentum=0.9, use_nesterov=False,
                   gradients_mean=True, replicas=1):
    gradient = _summed(gradient, gradients_mean, replicas)
    lr, mu = np.asarray(learning_rate, parameter.dtype), np.asarray(momentum, parameter.dtype)
    accumulation = accumulation * mu + gradient
    step = (gradient + accumulation * mu) if use_nesterov else accumulation
    return (parameter - lr * step).astype(parameter.dtype), accumulation.astype(parameter.dtype)


@kernel("ApplyAdam")
def apply_adam(parameter, m, v, learning_rate, gradient, beta1=0.9, beta2=0.999, epsilon=1e-8,
               gradients_mean=True, replicas=1):
    gradient = _summed(gradient, gradients_mean, replicas)
    dtype = parameter.dtype
    b1, b2, eps = (np.asarray(value, dtype) for value in (beta1, beta2, epsilon))
    m = m * b1 + (1 - b1) * gradient
    v = v * b2 + (1 - b2) * gradient * gradient
    new = parameter - np.asarray(learning_rate, dtype) * m / (np.sqrt(v) + eps)
    return new.astype(dtype), m.astype(dtype), v.astype(dtype)
