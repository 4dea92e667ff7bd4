"""The brute-force redistribution oracle, written apart from the planner.

It enumerates every state of a device matrix refined to prime axes (finer than the planner's
common refinement, so it also sees intermediate layouts the planner cannot express), decides
for every ordered pair of states whether one step turns one into the other by comparing the
two states directly (no move generator; a PartialCreate may make free axes partial at any point,
not only last as the planner takes it), prices it with the formulas of the issue, and takes the
cheapest sequence of at most `MAX_STEPS` steps (Bellman-Ford by sequence length); `oracle_time`
takes the fastest sequence under an α–β model instead.
"""

from __future__ import annotations

import heapq
import itertools
import math
from functools import lru_cache

from autostrat.layout import DeviceMatrix, Layout, TensorMap
from autostrat.redistribution.refine import common_matrix, refine_layout

MAX_STEPS = 8
INF = float("inf")


def primes(size: int) -> list[int]:
    found, factor = [], 2
    while size > 1:
        while size % factor == 0:
            found.append(factor)
            size //= factor
        factor += 1
    return found


def prime_refinement(matrix: DeviceMatrix) -> DeviceMatrix:
    return DeviceMatrix(tuple(p for size in matrix.shape for p in primes(size)) or (1,))


def states(sizes: tuple[int, ...], shape: tuple[int, ...], with_partial: bool = True) -> list[tuple]:
    """Every ``(entries, partial)`` over axes of `sizes` (axis id = index) that divides `shape`."""
    roles = ["free", "partial"] + list(range(len(shape))) if with_partial else ["free"] + list(range(len(shape)))
    found = set()
    for choice in itertools.product(roles, repeat=len(sizes)):
        partial = tuple(a for a, role in enumerate(choice) if role == "partial")
        per_dim = [[a for a, role in enumerate(choice) if role == dim] for dim in range(len(shape))]
        for orders in itertools.product(*(itertools.permutations(axes) for axes in per_dim)):
            if all(size % math.prod(sizes[a] for a in order) == 0 for size, order in zip(shape, orders)):
                found.add((tuple(orders), partial))
    return sorted(found)


def local_bytes(sizes, shape, itemsize, state) -> int:
    return math.prod(shape) * itemsize // math.prod(sizes[a] for entry in state[0] for a in entry)


def _one_dim_differs(u, v):
    differing = [d for d in range(len(u)) if u[d] != v[d]]
    return differing[0] if len(differing) == 1 else None


