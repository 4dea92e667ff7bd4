"""One search for every pair that differs only in which dims it splits and their sizes (`dim_class`).

A search sees a tensor dim of size d only through gcd(d, D) (D the device count): a block of
axes fits on a dim iff its group size divides what a rank holds of it (`moves._rooms`), and
every group size divides D. Bytes depend on the tensor's element count alone. So the dims can be
put in any order and given any sizes with the same gcds and the same element count: the states,
moves and their prices map one to one, and so do the optimal paths. A cost table of the 7B
step at 64 devices meets the same split on a [64, 32, 2048, 128] activation's third and fourth
dims, or on three [64, 2048, 4096] tensors' three dims: one search each instead of two or three
(the 7B row refined for time: 934 timed pairs, 411 classes).

The class: the dims sorted by (gcd, source entry, target entry); dims of gcd 1, which no step
splits, dropped; each dim's size its gcd, except the first of gcd D, which carries the rest of
the element count (any multiple of D keeps gcd D). A pair without a dim of gcd D keeps its sizes
and is only sorted. Every price, and every plan under a time model, is searched over its class
(`solving`): a time table prices the plan itself, so the plan a table prices and the plan an
edge then carries are one plan, whatever tie the search broke. A plan in bytes keeps its own
dims' tie (its price, the optimum, is the class's either way), so its plans and dumps are the
ones before classes.
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import NamedTuple

from autostrat.redistribution.layers import Problem
from autostrat.redistribution.moves import Space


class DimClass(NamedTuple):
    """A problem, start and target in class form, and the original dim of each class dim."""

    problem: Problem
    start: tuple
    target: tuple
    dims: tuple[int, ...]
    count: int  # the original problem's dims


@lru_cache(maxsize=1 << 15)
def dim_class(problem: Problem, start, target) -> DimClass:
    """The class form of a search (see the module docstring).

    Example (rows split 4 ways, made columns, of a [12, 8] matrix on 4 devices: both gcds are 4;
    the columns come first, their source entry being empty, and carry the rest, 96 / 16):
        >>> space = Space((2, 2), (12, 8), 4)
        >>> found = dim_class(Problem((space,), "sum"), (0, (((1, 0), ()), ())), (0, (((), (1, 0)), ())))
        >>> found.problem.spaces[0].shape, found.start, found.target, found.dims
        ((24, 4), (0, (((), (1, 0)), ())), (0, (((1, 0), ()), ())), (1, 0))
    """
    space = problem.spaces[0]
    devices = math.prod(space.sizes)
    gcds = [math.gcd(size, devices) for size in space.shape]
    start_entries, target_entries = start[1][0], target[1][0]
    kept = [dim for dim, gcd in enumerate(gcds) if gcd > 1]
    carriers = [dim for dim in kept if gcds[dim] == devices]
    if carriers:
        order = sorted(kept, key=lambda dim: (gcds[dim], start_entries[dim], target_entries[dim], dim))
        carrier = next(dim for dim in order if gcds[dim] == devices)
        rest = math.prod(space.shape) // math.prod(gcds[dim] for dim in kept)
        shape = tuple(gcds[dim] * (rest if dim == carrier else 1) for dim in order)
    else:
        order = sorted(range(len(gcds)), key=lambda dim: (gcds[dim], space.shape[dim], start_entries[dim], target_entries[dim], dim))
        shape = tuple(space.shape[dim] for dim in order)
    spaces = tuple(Space(each.sizes, shape, each.itemsize) for each in problem.spaces)
    return DimClass(Problem(spaces, problem.partial_op), _sorted(start, order), _sorted(target, order), tuple(order),
                    len(gcds))


def _sorted(node, order) -> tuple:
    layer, (entries, partial) = node
    return layer, (tuple(entries[dim] for dim in order), partial)


def original_path(found: DimClass, path) -> tuple:
    """A path over `found`'s class as the path over the original dims: the ``(node, move,
    child)`` triples with every state's entries and every move's dims put back."""
    def back(node):
        return node[0], _entries_back(found, node[1])
    return tuple((back(node), move._replace(dims=tuple(found.dims[dim] for dim in move.dims), state=_entries_back(found, move.state)),
                  back(child)) for node, move, child in path)


def _entries_back(found: DimClass, state) -> tuple:
    entries = [()] * found.count
    for dim, entry in zip(found.dims, state[0]):
        entries[dim] = entry
    return tuple(entries), state[1]
