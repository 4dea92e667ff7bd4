"""Kernels of the optimiser update ops (rules in `autostrat.rules.optimizer`), as MindSpore's
``ApplyGradientDescent``, ``ApplyMomentum`` and ``Adam`` compute them.

With ``gradients_mean=False`` a rank's synchronised gradient is the sum over the parameter's
`replicas` (the devices computing with its slice, `Plan.replicas`) of their own gradients,
which is `replicas` times the gradient of the whole-batch loss the graph computes. The program
lowering passes the count (`program.kernel_attrs`), and so does the stand-alone reference
(`training.reference_graph`); without it `replicas` is 1 and the attribute changes nothing.
"""

from __future__ import annotations

import numpy as np

from autostrat.runtime.kernels.registry import kernel


def summed_gradient(gradient, replicas: int, gradients_mean: bool = False):
    """The sum of `replicas` copies of `gradient` (each replica's gradient of its own batch-mean
    loss, as MindSpore sums them), or `gradient` itself with `gradients_mean`.

    Example:
        >>> summed_gradient(np.ones(2, np.float32), 4).tolist(), summed_gradient(np.ones(1), 4, gradients_mean=True).tolist()
        ([4.0, 4.0], [1.0])
    """
    return gradient if gradients_mean or replicas == 1 else gradient * np.asarray(replicas, gradient.dtype)


@kernel("ApplyGradientDescent")
def apply_gradient_descent(parameter, gradient, learning_rate=0.01, gradients_mean=True, replicas=1):
    gradient = summed_gradient(gradient, replicas, gradients_mean)
    return (parameter - np.asarray(learning_rate, parameter.dtype) * gradient).astype(parameter.dtype)


@kernel("ApplyMomentum")
def apply_momentum(parameter, accumulation, gradient, learning_rate=0.01, momentum=0.9, use_nesterov=False,
                   gradients_mean=True, replicas=1):
    gradient = summed_gradient(gradient, replicas, gradients_mean)
    lr, mu = np.asarray(learning_rate, parameter.dtype), np.asarray(momentum, parameter.dtype)
    accumulation = accumulation * mu + gradient
    step = (gradient + accumulation * mu) if use_nesterov else accumulation
    return (parameter - lr * step).astype(parameter.dtype), accumulation.astype(parameter.dtype)


@kernel("ApplyAdam")
def apply_adam(parameter, m, v, learning_rate, gradient, beta1=0.9, beta2=0.999, epsilon=1e-8,
               gradients_mean=True, replicas=1):
    gradient = summed_gradient(gradient, replicas, gradients_mean)
    dtype = parameter.dtype
    b1, b2, eps = (np.asarray(value, dtype) for value in (beta1, beta2, epsilon))
    m = m * b1 + (1 - b1) * gradient
    v = v * b2 + (1 - b2) * gradient * gradient
    new = parameter - np.asarray(learning_rate, dtype) * m / (np.sqrt(v) + eps)
    return new.astype(dtype), m.astype(dtype), v.astype(dtype)
