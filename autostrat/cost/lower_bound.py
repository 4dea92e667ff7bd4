"""A lower bound on the bytes per device any distribution of a matrix product must move.

The result used is Al Daas, Ballard, Grigori, Kumar and Rouse, "Tight Memory-Independent
Parallel Matrix Multiplication Communication Lower Bounds", SPAA 2022 (arXiv 2205.13407).

Model: a classical product C = A·B (every multiplication ``A[i, l]·B[l, j]`` is done once, no
Strassen), shared evenly by P devices (each does 1/P of the multiplications); the inputs start,
and the output ends, as one copy spread evenly over the devices. Then some device must
communicate at least

    W = D − (|A| + |B| + |C|) / P  words,

where D is the least x + y + z over (x, y, z), the elements of A, B and C one device touches,
subject to

- the Loomis–Whitney inequality x·y·z ≥ F², F = the multiplications per device;
- x ≥ |A|/P, y ≥ |B|/P, z ≥ |C|/P: an element of A takes part in only n multiplications (of B
  in only m, of C in only k), so F multiplications touch at least F/n = |A|/P elements of A.

For m ≥ n ≥ k this gives the paper's three cases:

- P ≤ m/n ("1-D"): D = nk + (mn + mk)/P, so W = nk·(1 − 1/P), a gather of the smallest matrix;
- m/n ≤ P ≤ mn/k² ("2-D"): D = 2·(mnk²/P)^{1/2} + mn/P;
- P ≥ mn/k² ("3-D"): D = 3·(mnk/P)^{2/3}.

W counts the words a device receives of inputs it does not own plus the words of partial
outputs it sends. autostrat's collectives are symmetric (every device of a group sends as
much as it receives), so W·itemsize is compared with autostrat's bytes *sent* per device.

Batches (BatchMatMul) fit the same program: b independent products embed block-diagonally
into one product of (b·m × b·k) by (b·k × b·n), whose nonzero multiplications are exactly the
batch's, and the Loomis–Whitney inequality holds for any set of multiplications; each element
of A still takes part in only n of them. A batch dim that B lacks (a broadcast 2-D B) makes
that dim part of m: B's elements then take part in b·m multiplications.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

MATMUL_OP_TYPES = frozenset({"BatchMatMul", "MatMul"})
# Where an optimum sits exactly on a case boundary, rounding may put it a hair outside both
# cases; the cases agree there, so either may take it.
_TOLERANCE = 1e-12
# Regime names by how many of x, y, z sit at their lower bounds (the paper's cases); with all
# three there, the owned data alone satisfies the inequality and the bound is 0 ("none").
_REGIMES = {0: "3-D", 1: "2-D", 2: "1-D"}
# A factor's class by whether it appears in (A, B, C).
_CLASSES = {(True, True, True): "b", (True, False, True): "m", (False, True, True): "n", (True, True, False): "k"}


@dataclass(frozen=True)
class MatmulDims:
    """The sizes of a (batched) product C[b, m, n] = Σ_k A[b, m, k]·B[b, k, n].

    Each is the product of the factor sizes of its class (a batch dim B lacks counts in m).

    Example:
        >>> dims = MatmulDims(b=2, m=16, n=12, k=8)
        >>> dims.a_size, dims.b_size, dims.c_size, dims.multiplications
        (256, 192, 384, 3072)
    """

    b: int
    m: int
    n: int
    k: int

    @property
    def a_size(self) -> int:
        return self.b * self.m * self.k

    @property
    def b_size(self) -> int:
        return self.b * self.k * self.n

    @property
    def c_size(self) -> int:
        return self.b * self.m * self.n

    @property
    def multiplications(self) -> int:
        return self.b * self.m * self.n * self.k

    def __str__(self) -> str:
        return f"b={self.b} m={self.m} n={self.n} k={self.k}"


@dataclass(frozen=True)
class Bound:
    """The lower bound of one product on `devices` devices: `words` and `bytes` per device
    (floats, ≥ 0), and the paper's `regime` ("1-D", "2-D", "3-D"; "none" when the bound is 0)."""

    dims: MatmulDims
    devices: int
    words: float
    bytes: float
    regime: str


