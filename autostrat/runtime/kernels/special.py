"""The special functions the kernels need (erf, the logistic sigmoid, softmax, log-softmax),
in numpy alone.

Every MPI rank imports the kernels when it starts, 8 ranks per job on a machine that may have
2 cores. ``scipy.special`` took 0.45-0.55 s of a rank's start (``python -c "import
scipy.special"``, about twice numpy's own import) for four functions, each a few lines here.
`erf` sums the series with positive terms (Abramowitz & Stegun 7.1.6), which has no
cancellation: ``erf(x) = 2/sqrt(pi) * exp(-x**2) * sum_n 2**n x**(2n+1) / (1*3*...*(2n+1))``;
its error stays within 1e-14 of ``math.erf`` (tests/test_special.py holds it there).

Example:
    >>> round(float(erf(np.float64(0.5))), 12), float(expit(np.float64(0.0)))
    (0.520499877813, 0.5)
"""

from __future__ import annotations

import math

import numpy as np

_SATURATED = 6.0  # erf(6) = 1 - 2.2e-17: every |x| >= 6 rounds to +-1 in float64


def erf(x) -> np.ndarray:
    """The error function of `x`, elementwise, in float64 (or `x`'s floating dtype).

    Example:
        >>> erf(np.array([-1.0, 0.0, 3.0])).round(12).tolist()
        [-0.84270079295, 0.0, 0.999977909503]
    """
    x = np.asarray(x)
    dtype = x.dtype if np.issubdtype(x.dtype, np.floating) else np.float64
    magnitude = np.minimum(np.abs(x.astype(np.float64)), _SATURATED)
    square = magnitude * magnitude
    # The terms grow while 2x^2 > 2n+3, then shrink at least geometrically: 2x^2 + 60 terms
    # leave a tail below 1e-17 of the sum for every x up to the saturation point.
    count = int(2 * float(square.max(initial=0.0))) + 60
    term, total = magnitude.copy(), magnitude.copy()
    for n in range(count):
        term *= 2 * square / (2 * n + 3)
        total += term
    value = np.where(magnitude >= _SATURATED, 1.0, 2 / math.sqrt(math.pi) * np.exp(-square) * total)
    return (np.sign(x) * value).astype(dtype)


def expit(x) -> np.ndarray:
    """The logistic sigmoid 1 / (1 + exp(-x)), without overflow for any `x`, computed in
    float64 and given back in `x`'s floating dtype.

    Example:
        >>> expit(np.array([-1000.0, 0.0, 1000.0])).tolist()
        [0.0, 0.5, 1.0]
    """
    x = np.asarray(x)
    dtype = x.dtype if np.issubdtype(x.dtype, np.floating) else np.float64
    return np.exp(-np.logaddexp(0, -x.astype(np.float64))).astype(dtype)


def log_softmax(x, axis: int = -1) -> np.ndarray:
    """log(softmax(x)) along `axis`, shifted by the maximum so that no exp overflows.

    Example:
        >>> log_softmax(np.array([0.0, 0.0])).tolist() == [math.log(0.5)] * 2
        True
    """
    x = np.asarray(x)
    shifted = x - np.max(x, axis=axis, keepdims=True)
    return shifted - np.log(np.sum(np.exp(shifted), axis=axis, keepdims=True))


def softmax(x, axis: int = -1) -> np.ndarray:
    """exp(x) / sum(exp(x)) along `axis`, shifted by the maximum so that no exp overflows.

    Example:
        >>> softmax(np.array([1000.0, 1000.0])).tolist()
        [0.5, 0.5]
    """
    x = np.asarray(x)
    exps = np.exp(x - np.max(x, axis=axis, keepdims=True))
    return exps / np.sum(exps, axis=axis, keepdims=True)
