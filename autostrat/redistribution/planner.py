"""`plan_redistribution`: the cheapest plan from one layout of a tensor to another.

Cases, in order: inputs that cannot describe one tensor on one cluster are rejected without a
search (every other pair has a plan: steps resolve, hand on and create partial values, see
`constructive`); a partial source and a partial destination with different ops go through the
destination's shadow (`_resolved_first`); both layouts are normalised (so equivalent layouts
share one memo entry) and refined to a common device matrix (two layers when none exists, see
`search`); an A* search from the source finds the destination; past `search.SETTLED_LIMIT`
settled states the constructive plan (`constructive.constructive_path`) answers and the plan
says so. Shapes of equal element count but different dims go through one local Reshape
(`_reshape_route`). No pair of one tensor on one cluster is priced unreachable: a search that
ended without its target would be a bug, and the fallback's plan is built regardless.

Which answers are proven optimal (for the step set of `moves`, in bytes or, with a model, in
α–β time): every plan and price whose search settles its target, i.e. every plan with
``exhaustive`` set and every cost-table entry computed without the fallback. The bounds are
admissible (`heuristic`, `timed.TimedBound`), so A* settles the target at the optimum; states
are merged only up to relabellings that keep every step's price, and a PartialCreate is taken
only last or before a crossing, which loses nothing (`moves`). The coarse plan (`_coarse_plan`) is used only when it costs that proven optimum.
The timed search's fast path, its permutes' children found per class of relabelled state
rather than per relabelling (`relabellings.first_relabellings`), is exact, not a pruning: it yields
every class every relabelling reaches, over the same link, by the same first relabelling
(tests/test_redistribution_timed.py checks it against every relabelling), so it proves optimal
the same pairs, only sooner. Nor is its other fast path, a popped bundle's permute to the
relabelling nearest the target's order before its classes (`search.Search._towards`): the
classes wait in the bundle's rest at a key below each of theirs (on the fastest link, what each
server must import: `timed.TimedBound.fast_relabellings`), so A* lists them only when one could
still beat the plan found (tested equal to listing them at once); a split handed between axes of
one size across servers, whose classes are every relabelling, plans without listing any. How far the
others can be: the constructive fallback sends less than ``4T`` bytes per device (``T`` the tensor's bytes: one
AllReduce under ``2T``, gathers under ``T`` in all, one permute of at most ``T``, free slices and PartialCreate),
so it is at most ``4T`` above the optimum; measured on every pair of 2-d tensors over
``[2, 2]``, ``[2, 4]``, ``[2, 6]`` and ``[4, 4]`` it is under ``2T`` above it, at most
``device_num`` times it (a ReduceScatter the fallback does as AllReduce then Slice), and free
whenever the optimum is. Timed, the same steps take at most ``3N - 2`` messages (``2(g-1)`` for
the AllReduce, ``N - 1`` for the gathers, one permute), so the fallback is at most
``(3N - 2)·α + 4T/β`` above the optimum (the slowest link's α and β); measured on ``[2, 4]``
and ``[4, 4]`` it is at most 10 times the optimum, and free whenever the optimum is
(tests/test_redistribution_reach.py, both). No pair of the 7b scale and
quality benchmarks at 64 and 1 024 devices falls back (`benchmarks/redistribution.py` counts).

Under a time model a search may stop at a budget of settled nodes, and its plan is then not
proven optimal but bounded (`link_plans`).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import replace
from functools import lru_cache

from autostrat.cost import dtype_size
from autostrat.errors import RedistributionError
from autostrat.layout import DeviceMatrix, Layout, TensorMap
from autostrat.redistribution.link_plans import timed_objective, timed_solution
from autostrat.redistribution.layers import Problem
from autostrat.redistribution.paths import ordered_slices
from autostrat.redistribution.plan import RedistributionPlan, RedistributionStep
from autostrat.redistribution.refine import common_matrix, prime_matrix
from autostrat.redistribution.reshape import reshape_pairs
from autostrat.redistribution.solving import COARSE_FIRST_ABOVE, check_pair, refined, solve_cost, solve_layouts, solve_path
from autostrat.redistribution.steps import make_step


def _resolved_first(src: Layout, dst: Layout) -> Layout | None:
    """`dst` without its partial axes when `src` is partial with another op, else None.

    A state holds partial values of one op, so every plan between them passes a whole state;
    from there a PartialCreate can always go last (`moves`), so the cheapest plan is the
    cheapest one to this shadow, then one PartialCreate (free in bytes and time).

    Example:
        >>> from autostrat.layout import DeviceMatrix, TensorMap
        >>> most = Layout(DeviceMatrix((2,)), TensorMap((-1,)), (4,), (0,), "max")
        >>> str(_resolved_first(most, most.with_partial([0])))
        '[4] dm[2] tm(-1,)'
    """
    if src.partial and dst.partial and src.partial_op != dst.partial_op:
        return dst.with_partial(())
    return None


def creation_step(before: Layout, after: Layout) -> RedistributionStep:
    """The PartialCreate from `before` (whole) to `after`, over `after`'s device matrix: groups
    over its partial axes, members by rank (the first one keeps its piece of a sum)."""
    groups = tuple(tuple(sorted(group)) for group in after.device_matrix.groups(after.partial))
    return RedistributionStep("PartialCreate", after.partial, (), before, after, groups, 0)


def _objective(src: Layout, dst: Layout, dtype, model) -> int:
    """The objective of the cheapest plan: bytes, or with a `model` its time (`redistribution_time`)."""
    if model is not None:
        return redistribution_time(src, dst, dtype, model)
    return _cheapest_bytes(src, dst, dtype)


@lru_cache(maxsize=1024)
def _reshape_route(src: Layout, dst: Layout, dtype, model) -> tuple[Layout, Layout, int]:
    """``(L1, L2, objective)`` (bytes, or nanoseconds with a `model`) of the cheapest plan
    src -> L1 (in src's shape), Reshape L1 -> L2 (free),
    L2 -> dst (in dst's shape), over every compatible pair (`reshape.reshape_pairs`) written on
    every ordering of the prime factors of `device_num` (every device matrix refines to one).

    Exact for that step set: every plan with one Reshape passes through one compatible pair, and
    each half is the planner's minimum; a pair is skipped only when its first half alone already
    costs no less than the best total found.
    """
    best: tuple = (float("inf"), None, None)
    # A permute may hand partial roles to other axes of equal size: any axes may stay partial
    # whose prime sizes are among those of the source's partial contributions.
    available = sorted(_primes(len(src.partial_groups()[0]))) if src.partial else []
    for matrix in _prime_orders(src):
        sizes = tuple(reversed(matrix.shape))
        candidates = tuple(range(len(sizes))) if available else ()
        for first, second in reshape_pairs(sizes, src.shape, dst.shape, candidates):
            if not _sub_multiset(sorted(sizes[axis] for axis in first[1]), available):
                continue
            op = src.partial_op if first[1] else "sum"
            before = Layout(matrix, TensorMap(first[0]), src.shape, first[1], op)
            head = _objective(src, before, dtype, model)
            if head >= best[0]:
                continue
            after = Layout(matrix, TensorMap(second[0]), dst.shape, second[1], op)
            total = head + _objective(after, dst, dtype, model)
            if total < best[0]:
                best = (total, before, after)
    if best[1] is None:  # the replicated, whole pair is always among them
        raise AssertionError(f"no Reshape route from {src} to {dst}")
    return best[1], best[2], int(best[0])


def redistribution_cost(src: Layout, dst: Layout, dtype="float32", model=None) -> int:
    """Bytes per device of the cheapest plan from `src` to `dst` (no plan objects are built;
    with an α–β `model`, of the fastest plan, which is built).

    Example:
        >>> from autostrat.layout import DeviceMatrix, TensorMap
        >>> split = Layout(DeviceMatrix((2, 4)), TensorMap((1, -1)), (64, 64))
        >>> redistribution_cost(split.with_partial([0]), split)
        12288
    """
    check_pair(src, dst)  # before the shape class: it assumes one device count
    whole = _resolved_first(src, dst)
    if whole is not None:
        return redistribution_cost(src, whole, dtype, model)
    if model is not None:
        return plan_redistribution(src, dst, dtype, model).cost
    if src.shape != dst.shape:
        return _reshape_route(src.normalized(), dst.normalized(), dtype, model)[2]
    return _cheapest_bytes(src, dst, dtype)


def _cheapest_bytes(src: Layout, dst: Layout, dtype) -> int:
    """Bytes of the cheapest plan between layouts of one shape, searched once per shape class
    (`shape_class`): tensors of many shapes share one search, and its memos."""
    small = shape_class(src, dst, dtype_size(dtype))
    if small is not None:
        small_src, small_dst, itemsize, numerator, denominator = small
        try:
            found = solve_layouts(small_src, small_dst, itemsize, None, _bounded(small_src, small_dst, itemsize))[1]
        except RedistributionError:
            found = None  # the caller's layouts are searched again, and the error names them
        if found is not None:  # every path scales, the constructive fallback's too (the same steps)
            scaled, rest = divmod(found[1] * numerator, denominator)
            if not rest:  # always, by the argument in `shape_class`; exactness is not left to it
                return scaled
    return solve_layouts(src, dst, dtype_size(dtype), None, _bounded(src, dst, dtype_size(dtype)))[1][1]


def _bounded(src: Layout, dst: Layout, itemsize: int):
    """`solve_cost` within `_coarse_bound` of the pair, as `solve_layouts` calls it (after
    its check that the layouts are of one tensor on one cluster)."""
    def solve(problem, start, target, model):
        return solve_cost(problem, start, target, model, _coarse_bound(src, dst, itemsize))
    return solve


def _coarse_bound(src: Layout, dst: Layout, itemsize: int) -> float:
    """Bytes of the cheapest plan over the coarsest common device matrix of `src` and `dst` (of
    one shape), when it has at most `COARSE_FIRST_ABOVE` axes and its prime refinement more
    (else inf: the prime search would be no dearer than the coarse one).

    Every coarse plan is a plan over the prime axes that sends the same bytes (a step over a
    block of axes is a step over its prime axes, as `_coarse_plan` takes it), so the optimum
    costs no more: the prime search keeps only states within it. One 1 024-device search of a
    stage of the 405B estimate held 513 142 states, 6 147 of them within the optimum (915 MB of
    its 2 GB peak); the coarse search over a few axes costs a fraction of the prime one.
    """
    src, dst = src.normalized(), dst.normalized()
    matrix = common_matrix(src.device_matrix, dst.device_matrix)
    if matrix is None or not matrix.ndim <= COARSE_FIRST_ABOVE < prime_matrix(matrix).ndim:
        return math.inf
    (space, first), (_, second) = refined(src, matrix, itemsize), refined(dst, matrix, itemsize)
    _, cost, exhaustive = solve_cost(Problem((space,), src.partial_op if src.partial else dst.partial_op), (0, first), (0, second), None)
    return cost if exhaustive else math.inf


def shape_class(src: Layout, dst: Layout, itemsize: int) -> tuple[Layout, Layout, int, int, int] | None:
    """The same redistribution on a smaller tensor whose cheapest plan costs exactly
    ``numerator / denominator`` times less: ``(src', dst', itemsize', numerator, denominator)``,
    or None when the scaling would not be exact.

    Which steps a state allows depends on a dim of size d only through the divisors of
    device_num D dividing it, i.e. through gcd(d, D); so every dim shrinks to that and both
    searches have the same states and steps. Each step sends its group's share of the local
    bytes, which are proportional to element count x itemsize. The share is a whole number of
    bytes (no rounding) when D divides the bytes of the whole tensor; the small tensor's
    itemsize is multiplied by D to make it so there too. Then every plan's bytes, and the
    cheapest, scale by N / (N' D) (element counts N and N').

    Example (a [1024, 4096] float32 weight gathered over 8 devices costs as its [8, 8] class,
    whose itemsize is 32, scaled by 4 194 304 / 512):
        >>> from autostrat.layout import DeviceMatrix, TensorMap
        >>> rows = Layout(DeviceMatrix((8,)), TensorMap((0, -1)), (1024, 4096))
        >>> whole = Layout(DeviceMatrix((8,)), TensorMap((-1, -1)), (1024, 4096))
        >>> small_rows, small_whole, itemsize, numerator, denominator = shape_class(rows, whole, 4)
        >>> small_rows.shape, itemsize, numerator, denominator
        ((8, 8), 32, 4194304, 512)
    """
    devices = src.device_num
    count = math.prod(src.shape)
    if src.shape != dst.shape or count * itemsize % devices:
        return None
    shape = tuple(math.gcd(size, devices) for size in src.shape)
    if shape == src.shape:
        return None  # already the smallest
    small = [replace(layout.normalized(), shape=shape) for layout in (src, dst)]
    return small[0], small[1], itemsize * devices, count, math.prod(shape) * devices


def redistribution_time(src: Layout, dst: Layout, dtype="float32", model=None) -> int:
    """Nanoseconds of the fastest plan from `src` to `dst` under the α–β `model`, without
    building it: the time of the steps `plan_redistribution` gives
    (`RedistributionPlan.nanoseconds`, tested equal), so a cost table of times prices exactly
    the redistributions a plan then carries.

    Example (resolving a partial sum over the 4-axis inside one 8-device server: one ring
    AllReduce sends 6 messages of 2 µs; the same 12 288 bytes go in 4 messages as a
    ReduceScatter, an AllReduce and an AllGather over the two halves of that axis, each step's
    4 096 bytes taking 9.1 ns at 450 GB/s, rounded up):
        >>> from autostrat.cost import Hardware
        >>> from autostrat.layout import DeviceMatrix, TensorMap
        >>> split = Layout(DeviceMatrix((2, 4)), TensorMap((1, -1)), (64, 64))
        >>> model = Hardware().alpha_beta(8)
        >>> redistribution_time(split.with_partial([0]), split, model=model) == 4 * 2000 + 3 * 10
        True
    """
    whole = _resolved_first(src, dst)
    if whole is not None:
        return redistribution_time(src, whole, dtype, model)
    if src.shape != dst.shape:
        check_pair(src, dst)
        return _reshape_route(src.normalized(), dst.normalized(), dtype, model)[2]
    check_pair(src, dst)
    return timed_objective(src, dst, dtype_size(dtype), model)


def plan_redistribution(src: Layout, dst: Layout, dtype="float32", model=None) -> RedistributionPlan:
    """The cheapest plan turning `src` into `dst`, minimal in bytes per device.

    With an `autostrat.cost.AlphaBeta` `model` the plan minimises time instead; `cost` stays the
    plan's bytes per device. Raises `RedistributionError` naming both layouts when the layouts
    describe different tensors or device counts (every other pair has a plan).

    Example (a partial sum the consumer wants split: one ReduceScatter, not AllReduce + slice):
        >>> from autostrat.layout import DeviceMatrix, TensorMap
        >>> src = Layout(DeviceMatrix((2, 4)), TensorMap((1, -1)), (64, 64), partial=(0,))
        >>> plan = plan_redistribution(src, Layout(DeviceMatrix((2, 4)), TensorMap((1, 0)), (64, 64)))
        >>> str(plan), plan.steps[0].groups[0]
        ('ReduceScatter(axes (1, 0) dim 1, 6144B); 6144B', (0, 1, 2, 3))

    Shapes with the same element count are joined by one local Reshape (cost 0):
        >>> rows = Layout(DeviceMatrix((4,)), TensorMap((0, -1)), (8, 6))
        >>> str(plan_redistribution(rows, Layout(DeviceMatrix((4,)), TensorMap((-1,)), (48,))))
        'AllGather(axes (1, 0) dim 0, 144B) -> Reshape([8, 6] -> [48], 0B); 144B'
    """
    whole = _resolved_first(src, dst)
    if whole is not None:
        resolved = plan_redistribution(src, whole, dtype, model)
        return replace(resolved, dst=dst, steps=resolved.steps + (creation_step(whole, dst),))
    if src.shape != dst.shape:
        return _plan_through_reshape(src, dst, dtype, model)
    problem, (path, cost, exhaustive), least = _coarse_plan(src, dst, dtype, model) or timed_solution(src, dst, dtype_size(dtype), model)
    steps = tuple(step for triple in ordered_slices(path) if (step := make_step(problem, *triple)) is not None)
    return RedistributionPlan(src, dst, steps, cost, exhaustive, least)


def _coarse_plan(src: Layout, dst: Layout, dtype, model):
    """``(problem, solution, None)`` of a plan over the coarsest common device matrix, when the prime
    refinement has more than `COARSE_FIRST_ABOVE` axes and the coarse plan costs what the cost
    search over prime axes proves optimal; else None.

    Over 1024 devices a path search through ten prime axes may settle millions of states (and
    fall back to the constructive plan), while the cost search keeps states up to the source's relabellings and
    stays small, and most optimal plans never split a composite axis: one search over the few
    coarse axes finds them. Where the coarse plan costs more, the prime path search decides.
    """
    check_pair(src, dst)
    if model is not None:
        return None
    src, dst = src.normalized(), dst.normalized()
    matrix = common_matrix(src.device_matrix, dst.device_matrix)
    if matrix is None or prime_matrix(matrix).ndim <= COARSE_FIRST_ABOVE:
        return None
    itemsize = dtype_size(dtype)
    (space, first), (_, second) = refined(src, matrix, itemsize), refined(dst, matrix, itemsize)
    problem = Problem((space,), src.partial_op if src.partial else dst.partial_op)
    solution = solve_path(problem, (0, first), (0, second), None)
    if solution is None or not solution[2] or solution[1] != redistribution_cost(src, dst, dtype):
        return None
    return problem, solution, None


def _primes(number: int) -> tuple[int, ...]:
    return prime_matrix(DeviceMatrix((number,))).shape if number > 1 else ()


def _prime_orders(layout: Layout) -> list[DeviceMatrix]:
    """Every device matrix whose axes are the prime factors of `layout`'s device_num, in order."""
    orders = sorted(set(itertools.permutations(_primes(layout.device_num)))) or [(1,)]
    return [DeviceMatrix(order) for order in orders]


def _sub_multiset(wanted: list[int], available: list[int]) -> bool:
    pool = list(available)
    for size in wanted:
        if size not in pool:
            return False
        pool.remove(size)
    return True


def _plan_through_reshape(src: Layout, dst: Layout, dtype, model) -> RedistributionPlan:
    check_pair(src, dst)
    before, after, cost = _reshape_route(src.normalized(), dst.normalized(), dtype, model)
    head, tail = plan_redistribution(src, before, dtype, model), plan_redistribution(after, dst, dtype, model)
    reshape = RedistributionStep("Reshape", (), (), before, after, (), 0)
    steps = head.steps + (reshape,) + tail.steps
    if model is not None:  # the route's cost is a time: the plan's is its bytes
        cost = head.cost + tail.cost
    return RedistributionPlan(src, dst, steps, cost, head.exhaustive and tail.exhaustive)
