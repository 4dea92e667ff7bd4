"""Ops that move dims around: Reshape (compound factors), Transpose, ExpandDims, Squeeze, Concat."""

from __future__ import annotations

import math

from autostrat.errors import RuleError
from autostrat.rules.common import dim_names, normalize_axes
from autostrat.rules.registry import Example, register
from autostrat.rules.rule import RuleSpec


def _format(dims: list[list[str]]) -> str:
    return " ".join("1" if not d else d[0] if len(d) == 1 else "(" + " ".join(d) + ")" for d in dims)


class _ReshapeFactors:
    """Factors shared by an input and an output shape of the same element count.

    Cases, walking both shapes from the left: the current input and output pieces share a factor
    of size gcd(piece sizes); when the gcd is 1 (the dims do not nest, e.g. [6, 4] -> [4, 6]) the
    pieces up to the next common boundary become need-replication factors on each side.
    """

    def __init__(self, in_shape, out_shape):
        self.sizes: dict[str, int] = {}
        self.need: list[str] = []
        self.ins = [[] for _ in in_shape]
        self.outs = [[] for _ in out_shape]
        self.in_queue = [[i, s] for i, s in enumerate(in_shape) if s > 1]
        self.out_queue = [[i, s] for i, s in enumerate(out_shape) if s > 1]
        while self.in_queue:
            self.step()

    def new(self, size: int, need: bool = False) -> str:
        name = f"f{len(self.sizes)}"
        self.sizes[name] = size
        if need:
            self.need.append(name)
        return name

    def take(self, queue, dims, size: int, name: str) -> None:
        dims[queue[0][0]].append(name)
        queue[0][1] //= size
        if queue[0][1] == 1:
            queue.pop(0)

    def step(self) -> None:
        a, b = self.in_queue[0][1], self.out_queue[0][1]
        shared = math.gcd(a, b)
        if shared > 1:
            name = self.new(shared)
            self.take(self.in_queue, self.ins, shared, name)
            self.take(self.out_queue, self.outs, shared, name)
            return
        produced_in = produced_out = 1
        while produced_in == 1 or produced_in != produced_out:
            if produced_in <= produced_out:
                size = self.in_queue[0][1]
                self.take(self.in_queue, self.ins, size, self.new(size, need=True))
                produced_in *= size
            else:
                size = self.out_queue[0][1]
                self.take(self.out_queue, self.outs, size, self.new(size, need=True))
                produced_out *= size


_RESHAPE_EXAMPLES = [
    Example(((24, 48),), {"shape": (24, 6, 8)}),
    Example(((4, 6, 48),), {"shape": (24, 48)}),
    Example(((6, 4),), {"shape": (4, 6)}),
    Example(((24, 1, 12),), {"shape": (2, 12, 12)}),
]


@register("Reshape", examples=_RESHAPE_EXAMPLES)
def reshape(shapes, shape=()) -> RuleSpec:
    target = tuple(shape)
    if math.prod(shapes[0]) != math.prod(target) or any(s < 1 for s in target):
        raise RuleError(f"Reshape: cannot reshape {list(shapes[0])} into {list(target)}")
    factors = _ReshapeFactors(shapes[0], target)
    equation = f"{_format(factors.ins)} -> {_format(factors.outs)}"
    return RuleSpec(equation, sizes=factors.sizes, need_replication=" ".join(factors.need))


@register("Transpose", examples=[Example(((12, 6, 8),), {"perm": (2, 0, 1)}), Example(((24, 48),), {"perm": (1, 0)})])
def transpose(shapes, perm=()) -> RuleSpec:
    names = dim_names(len(shapes[0]))
    if sorted(perm) != list(range(len(names))):
        raise RuleError(f"Transpose: perm must be a permutation of 0..{len(names) - 1}, got {tuple(perm)}")
    return RuleSpec(f"{' '.join(names)} -> {' '.join(names[p] for p in perm)}")


@register("ExpandDims", examples=[Example(((24, 48),), {"axis": 1}), Example(((24, 48),), {"axis": -1})])
def expand_dims(shapes, axis: int = 0) -> RuleSpec:
    names = dim_names(len(shapes[0]))
    position = normalize_axes(axis, len(names) + 1, "ExpandDims")[0]
    return RuleSpec(f"{' '.join(names)} -> {' '.join(names[:position] + ['1'] + names[position:])}")


