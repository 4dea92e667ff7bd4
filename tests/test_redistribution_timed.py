"""The timed search's bound (`timed.TimedBound`) towards partial destinations, against brute force.

Towards a partial destination the bound counts what the state's shadow (partial axes made free)
must still import into each server and the sources its ranks must still hear from
(`heuristic.ImportBound`, `heuristic.ReceiveBound.sources`); both must stay below the
brute-force fastest time from every state, and the planner must still meet it.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from autostrat.cost import Hardware
from autostrat.layout import DeviceMatrix, Layout, TensorMap
from autostrat.redistribution import plan_redistribution, redistribution_time
from autostrat.redistribution import relabellings
from autostrat.redistribution.moves import Space, fixing_pools, pool_canonical, relabel
from autostrat.redistribution.memo import clear_memos
from autostrat.redistribution.relabellings import bundle_classes, permute_links, speed_pools
from autostrat.redistribution.timed import matrix_of, timed_bound
from tests.redistribution_oracle import INF, all_layouts, layout_of, oracle_time, oracle_times, states


@pytest.mark.parametrize("per_server, shape", [(2, (8, 4)), (4, (8, 4)), (4, (1 << 12, 1 << 8))])
def test_the_timed_bound_towards_partial_targets_is_admissible(per_server, shape):
    # Every state of [2, 2, 2] to every partial target: bound <= the brute-force fastest time.
    model = Hardware(devices_per_server=per_server).alpha_beta(8)
    space = Space((2, 2, 2), shape, 4)
    every = states(space.sizes, space.shape)
    targets = [(target, timed_bound(space, target, matrix_of(space.sizes), model), layout_of(space.sizes, shape, "sum", target))
               for target in every if target[1]]
    checked = 0
    for state in every:
        fastest = oracle_times(layout_of(space.sizes, shape, "sum", state), model)
        for target, bound, dst in targets:
            time = fastest(dst)
            assert bound(state) <= time, (state, target)
            checked += time < INF
    assert checked > len(every)


def test_the_import_bound_counts_a_partial_target_that_must_cross_servers():
    # Rows split across the two servers of 4, a partial sum of 4 inside each, wanted as columns
    # split across them with the same partial sum: the shadow lacks half of its 2 MiB target
    # slice in each server, 1 MiB per server, 256 KiB per device. (Not once per contribution:
    # a plan may all-reduce inside the servers, move once and create the contributions again.)
    # The fastest plan is still the one AllToAll across the servers.
    model = Hardware(devices_per_server=4).alpha_beta(8)
    space = Space((2, 2, 2), (1 << 12, 1 << 8), 4)
    start, target = (((2,), ()), (0, 1)), (((), (2,)), (0, 1))
    bound = timed_bound(space, target, matrix_of(space.sizes), model)
    assert bound.imports(start) == 1 << 18 and bound.receive(start) == 1 << 20
    assert bound.receive.sources(start) == 2
    dst = layout_of(space.sizes, space.shape, "sum", target)
    assert 0 < bound(start) < oracle_time(layout_of(space.sizes, space.shape, "sum", start), dst, model) == 24972


def test_states_with_fewer_contributions_than_a_partial_target_are_bounded_below_their_time():
    # Towards 4 contributions (partial over axes 0 and 1): 8 reduce to them, 2 (over axis 2) or 1
    # (whole) become 4 by a free PartialCreate (once "unreachable"). Every bound is finite and at
    # most the brute-force fastest time. Axis 2 must be reduced (T/N = 16 bytes) or permuted:
    # the receive bound sees it, the size bound (contributions only) does not.
    model = Hardware(devices_per_server=4).alpha_beta(8)
    space = Space((2, 2, 2), (8, 4), 4)
    target = (((), ()), (0, 1))
    bound = timed_bound(space, target, matrix_of(space.sizes), model)
    dst = layout_of(space.sizes, space.shape, "sum", target)
    fewer, more, whole = (((), ()), (2,)), (((), ()), (0, 1, 2)), (((2,), ()), ())
    for state, receive, sized, fastest in ((fewer, 16, 0, 4003), (more, 64, 64, 8003), (whole, 64, 64, 4002)):
        assert (bound.receive(state), bound.receive.size_bound(state)) == (receive, sized)
        assert bound(state) <= oracle_time(layout_of(space.sizes, space.shape, "sum", state), dst, model) == fastest


@pytest.mark.parametrize("device_num, per_server, shape", [(4, 2, (4, 4)), (8, 4, (8,)), (8, 2, (1 << 19,)),
                                                           (4, 2, (512, 1024))])
def test_the_time_planner_is_the_brute_force_fastest_to_partial_targets(device_num, per_server, shape):
    model = Hardware(devices_per_server=per_server).alpha_beta(device_num)
    layouts = all_layouts(device_num, shape)
    compared = 0
    for src, dst in itertools.product(layouts, [layout for layout in layouts if layout.partial]):
        fastest = oracle_time(src, dst, model)
        if fastest is None or fastest == INF:  # no common prime matrix, or partial values the source lacks
            continue
        assert redistribution_time(src, dst, model=model) == fastest, (str(src), str(dst))
        assert plan_redistribution(src, dst, model=model).nanoseconds(model) == fastest, (str(src), str(dst))
        compared += 1
    assert compared > len(layouts)


def test_a_memo_forgetting_its_expanded_states_finds_the_same_timed_plans(monkeypatch):
    # The expanded-state memo is bounded (`layers.EXPANDED_LIMIT`, `memo.BoundedMemo`): starting
    # it over, even every few states and mid-search, must not change a plan.
    from autostrat.redistribution import layers
    from autostrat.redistribution.memo import BoundedMemo, clear_memos

    model = Hardware(devices_per_server=4).alpha_beta(8)
    layouts = all_layouts(8, (8, 4))[::9]
    pairs = [(src, dst) for src in layouts for dst in layouts if not dst.partial]
    clear_memos()
    texts = [plan_redistribution(src, dst, model=model).to_text() for src, dst in pairs]
    forgotten = []
    monkeypatch.setattr(layers, "EXPANDED_LIMIT", 3)
    monkeypatch.setattr(BoundedMemo, "clear", lambda memo: forgotten.append(len(memo)) or dict.clear(memo))
    clear_memos()  # `expansions` makes its memos anew, with the small limit
    assert [plan_redistribution(src, dst, model=model).to_text() for src, dst in pairs] == texts
    assert len(forgotten) > len(pairs) > 20
    clear_memos()


def test_the_oracle_from_one_source_agrees_with_the_oracle_of_each_pair():
    # `oracle_times` (one Dijkstra to every destination) against `oracle_time` (one per pair).
    model = Hardware(devices_per_server=2).alpha_beta(4)
    layouts = all_layouts(4, (4, 2))
    times = [oracle_times(src, model) for src in layouts]
    pairs = [(fastest(dst), oracle_time(src, dst, model)) for src, fastest in zip(layouts, times) for dst in layouts]
    assert all(many == one for many, one in pairs)
    assert all(one < INF for _, one in pairs) and len(pairs) == len(layouts) ** 2  # a PartialCreate reaches every partial target


def _brute_force_permutes(sizes, matrix, model, pools, state):
    """Every relabelling in lexicographic order (itertools), the identity left out: the first
    moved axes per link, and per link the first relabelling reaching each class of child
    (`pool_canonical` of the relabelled state) other than the state's own."""
    count = len(sizes)
    own = pool_canonical(pools, count, state)[0]
    links, classes = {}, {}
    for mapping in itertools.permutations(range(count)):
        if mapping == tuple(range(count)) or any(sizes[image] != sizes[axis] for axis, image in enumerate(mapping)):
            continue
        moved = tuple(axis for axis, image in enumerate(mapping) if axis != image)
        link = model.link(matrix, moved)
        links.setdefault(link, moved)
        child = pool_canonical(pools, count, relabel(state, mapping))[0]
        if child != own:
            classes.setdefault(link, {}).setdefault(child, (mapping, relabel(state, mapping)))
    return links, classes