def matmul_dims(rule) -> MatmulDims | None:
    """The product sizes of a matmul-family rule (op type MatMul or BatchMatMul), else None.

    A factor is classed by the operands it appears in: A, B and C → b; A and C → m; B and C → n;
    A and B → k (the reduction).

    Example:
        >>> from autostrat.rules import make_rule
        >>> str(matmul_dims(make_rule("MatMul", [(16, 8), (12, 8)], transpose_b=True)))
        'b=1 m=16 n=12 k=8'
        >>> str(matmul_dims(make_rule("BatchMatMul", [(4, 16, 8), (8, 12)])))
        'b=1 m=64 n=12 k=8'
        >>> matmul_dims(make_rule("ReLU", [(4, 8)])) is None
        True
    """
    if rule.op_type not in MATMUL_OP_TYPES:
        return None
    a, b = (_factors(operand) for operand in rule.inputs)
    c = _factors(rule.outputs[0])
    classes = {"b": 1, "m": 1, "n": 1, "k": 1}
    for factor, size in zip(rule.factors, rule.factor_sizes):
        where = (factor in a, factor in b, factor in c)
        kind = _CLASSES.get(where)
        assert kind is not None, f"{rule.op_type} factor {factor!r} is in operands {where} of {rule}"
        classes[kind] *= size
    return MatmulDims(**classes)


def _factors(operand) -> set[str]:
    return {factor for dim in operand for factor in dim}


def communication_bound(dims: MatmulDims, devices: int, itemsize: int) -> Bound:
    """The least words (and bytes) some device must communicate for the product `dims` on
    `devices` devices, each element `itemsize` bytes (see the module docstring).

    Example (one device needs nothing; the paper's three regimes, the 1-D one a gather of B):
        >>> [communication_bound(MatmulDims(1, 64, 64, 64), p, 4).regime for p in (1, 8)]
        ['none', '3-D']
        >>> communication_bound(MatmulDims(1, 64, 16, 4), 8, 4).regime
        '2-D'
        >>> bound = communication_bound(MatmulDims(1, 32, 4, 8), 2, 4)
        >>> bound.regime, bound.words, bound.bytes
        ('1-D', 16.0, 64.0)
    """
    if devices == 1:
        return Bound(dims, 1, 0.0, 0.0, "none")
    lower = (dims.a_size / devices, dims.b_size / devices, dims.c_size / devices)
    fixed, touched = _least_touched(lower, (dims.multiplications / devices) ** 2)
    owned = sum(lower)
    # A batch of at least `devices` products needs no communication (W ≤ 0); rounding may
    # leave a hair above 0 where the exact W is 0.
    words = touched - owned if touched - owned > owned * _TOLERANCE else 0.0
    return Bound(dims, devices, words, words * itemsize, _REGIMES[fixed] if words > 0 else "none")


def _least_touched(lower: tuple[float, ...], product: float) -> tuple[int, float]:
    """min x + y + z subject to x·y·z ≥ `product` and each at least its `lower` bound, and how
    many variables sit at their bounds.

    Cases (KKT): the variables with the largest lower bounds sit at them and the others are
    equal. For j = 0, 1, 2 fix the j largest bounds and set the rest to v = (product / Π fixed)
    ^ (1/(3 − j)); the first j with v ≥ every unfixed bound and every fixed bound ≥ v is the
    optimum. If none is, the bounds alone satisfy the inequality (j = 3).
    """
    ordered = sorted(lower, reverse=True)
    for j in range(3):
        fixed, free = ordered[:j], ordered[j:]
        v = (product / math.prod(fixed)) ** (1 / (3 - j))
        if v >= max(free) * (1 - _TOLERANCE) and all(bound >= v * (1 - _TOLERANCE) for bound in fixed):
            return j, sum(fixed) + (3 - j) * v
    return 3, sum(ordered)
