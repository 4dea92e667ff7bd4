"""The relabellings a permute can make under an α–β model, grouped by the link of the axes
they move (`permute_links`) and by the classes of child they reach (`bundle_classes`), found
without listing the n! relabellings of n axes of one size where their classes are few
(`first_relabellings`); the relabelling nearest a target's order (`towards_target`); and the
pools of axes a model times alike (`speed_pools`). Memoised: a timed search's permutes meet the
same spaces and states many times (`search.Search._timed_permutes`).
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np

from autostrat.layout import DeviceMatrix
from autostrat.redistribution.moves import State


LISTED_LIMIT = 5_040  # up to this many relabellings (7 axes of one size) classes are found by listing them all
PREFIX_LIMIT = 1_000_000  # prefixes a `first_relabellings` keeps (9 axes of one size pinned: 986 409) before the search gives up


class ClassLimit(Exception):
    """A permute's classes of child are too many to list (`PREFIX_LIMIT`): the search stops as
    at its state limit, and the planner answers with its constructive fallback."""



@lru_cache(maxsize=256)
def permute_links(sizes: tuple[int, ...], matrix: DeviceMatrix, model) -> tuple[tuple[tuple[int, ...], tuple], ...]:
    """The links (`AlphaBeta.link`) a permute of `sizes` may span, which is all its time
    depends on besides its bytes, as ``(moved axes, link)``: the axes the first relabelling of
    that link moves, in the order of their first relabellings (`first_relabellings`).

    Example (three axes of 2; only the outer one crosses the two servers of 4):
        >>> from autostrat.cost import Hardware
        >>> links = permute_links((2, 2, 2), DeviceMatrix((2, 2, 2)), Hardware(devices_per_server=4).alpha_beta(8))
        >>> [moved for moved, _ in links]
        [(1, 2), (0, 1)]
    """
    first = first_relabellings(sizes, _axis_links(sizes, matrix, model), (), (), ())
    found: dict = {}
    for mapping, (link, _) in sorted((mapping, outcome) for outcome, mapping in first.items()):
        found.setdefault(link, tuple(a for a, image in enumerate(mapping) if a != image))
    return tuple((moved, link) for link, moved in found.items())


def _axis_links(sizes, matrix: DeviceMatrix, model) -> tuple:
    return tuple(model.link(matrix, (axis,)) for axis in range(len(sizes)))


def first_relabellings(sizes, links, pools, used, partial, limit: float = math.inf) -> dict | None:
    """``(link, key) -> mapping``: for every link a permute may span and every class of child
    it may reach, the first relabelling (in lexicographic order of ``mapping``, new axis per old
    axis, the identity left out) that does, for states whose dims list the axes `used` in
    order and whose partial axes are `partial` (the key as in `bundle_classes`).

    The relabellings are n! over n axes of one size; where axes share roles their classes are
    few. So the mappings are built axis by axis in lexicographic order, and a prefix is dropped
    when an earlier one of the same length left the same remainder: the same kinds (pool, or
    the axis itself outside pools) on the dims' roles assigned so far, in order, and the same
    sorted kinds on the partial roles (a pool's partial axes show in a key by their count
    alone, `_class_key`); the same link so far; and the same free images, where an image shows
    by its kind unless its own axis is still to come and could stay put, moving the link
    (`_remainder`). Every completion of one prefix completes the other, reaching the same class
    over the same link, and the earlier prefix's is the earlier relabelling; so each class's
    first relabelling is kept, and the work grows with the classes, not the relabellings. A
    link over moved axes is the slowest of theirs (the greatest latency and the least
    bandwidth: `AlphaBeta.link`), so it is kept as that pair over the prefix's moved axes
    (`links`, per axis). Where the target pins every axis in a distinct role the classes are
    the relabellings themselves: past `limit` prefixes the answer is None.
    """
    count, pool_of = len(sizes), {}
    for index, pool in enumerate(pools):
        pool_of.update((axis, index) for axis in pool)
    slot = {axis: index for index, axis in enumerate(used)}
    # An image shows in a key by its kind: its pool, or itself outside pools.
    kind_of = [pool_of.get(axis, len(pools) + axis) for axis in range(count)]
    # From each axis on: an image no later role of its size can take is known by its size alone.
    kinds = [[kind_of[image] if any(sizes[a] == sizes[image] for a in range(below, count) if a in slot or a in partial)
              else -sizes[image] for image in range(count)] for below in range(count + 1)]
    found, seen, mapping = {}, set(), [0] * count

    def extend(axis: int, free: int, roles: tuple, gathered: tuple, link) -> None:
        if axis == count:
            if link is not None:  # the identity is no permute
                found.setdefault((link, _class_key(pools, pool_of, mapping, used, partial)), tuple(mapping))
            return
        for image in range(count):
            if not free >> image & 1 or sizes[image] != sizes[axis]:
                continue
            role, kept = roles, gathered
            if axis in slot:
                role = roles + (kind_of[image],)
            elif axis in partial:
                kept = tuple(sorted(gathered + (kind_of[image],)))
            moved = link if image == axis else _slower(link, links[axis])
            left = free & ~(1 << image)
            key = (axis + 1, *_remainder(left, axis + 1, kinds[axis + 1], links, moved), role, kept, moved)
            if key in seen or len(seen) > limit:
                continue
            seen.add(key)
            mapping[axis] = image
            extend(axis + 1, left, role, kept, moved)

    extend(0, (1 << count) - 1, (), (), None)
    return None if len(seen) > limit else found


def listed_rows(sizes, links, pools, used, partial) -> tuple[np.ndarray, ...]:
    """`first_relabellings` by listing every relabelling at once (numpy), faster where they are
    few and most are classes of their own (six axes of one size, each pinned by the target:
    720): per class of child but the state's own, in the order of its first relabelling, the
    rows ``(mapping, child's axes, key, link)`` of that relabelling.

    Example (two axes of 2, a dim split over axis 0: the one relabelling hands it to axis 1):
        >>> [rows.tolist() for rows in listed_rows((2, 2), ((2e-06, 4.5e11), (2e-06, 4.5e11)), (), (0,), ())]
        [[[1, 0]], [[1]], [[1]], [[2e-06, 450000000000.0]]]
    """
    mappings = _every_relabelling(sizes)  # lexicographic: the identity, no permute, is first
    images = np.concatenate([mappings[:, list(used)], np.sort(mappings[:, list(partial)], axis=1)], axis=1)
    keys = images
    for pool in pools:  # rename each pool's axes to its ids in order of appearance
        inside = np.isin(keys, pool)
        rank = np.minimum(np.maximum(np.cumsum(inside, axis=1) - 1, 0), len(pool) - 1)
        keys = np.where(inside, np.array(pool)[rank], keys)
    keys[:, len(used):] = np.sort(keys[:, len(used):], axis=1)
    moved = mappings != np.arange(len(sizes))
    # A link as the ranks of its latency and bandwidth among the axes': integers, like the keys.
    latency, bandwidth = (np.unique([link[part] for link in links], return_inverse=True) for part in (0, 1))
    slowest = np.stack([np.where(moved, latency[1], -1).max(axis=1), np.where(moved, bandwidth[1], len(links)).min(axis=1)], axis=1)
    codes = np.ascontiguousarray(np.concatenate([keys, slowest], axis=1)[1:])
    _, first = np.unique(codes.view(np.dtype((np.void, codes.itemsize * codes.shape[1]))).ravel(), return_index=True)
    rows = np.sort(first) + 1
    rows = rows[(keys[rows] != keys[0]).any(axis=1)]  # the state's own class is no child
    link = np.stack([latency[0][slowest[rows, 0]], bandwidth[0][slowest[rows, 1]]], axis=1)
    return mappings[rows], images[rows], keys[rows], link


@lru_cache(maxsize=64)
def _every_relabelling(sizes: tuple[int, ...]) -> np.ndarray:
    """Every map of axes onto axes of equal size, in lexicographic order (rows; identity first)."""
    found = [()]
    for axis in range(len(sizes)):
        found = [m + (b,) for m in found for b in range(len(sizes)) if sizes[b] == sizes[axis] and b not in m]
    return np.array(found, dtype=np.int64).reshape(len(found), len(sizes))


def _remainder(free: int, below: int, kind_of, links, link) -> tuple[int, tuple[int, ...]]:
    """What the free images decide for the axes from `below` on: an image below it will be some
    later axis's, moving that axis, and only its kind (pool, or itself) shows in a key; so does
    an image whose own axis is on a link the moved axes span already (whether it stays moves
    the link no more). The others are kept by id: ``(their mask, the sorted kinds of the rest)``."""
    exact, kinds = 0, []
    for image in range(len(kind_of)):
        if free >> image & 1:
            if image >= below and (link is None or _slower(link, links[image]) != link):
                exact |= 1 << image
            else:
                kinds.append(kind_of[image])
    return exact, tuple(sorted(kinds))


def _slower(link, other):
    """The link of two sets of axes together: the greater latency, the lesser bandwidth."""
    return other if link is None else (max(link[0], other[0]), min(link[1], other[1]))


def _class_key(pools, pool_of, mapping, used, partial) -> tuple[int, ...]:
    """The axes of the child's representative (`moves.pool_canonical`): the images of `used` in
    order, then of `partial` sorted, each pool's axes renamed to the pool's ids in order of
    appearance, the partial ones sorted again. So a pool's partial images show only by their
    count (they take the pool's next ids), and the key is the class."""
    images = [mapping[axis] for axis in used] + sorted(mapping[axis] for axis in partial)
    counts = [0] * len(pools)
    key = []
    for image in images:
        index = pool_of.get(image)
        if index is None:
            key.append(image)
        else:
            key.append(pools[index][counts[index]])
            counts[index] += 1
    return tuple(key[: len(used)]) + tuple(sorted(key[len(used) :]))


@lru_cache(maxsize=256)  # each up to LISTED_LIMIT rows of a few axes: under 1 MB
def _class_rows(sizes, matrix, model, pools, used: tuple[int, ...], partial: tuple[int, ...]) -> tuple[np.ndarray, ...] | None:
    """`listed_rows` where the relabellings are few, else the same rows from
    `first_relabellings` (None past `PREFIX_LIMIT`, remembered as such)."""
    links = _axis_links(sizes, matrix, model)
    if math.prod(math.factorial(sizes.count(size)) for size in set(sizes)) <= LISTED_LIMIT:
        return listed_rows(sizes, links, pools, used, partial)
    first = first_relabellings(sizes, links, pools, used, partial, PREFIX_LIMIT)
    if first is None:
        return None
    pool_of = {axis: index for index, pool in enumerate(pools) for axis in pool}
    own = _class_key(pools, pool_of, tuple(range(len(sizes))), used, partial)
    rows = [(mapping, [mapping[axis] for axis in used] + sorted(mapping[axis] for axis in partial), key, link)
            for (link, key), mapping in sorted(first.items(), key=lambda item: item[1]) if key != own]
    width = len(used) + len(partial)
    shapes = ((len(sizes),), (width,), (width,), (2,))
    return tuple(np.array([row[part] for row in rows], dtype=np.int64 if part < 3 else np.float64).reshape(len(rows), *shapes[part])
                 for part in range(4))


@lru_cache(maxsize=1 << 12)
def bundle_classes(sizes, matrix, model, index: int, pools, used: tuple[int, ...], partial: tuple[int, ...]) -> tuple[tuple, ...]:
    """``(mapping, moved axes, child's axes, representative's axes)`` for the relabellings of
    one bundle (`permute_links`) that reach distinct classes of child (up to relabellings
    within `pools`) other than the state's own, each the first of its class in the bundle's
    order, for states whose dims list the axes `used` in order and whose partial axes are
    `partial`: all the classes depend on (many states share them, hence the memo). The axes are listed as `used` then the partial ones
    (`search.Search._bundle_edges` cuts them into dims).

    A child's representative (`moves.pool_canonical`) lists the images of `used` in order, then
    those of `partial` sorted, each pool's axes renamed to the pool's ids in order of appearance;
    that sequence is the class's key (`first_relabellings` finds each key's first relabelling).

    Example (three axes of 2 in one link, one pool (1, 2); a state splitting a dim over axis 0:
    the children put that role on axis 1 or 2, one class):
        >>> from autostrat.cost import Hardware
        >>> model = Hardware(devices_per_server=8).alpha_beta(8)
        >>> [found[0] for found in bundle_classes((2, 2, 2), DeviceMatrix((2, 2, 2)), model, 0, ((1, 2),), (0,), ())]
        [(1, 0, 2)]
    """
    link = permute_links(sizes, matrix, model)[index][1]
    rows = _class_rows(sizes, matrix, model, pools, used, partial)
    if rows is None:
        raise ClassLimit(f"over {PREFIX_LIMIT} prefixes of relabellings of {sizes} for dims over {used}, partial {partial}")
    mappings, images, keys, links = rows
    chosen = (links[:, 0] == link[0]) & (links[:, 1] == link[1])
    found = []
    for mapping, image, key in zip(mappings[chosen].tolist(), images[chosen].tolist(), keys[chosen].tolist()):
        found.append((tuple(mapping), tuple(a for a, target in enumerate(mapping) if a != target), image, key))
    return tuple(found)


def conjugated(mapping, back) -> tuple[int, ...]:
    """A relabelling of representative axes (`mapping`) as one of the real axes `back` names."""
    real = [0] * len(mapping)
    for axis, image in enumerate(mapping):
        real[back[axis]] = back[image]
    return tuple(real)


def speed_pools(matrix: DeviceMatrix, model, pools) -> tuple[tuple[int, ...], ...]:
    """`pools` split into axes the α–β `model` times alike on `matrix` (equal latency and
    bandwidth): swapping two of them changes no step's time, since a step is timed on the
    slowest link its axes span."""
    found = []
    for pool in pools:
        classes: dict = {}
        for axis in pool:
            classes.setdefault(model.link(matrix, (axis,)), []).append(axis)
        found += [tuple(axes) for axes in classes.values() if len(axes) > 1]
    return tuple(found)


def towards_target(sizes: tuple[int, ...], state: State, target: State) -> tuple[int, ...]:
    """The relabelling of `state` nearest `target`'s order (new axis per old axis): each dim's
    axes, major first, onto the target's axes of that dim while their sizes agree; partial axes
    onto the target's partial axes of their size; every other axis onto itself where that is
    free, else onto the lowest free axis of its size. A permute to it is often the whole plan
    (a split handed from one axis to another of its size) or its first step, so a timed search
    tries it before the classes of its bundle (`search.Search._towards`).

    Example (rows over axis 2 to rows over axis 0 of three axes of 2; axis 1 stays put):
        >>> towards_target((2, 2, 2), (((2,), ()), ()), (((0,), ()), ()))
        (2, 1, 0)
    """
    mapping: list = [None] * len(sizes)
    taken: set = set()

    def assign(axis: int, image: int) -> bool:
        if mapping[axis] is not None or image in taken or sizes[axis] != sizes[image]:
            return False
        mapping[axis] = image
        taken.add(image)
        return True

    for entry, wanted in zip(state[0], target[0]):
        for axis, image in zip(entry, wanted):
            if not assign(axis, image):
                break
    for axis in state[1]:
        next((image for image in target[1] if assign(axis, image)), None)
    for axis in range(len(sizes)):
        assign(axis, axis)
    for axis in range(len(sizes)):
        if mapping[axis] is None:
            next(image for image in range(len(sizes)) if assign(axis, image))
    return tuple(mapping)


def mapping_link(sizes, matrix: DeviceMatrix, model, mapping) -> tuple | None:
    """The link a permute by `mapping` spans (the slowest of its moved axes'), None for the identity."""
    link = None
    for axis, (image, axis_link) in enumerate(zip(mapping, _axis_links(sizes, matrix, model))):
        if image != axis:
            link = _slower(link, axis_link)
    return link