@pytest.mark.parametrize("listed_limit", [0, relabellings.LISTED_LIMIT])
@pytest.mark.parametrize("sizes, per_server", [((2, 2, 2, 2, 2), 4), ((2, 2, 2, 2, 2, 2), 8), ((2, 2, 2, 2, 2, 2), 2),
                                               ((3, 2, 2, 3, 2), 6)])
def test_permute_classes_are_those_of_every_relabelling(monkeypatch, sizes, per_server, listed_limit):
    # The timed search's permute children (`relabellings.bundle_classes`: by `first_relabellings`, which
    # lists no relabelling, or by listing them, `listed_rows`) against every relabelling: the
    # same links, the same classes of child in the same order, each reached by the same first
    # relabelling, cut into the same child.
    monkeypatch.setattr(relabellings, "LISTED_LIMIT", listed_limit)
    clear_memos()
    model = Hardware(devices_per_server=per_server).alpha_beta(math.prod(sizes))
    matrix = matrix_of(sizes)
    every = states(sizes, (8, 12, 6))
    rng = np.random.default_rng(len(every))
    links = permute_links(sizes, matrix, model)
    compared = 0
    for pick in rng.choice(len(every), size=16, replace=False):
        state, target = every[pick], every[rng.integers(len(every))]
        pools = speed_pools(matrix, model, fixing_pools(sizes, target))
        first_moved, classes = _brute_force_permutes(sizes, matrix, model, pools, state)
        assert [(moved, link) for link, moved in first_moved.items()] == list(links)
        used = tuple(axis for entry in state[0] for axis in entry)
        for index, (_, link) in enumerate(links):
            found = bundle_classes(sizes, matrix, model, index, pools, used, state[1])
            expected = classes.get(link, {})
            assert [entry[0] for entry in found] == [mapping for mapping, _ in expected.values()]
            assert [entry[3] for entry in found] == [list(_axes(key)) for key in expected]
            assert [entry[2] for entry in found] == [list(_axes(child)) for _, child in expected.values()]
            compared += len(found)
    clear_memos()
    assert compared > 50


