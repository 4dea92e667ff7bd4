"""Helpers the op families share: dim names, axis normalisation, broadcasting."""

from __future__ import annotations

from autostrat.errors import RuleError

_NAMES = "abcdefghijpqrstuvwxyz"


def dim_names(rank: int, prefix: str = "") -> list[str]:
    """Readable factor names for `rank` dims: a b c ... (with `prefix` when given)."""
    if rank > len(_NAMES):
        raise RuleError(f"tensors of rank {rank} are not supported (at most {len(_NAMES)} dims)")
    return [prefix + name for name in _NAMES[:rank]]


def normalize_axes(axes, rank: int, op_type: str) -> tuple[int, ...]:
    """Sorted non-negative axes; an int is one axis, None or () means every axis."""
    if axes is None or axes == ():
        return tuple(range(rank))
    items = (axes,) if isinstance(axes, int) else tuple(axes)
    result = set()
    for axis in items:
        if not isinstance(axis, int) or isinstance(axis, bool) or not -rank <= axis < rank:
            raise RuleError(f"{op_type}: axis {axis!r} is out of range for a tensor of rank {rank}")
        result.add(axis % rank)
    return tuple(sorted(result))


def broadcast_equation(shapes) -> str:
    """An elementwise equation with numpy broadcasting: dims align from the right, and a size-1
    input dim facing a larger one becomes ``1`` (no factor).

    Example:
        >>> broadcast_equation([(64, 32), (32,)])
        'a b, b -> a b'
        >>> broadcast_equation([(64, 1), (64, 32)])
        'a 1, a b -> a b'
    """
    rank = max(len(shape) for shape in shapes)
    names = dim_names(rank)
    out = []
    for position in range(rank):
        sizes = {shape[position - rank + len(shape)] for shape in shapes if position - rank + len(shape) >= 0}
        if len(sizes - {1}) > 1:
            raise RuleError(f"shapes {[list(s) for s in shapes]} cannot be broadcast together (dim {position})")
        out.append(max(sizes))
    operands = []
    for shape in shapes:
        offset = rank - len(shape)
        dims = ["1" if size == 1 and out[offset + i] > 1 else names[offset + i] for i, size in enumerate(shape)]
        operands.append(" ".join(dims))
    return f"{', '.join(operands)} -> {' '.join(names)}"
