"""The layers of a layout search: their spaces and device matrices (`Problem`), the memoised
edges of the permuted layer (`permuted_edges`) and of any layer (`expansions`), and a layout as
a space and state (`space_of`, `state_of`). `search.Search` runs A* over them.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from autostrat.layout import Layout, TensorMap
from autostrat.redistribution.memo import BoundedMemo
from autostrat.redistribution.moves import Move, Space, State, canonical, moves
from autostrat.redistribution.timed import matrix_of

EXPANDED_LIMIT, EXPANDED_PROBLEMS = 50_000, 4  # states an `expansions` memo keeps, and memos kept
PERMUTED = 2


@dataclass(frozen=True)
class Problem:
    """The spaces of a search (one or two layers) and their device matrices and partial op."""

    spaces: tuple[Space, ...]
    partial_op: str

    def space(self, layer: int) -> Space:
        return self.spaces[-1] if layer == PERMUTED else self.spaces[layer]

    def matrix(self, layer: int) -> DeviceMatrix:
        return matrix_of(self.space(layer).sizes)

    def layout(self, node) -> Layout:
        layer, (entries, partial) = node
        op = self.partial_op if partial else "sum"
        return Layout(self.matrix(layer), TensorMap(entries), self.space(layer).shape, partial, op)


def bijections(problem: Problem) -> list[tuple[int, ...]]:
    """Every map from layer-0 axes to layer-1 axes of equal size (as a tuple indexed by axis)."""
    first, second = problem.spaces[0].sizes, problem.spaces[1].sizes
    found = [()]
    for axis in range(len(first)):
        found = [m + (b,) for m in found for b in range(len(second)) if second[b] == first[axis] and b not in m]
    return found


@lru_cache(maxsize=1 << 16)
def permuted_edges(space: Space, state: State, unit: bool = False) -> tuple[tuple[Move, tuple], ...]:
    """The moves out of a permuted-layer representative with their children's representatives
    (memoised: every search through the permuted layer of one space meets the same states).

    Example:
        >>> space = Space(sizes=(2, 2), shape=(4,), itemsize=4)
        >>> [child for _, child in permuted_edges(space, (((),), ()))]
        [(2, (((0,),), ())), (2, (((0,),), ()))]
    """
    return tuple((move, (PERMUTED, canonical(space.sizes, space.sizes, move.state)[0])) for move in moves(space, state, unit))


@lru_cache(maxsize=EXPANDED_PROBLEMS)
def expansions(problem: Problem, pools, model, unit: bool = False) -> dict:
    """The shared memo of `Search._expand`: node -> its ``(child, weight, bytes, signature, move)``
    edges, which depend on nothing but the problem, the relabelling pools and the model. A
    table's columns search from every row through many of the same states, and many columns
    share pools. The child's split signature is kept for its size bound, whatever the target.

    Example:
        >>> expansions(Problem((Space((2,), (4,), 4),), "sum"), (), None)
        {}
    """
    return BoundedMemo(EXPANDED_LIMIT)  # held states' edges were most of a 64-device row's memory


def state_of(layout: Layout) -> State:
    return layout.tensor_map.entries, layout.partial


def space_of(layout: Layout, itemsize: int) -> Space:
    return Space(tuple(reversed(layout.device_matrix.shape)), layout.shape, itemsize)