def _axes(state) -> tuple[int, ...]:
    return tuple(axis for entry in state[0] for axis in entry) + tuple(state[1])


def _without_target_order(monkeypatch):
    """The timed search before `Search._towards`: a popped bundle lists every class of child at
    once, its key the size bound alone (the slow exact path)."""
    from autostrat.redistribution import search

    def rest_only(self, bundle):
        return (((*bundle, True), 0, 0, search.split_signature(self.problem.space(bundle[0]), bundle[1]), None),)

    monkeypatch.setattr(search.Search, "_towards", rest_only)
    monkeypatch.setattr(search.Search, "_rest_bound", lambda self, rest: 0)


@pytest.mark.parametrize("device_num, per_server, shape", [(8, 4, (8, 4)), (8, 2, (8, 4)), (16, 4, (16, 4))])
def test_permutes_towards_the_target_first_time_plans_as_listing_every_class(monkeypatch, device_num, per_server, shape):
    model = Hardware(devices_per_server=per_server).alpha_beta(device_num)
    layouts = all_layouts(device_num, shape, with_partial=device_num == 8)[::3]
    pairs = [(src, dst) for src in layouts for dst in layouts]
    clear_memos()
    fast = [redistribution_time(src, dst, model=model) for src, dst in pairs]
    clear_memos()
    with monkeypatch.context() as patched:
        _without_target_order(patched)
        slow = [redistribution_time(src, dst, model=model) for src, dst in pairs]
    clear_memos()
    assert fast == slow and len(pairs) > 200


def test_a_split_handed_to_an_axis_of_its_size_across_servers_lists_no_class(monkeypatch):
    # The target pins every one of ten prime axes of 2 in its own role: the classes of a permute
    # are its 10! relabellings. The relabelling towards the target reaches it in one permute
    # across servers, and the rest on the fast link is bounded above that by what each server
    # must import, so no class is listed.
    matrix = DeviceMatrix((8, 16, 8))
    src, dst = (Layout(matrix, TensorMap(entries), (1024, 1024)) for entries in ((2, 1), (0, 1)))
    model = Hardware().alpha_beta(1024)
    clear_memos()
    for name in ("listed_rows", "first_relabellings"):  # `permute_links` lists stateless classes: a few
        listing = getattr(relabellings, name)
        monkeypatch.setattr(relabellings, name, lambda *args, listing=listing: pytest.fail("a bundle listed its classes") if args[3] else listing(*args))
    plan = plan_redistribution(src, dst, model=model)
    local = 1024 * 1024 * 4 // 128
    alpha, beta = Hardware().link(across_servers=True)
    assert [step.kind for step in plan.steps] == ["CollectivePermute"] and plan.exhaustive
    assert plan.nanoseconds(model) == round(alpha * 1e9) + math.ceil(local * 1e9 / beta)
    clear_memos()


@pytest.mark.parametrize("sizes, per_server, shape", [((2, 2, 2), 4, (8, 4)), ((2, 2, 3), 4, (4, 6)), ((2, 2, 2, 2), 4, (4, 4))])
def test_the_bound_of_a_rest_on_the_fastest_link_is_below_every_childs(sizes, per_server, shape):
    # `fast_relabellings(state)` must lie below the bound of every relabelling of `state` that
    # moves only the fastest axes (the children of a bundle's rest), for every state and target.
    model = Hardware(devices_per_server=per_server).alpha_beta(math.prod(sizes))
    space, matrix = Space(sizes, shape, 4), matrix_of(sizes)
    fastest = max(model.link(matrix, (axis,))[1] for axis in range(len(sizes)))
    fast = [mapping for mapping in itertools.permutations(range(len(sizes)))
            if all(model.link(matrix, (axis,))[1] == fastest for axis, image in enumerate(mapping) if image != axis)]
    every = states(sizes, shape)
    positive = 0
    for target in every[::2]:
        bound = timed_bound(space, target, matrix, model)
        for state in every:
            below = bound.fast_relabellings(state)
            assert below <= min(bound(relabel(state, mapping)) for mapping in fast), (state, target)
            positive += below > 0
    assert len(fast) > 1 and positive > len(every)