def step_options(sizes, shape, itemsize, u, v) -> list[tuple[str, tuple[int, ...], int]]:
    """Every single step from state `u` to state `v` as ``(kind, axes, bytes)`` (same device
    matrix); a permute's axes are those it renames."""
    (ue, up), (ve, vp) = u, v
    s = local_bytes(sizes, shape, itemsize, u)
    used = {a for entry in ue for a in entry} | set(up)
    found = []
    dim = _one_dim_differs(ue, ve)
    if up == vp and dim is not None:
        small, large = sorted((ue[dim], ve[dim]), key=len)
        if large[: len(small)] == small:
            block = large[len(small):]
            g = math.prod(sizes[a] for a in block)
            if large is ve[dim] and len(block) == 1 and block[0] not in used:
                found.append(("Slice", block, 0))
            if large is ue[dim]:
                found.append(("AllGather", block, (g - 1) * s))
    differing = [d for d in range(len(ue)) if ue[d] != ve[d]]
    if up == vp and len(differing) == 2:
        for i, j in (differing, differing[::-1]):
            block = ue[i][len(ve[i]):]
            if block and ue[i][: len(ve[i])] == ve[i] and ve[j] == ue[j] + block:
                g = math.prod(sizes[a] for a in block)
                found.append(("AllToAll", block, -(-(g - 1) * s // g)))
    removed = tuple(sorted(set(up) - set(vp), reverse=True))
    if removed and set(vp) < set(up):
        g = math.prod(sizes[a] for a in removed)
        if ue == ve:
            found.append(("AllReduce", removed, -(-2 * (g - 1) * s // g)))
        if dim is not None and ve[dim] == ue[dim] + removed:
            found.append(("ReduceScatter", removed, -(-(g - 1) * s // g)))
    added = tuple(sorted(set(vp) - set(up)))
    if ue == ve and added and set(up) < set(vp) and not used & set(added):
        found.append(("PartialCreate", added, 0))
    if u != v:
        for mapping in size_permutations(sizes):
            if relabel(u, mapping) == v:
                found.append(("CollectivePermute", tuple(a for a in range(len(sizes)) if mapping[a] != a), s))
    return found


def step_cost(sizes, shape, itemsize, u, v):
    """The cheapest single step from state `u` to state `v`, or None (same device matrix)."""
    return min((sent for _, _, sent in step_options(sizes, shape, itemsize, u, v)), default=None)


def relabel(state, mapping):
    entries, partial = state
    return tuple(tuple(mapping[a] for a in e) for e in entries), tuple(sorted(mapping[a] for a in partial))


@lru_cache(maxsize=None)
def size_permutations(sizes) -> tuple:
    return tuple(p for p in itertools.permutations(range(len(sizes))) if all(sizes[a] == sizes[p[a]] for a in range(len(sizes))))


def layout_of(sizes, shape, op, state) -> Layout:
    entries, partial = state
    return Layout(DeviceMatrix(tuple(reversed(sizes))), TensorMap(entries), shape, partial, op if partial else "sum")


@lru_cache(maxsize=None)
def graph(first, second, shape, itemsize, op) -> dict:
    """Edges ``node -> [(node, cost)]`` over one matrix (`second` None) or two layered ones."""
    layers = [(0, first)] + ([(1, second)] if second else [])
    edges = {}
    for layer, sizes in layers:
        nodes = states(sizes, shape)
        for u in nodes:
            out = edges.setdefault((layer, u), [])
            for v in nodes:
                cost = step_cost(sizes, shape, itemsize, u, v)
                if cost is not None:
                    out.append(((layer, v), cost))
    if second:
        crossings = [m for m in itertools.permutations(range(len(second))) if all(first[a] == second[m[a]] for a in range(len(first)))]
        for u in states(first, shape):
            before = layout_of(first, shape, op, u).normalized()
            for v in sorted({relabel(u, m) for m in crossings}):
                free = before == layout_of(second, shape, op, v).normalized()
                edges[(0, u)].append(((1, v), 0 if free else local_bytes(first, shape, itemsize, u)))
    return edges


@lru_cache(maxsize=None)
def cheapest_from(first, second, shape, itemsize, op, start) -> dict:
    """Minimum cost of every node reachable from `start` in at most `MAX_STEPS` steps."""
    edges = graph(first, second, shape, itemsize, op)
    best = {start: 0}
    frontier = dict(best)
    for _ in range(MAX_STEPS):
        improved = {}
        for node, cost in frontier.items():
            for child, step in edges[node]:
                if cost + step < min(best.get(child, INF), improved.get(child, INF)):
                    improved[child] = cost + step
        best.update(improved)
        frontier = improved
    return best


def oracle_cost(src: Layout, dst: Layout, itemsize: int = 4) -> float:
    """The brute-force minimum bytes per device from `src` to `dst` (inf when unreachable)."""
    src, dst = src.normalized(), dst.normalized()
    op = src.partial_op if src.partial else dst.partial_op
    matrix = common_matrix(prime_refinement(src.device_matrix), prime_refinement(dst.device_matrix))
    if matrix is None:
        matrix = common_matrix(src.device_matrix, dst.device_matrix)
    if matrix is not None:
        fine = prime_refinement(matrix)
        first, second = refine_layout(src, fine), refine_layout(dst, fine)
        sizes, target_sizes, layer = tuple(reversed(fine.shape)), None, 0
    else:
        first, second = refine_layout(src, prime_refinement(src.device_matrix)), refine_layout(dst, prime_refinement(dst.device_matrix))
        sizes, target_sizes, layer = tuple(reversed(first.device_matrix.shape)), tuple(reversed(second.device_matrix.shape)), 1
    start = (0, (first.tensor_map.entries, first.partial))
    best = cheapest_from(sizes, target_sizes, src.shape, itemsize, op, start)
    return best.get((layer, (second.tensor_map.entries, second.partial)), INF)


@lru_cache(maxsize=None)
def step_graph(sizes, shape, itemsize) -> dict:
    """``state -> [(state, kind, axes, bytes)]``: every single step over one prime matrix."""
    nodes = states(sizes, shape)
    return {u: [(v, *option) for v in nodes for option in step_options(sizes, shape, itemsize, u, v)] for u in nodes}


def oracle_time(src: Layout, dst: Layout, model, itemsize: int = 4) -> float:
    """The brute-force minimum nanoseconds from `src` to `dst` under the α–β `model` (Dijkstra
    over every state of the prime refinement of a common device matrix, each step timed by
    `model.step_nanoseconds` on the axes it uses; inf when unreachable). Layouts without a
    common prime matrix are not handled (None)."""
    src, dst = src.normalized(), dst.normalized()
    matrix = common_matrix(prime_refinement(src.device_matrix), prime_refinement(dst.device_matrix))
    if matrix is None:
        return None
    fine = prime_refinement(matrix)
    goal = _state(dst, fine)
    return _fastest(src, fine, model, itemsize, goal).get(goal, INF)


def oracle_times(src: Layout, model, itemsize: int = 4):
    """`oracle_time` from `src` to every layout over the prime refinement of its device matrix
    at once (one Dijkstra): a function of the destination layout."""
    src = src.normalized()
    fine = prime_refinement(src.device_matrix)
    fastest = _fastest(src, fine, model, itemsize)
    return lambda dst: fastest.get(_state(dst.normalized(), fine), INF)


def _state(layout: Layout, fine: DeviceMatrix) -> tuple:
    refined = refine_layout(layout, fine)
    return refined.tensor_map.entries, refined.partial


def _fastest(src: Layout, fine: DeviceMatrix, model, itemsize: int, goal=None) -> dict:
    """Dijkstra's settled nanoseconds from `src` over `fine`'s states: every reachable state, or
    up to `goal` once it settles."""
    edges = step_graph(tuple(reversed(fine.shape)), src.shape, itemsize)
    start = _state(src, fine)
    best, settled, heap = {start: 0}, {}, [(0, start)]
    while heap:
        cost, u = heapq.heappop(heap)
        if u in settled:
            continue
        settled[u] = cost
        if u == goal:
            break
        for v, kind, axes, sent in edges[u]:
            reached = cost + (model.step_nanoseconds(kind, fine, axes, sent) if axes else 0)
            if reached < best.get(v, INF):
                best[v] = reached
                heapq.heappush(heap, (reached, v))
    return settled


def all_layouts(device_num: int, shape: tuple[int, ...], with_partial: bool = True) -> list[Layout]:
    """Every distinct distribution of `shape` over `device_num` devices, as normalised layouts:
    every state over every ordering of the prime factors of `device_num` (any device matrix
    refines to one of those orderings), deduplicated by normal form, in sorted order."""
    found = {}
    for order in sorted(set(itertools.permutations(primes(device_num)))) or [()]:
        sizes = tuple(reversed(order)) or (1,)
        for state in states(sizes, shape, with_partial):
            layout = layout_of(sizes, shape, "sum", state).normalized()
            found.setdefault(str(layout), layout)
    return [found[key] for key in sorted(found)]