@register("Squeeze", examples=[Example(((24, 1, 48),), {"axis": 1}), Example(((1, 24, 1),), {})])
def squeeze(shapes, axis=()) -> RuleSpec:
    shape = shapes[0]
    names = dim_names(len(shape))
    if axis == () or axis is None:
        axes = tuple(i for i, size in enumerate(shape) if size == 1)
    else:
        axes = normalize_axes(axis, len(shape), "Squeeze")
    if any(shape[i] != 1 for i in axes):
        raise RuleError(f"Squeeze: axis {axis} of shape {list(shape)} is not of size 1")
    kept = [name for i, name in enumerate(names) if i not in axes]
    return RuleSpec(f"{' '.join('1' if i in axes else n for i, n in enumerate(names))} -> {' '.join(kept)}")


@register("Concat", examples=[Example(((24, 48), (12, 48)), {"axis": 0}), Example(((24, 8), (24, 16), (24, 8)), {"axis": 1})])
def concat(shapes, axis: int = 0) -> RuleSpec:
    """The concatenated dim cannot be split: each input holds a different extent of it."""
    rank = len(shapes[0])
    position = normalize_axes(axis, rank, "Concat")[0]
    names = dim_names(rank)
    operands, pieces = [], []
    for index, shape in enumerate(shapes):
        piece = f"cat{index}"
        pieces.append(piece)
        operands.append(" ".join(piece if i == position else n for i, n in enumerate(names[: len(shape)])))
    out = " ".join("cat" if i == position else n for i, n in enumerate(names))
    total = sum(shape[position] for shape in shapes)
    return RuleSpec(f"{', '.join(operands)} -> {out}", sizes={"cat": total}, need_replication=" ".join(pieces + ["cat"]))


@register(
    "BroadcastTo",
    examples=[Example(((24, 1),), {"shape": (24, 48)}), Example(((48,),), {"shape": (6, 4, 48)}), Example(((1, 6, 1),), {"shape": (4, 6, 8)})],
)
def broadcast_to(shapes, shape=()) -> RuleSpec:
    """Numpy broadcasting to `shape`: a size-1 or missing leading dim grows into an output-only
    factor, which a rank may split by filling just its own slice."""
    source, target = shapes[0], tuple(shape)
    offset = len(target) - len(source)
    if offset < 0 or any(size not in (1, grown) for size, grown in zip(source, target[offset:])):
        raise RuleError(f"BroadcastTo: cannot broadcast {list(source)} to {list(target)}")
    names = dim_names(len(target))
    grown = [i for i, size in enumerate(target) if i < offset or source[i - offset] != size]
    operand = " ".join("1" if i in grown else names[i] for i in range(offset, len(target)))
    return RuleSpec(f"{operand} -> {' '.join(names)}", sizes={names[i]: target[i] for i in grown})


@register("Slice", examples=[Example(((24, 48),), {"begin": (0, 8), "size": (24, 16)}), Example(((12, 6, 8),), {"begin": (2, 0, 1), "size": (4, 6, 6)})])
def slice_(shapes, begin=(), size=()) -> RuleSpec:
    """The box [begin, begin + size) of the input. A cut dim stays whole on both sides (each
    would hold a different extent); a dim kept whole passes through."""
    shape = shapes[0]
    if len(begin) != len(shape) or len(size) != len(shape) or any(b < 0 or s < 1 or b + s > n for b, s, n in zip(begin, size, shape)):
        raise RuleError(f"Slice: begin {tuple(begin)} and size {tuple(size)} must give a box inside {list(shape)}")
    names = dim_names(len(shape))
    cut = [i for i, (b, s, n) in enumerate(zip(begin, size, shape)) if (b, s) != (0, n)]
    out = [f"o{name}" if i in cut else name for i, name in enumerate(names)]
    need = " ".join(names[i] + " " + out[i] for i in cut)
    return RuleSpec(f"{' '.join(names)} -> {' '.join(out)}", sizes={out[i]: size[i] for i in cut}, need_replication=need)
