"""Tensor maps and layouts: which slice of a tensor every rank holds.

A tensor map gives, per tensor dim, the device axes (counted from the right, MindSpore's
convention) that split it, major axis first; ``-1`` means the dim is not split. MindSpore writes
one axis per dim; a tuple of axes per dim is the generalisation that lets a dim be split over
several device axes, which redistribution needs once two device matrices are refined to a common
one (``[8]`` seen as ``[2, 4]`` splits a dim over both axes).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace
from functools import cache, lru_cache

import numpy as np

from autostrat.errors import LayoutError
from autostrat.layout.device_matrix import DeviceMatrix

PARTIAL_OPS = ("max", "min", "sum")


def _entry(value) -> tuple[int, ...]:
    """One tensor-map entry in canonical form: a tuple of device axes, () when not split."""
    if isinstance(value, bool):
        raise LayoutError(f"a tensor map entry is -1, a device axis or a tuple of axes, got {value!r}")
    if isinstance(value, int):
        if value < -1:
            raise LayoutError(f"a tensor map entry is -1 or a device axis >= 0, got {value}")
        return () if value == -1 else (value,)
    if isinstance(value, (tuple, list)) and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value):
        return tuple(value)
    raise LayoutError(f"a tensor map entry is -1, a device axis or a tuple of axes, got {value!r}")


def _format_entry(entry: tuple[int, ...]) -> str:
    if not entry:
        return "-1"
    if len(entry) == 1:
        return str(entry[0])
    return "(" + ", ".join(str(axis) for axis in entry) + ")"


def format_tuple(items) -> str:
    """Python tuple syntax for already formatted items: ``(a,)`` for one, ``(a, b)`` for more."""
    items = list(items)
    return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"


@dataclass(frozen=True)
class TensorMap:
    """Per tensor dim, the device axes splitting it (counted from the right).

    Example:
        >>> TensorMap((1, -1)).entries
        ((1,), ())
        >>> str(TensorMap(((1, 0), -1)))
        '((1, 0), -1)'
    """

    entries: tuple[tuple[int, ...], ...]

    def __post_init__(self) -> None:
        if not isinstance(self.entries, (tuple, list)):
            raise LayoutError(f"a tensor map is a tuple with one entry per tensor dim, got {self.entries!r}")
        entries = tuple(_entry(value) for value in self.entries)
        used = [axis for entry in entries for axis in entry]
        if len(used) != len(set(used)):
            raise LayoutError(f"tensor map {self.entries!r} uses a device axis for more than one dim")
        object.__setattr__(self, "entries", entries)

    @property
    def axes(self) -> frozenset[int]:
        """Every device axis the map uses."""
        return frozenset(axis for entry in self.entries for axis in entry)

    def __len__(self) -> int:
        return len(self.entries)

    def __str__(self) -> str:
        return format_tuple(_format_entry(entry) for entry in self.entries)


@dataclass(frozen=True)
class Layout:
    """How a tensor of global `shape` is distributed over a device matrix.

    `partial` lists the device axes over which the ranks hold partial values: the true tensor is
    the `partial_op` ("sum", "max" or "min") of the slices along those axes.

    Example (MindSpore's MatMul weight, strategy ``((2, 1), (1, 4))`` on 8 devices):
        >>> w = Layout(DeviceMatrix((2, 1, 4)), TensorMap((1, 0)), (784, 64))
        >>> w.slice_shape, w.slice_range(1), w.slice_range(4)
        ((784, 16), ((0, 784), (16, 32)), ((0, 784), (0, 16)))
        >>> w.replica_groups()[0]
        (0, 4)
        >>> str(w.normalized())
        '[784, 64] dm[2, 4] tm(-1, 0)'
    """

    device_matrix: DeviceMatrix
    tensor_map: TensorMap
    shape: tuple[int, ...]
    partial: tuple[int, ...] = ()
    partial_op: str = "sum"
    _parts: tuple[int, ...] = field(init=False, repr=False, compare=False)
    # Read for every candidate's bytes and every redistribution state: stored once, not rebuilt
    # per read (it was the search's most called property).
    _slice: tuple[int, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.device_matrix, DeviceMatrix):
            object.__setattr__(self, "device_matrix", DeviceMatrix(tuple(self.device_matrix)))
        if not isinstance(self.tensor_map, TensorMap):
            object.__setattr__(self, "tensor_map", TensorMap(tuple(self.tensor_map)))
        object.__setattr__(self, "shape", tuple(int(size) for size in self.shape))
        object.__setattr__(self, "partial", tuple(sorted(set(self.partial))))
        parts = self._validate()
        object.__setattr__(self, "_parts", parts)
        object.__setattr__(self, "_slice", tuple(size // count for size, count in zip(self.shape, parts)))

    def __hash__(self) -> int:
        # Remembered: propagation asks sets and memos about the same layouts millions of times
        # (DeepSeek-V3's estimate: 3.5 M hashes, each through the nested matrix and map).
        return remembered_hash(self)

    def __getstate__(self) -> dict:
        return without_hash(self)

    def _validate(self) -> tuple[int, ...]:
        """Into how many parts each dim is split; a `LayoutError` for a layout that cannot be."""
        matrix, entries = self.device_matrix, self.tensor_map.entries
        if len(entries) != len(self.shape):
            raise LayoutError(
                f"tensor map {self.tensor_map} has {len(entries)} entries but the tensor has "
                f"{len(self.shape)} dims (shape {list(self.shape)})"
            )
        for axis in sorted(self.tensor_map.axes | set(self.partial)):
            matrix.position(axis)  # raises for an axis outside the device matrix
        if set(self.partial) & self.tensor_map.axes:
            raise LayoutError(f"partial axes {self.partial} are also used by tensor map {self.tensor_map}")
        if self.partial_op not in PARTIAL_OPS:
            raise LayoutError(f"partial_op must be one of {PARTIAL_OPS}, got {self.partial_op!r}")
        parts = tuple(math.prod(matrix.axis_size(axis) for axis in entry) for entry in entries)
        for dim, (size, count) in enumerate(zip(self.shape, parts)):
            if size % count:
                raise LayoutError(
                    f"dim {dim} of size {size} cannot be split evenly into {count} parts "
                    f"(shape {list(self.shape)}, device matrix {matrix}, tensor map {self.tensor_map})"
                )
        return parts

    @property
    def device_num(self) -> int:
        return self.device_matrix.device_num

    @property
    def parts(self) -> tuple[int, ...]:
        """Into how many parts each dim is split."""
        return self._parts

    @property
    def slice_shape(self) -> tuple[int, ...]:
        return self._slice

    def shard_index(self, rank: int) -> tuple[int, ...]:
        """Per dim, which of its parts the rank holds (its axes combined major first)."""
        if not 0 <= rank < self.device_num:
            self.device_matrix.coordinate(rank)  # raises, naming the matrix
        return tuple(self.dim_shards(dim)[rank] for dim in range(len(self.shape)))

    def dim_shards(self, dim: int) -> tuple[int, ...]:
        """Per rank, which part of `dim` it holds (what `shard_index` gives for that dim, for
        every rank at once: ordering a group of a thousand ranks asks for each of them).

        Example:
            >>> Layout(DeviceMatrix((2, 2)), TensorMap((0, -1)), (4, 4)).dim_shards(0)
            (0, 1, 0, 1)
        """
        matrix = self.device_matrix
        return _dim_shards(matrix.shape, tuple(matrix.position(axis) for axis in self.tensor_map.entries[dim]))

    def slice_range(self, rank: int) -> tuple[tuple[int, int], ...]:
        """Per dim, the ``(start, stop)`` index range of the global tensor the rank holds."""
        return tuple(
            (shard * size, (shard + 1) * size) for shard, size in zip(self.shard_index(rank), self.slice_shape)
        )

    def replica_groups(self) -> tuple[tuple[int, ...], ...]:
        """Groups of ranks holding identical slices (they differ only on unused axes)."""
        used = self.tensor_map.axes | set(self.partial)
        return self.device_matrix.groups(a for a in range(self.device_matrix.ndim) if a not in used)

    def partial_groups(self) -> tuple[tuple[int, ...], ...]:
        """Groups of ranks whose slices combine (by `partial_op`) into the true value."""
        return self.device_matrix.groups(self.partial)

    def with_partial(self, axes=(), op: str = "sum") -> Layout:
        return replace(self, partial=tuple(axes), partial_op=op)

    def normalized(self) -> Layout:
        """The canonical equivalent layout: size-1 device axes dropped, and adjacent axes that
        always act together (both unused, both partial, or consecutive in one dim's entry)
        merged into one. Two layouts give every rank the same slice iff their normal forms are equal.
        """
        # Cached on the instance, and across equal instances: searches build the same layouts
        # anew and ask each for its normal form (planning the GPT sample: 2 657 asked, 986 distinct).
        normal = self.__dict__.get("_normal")
        if normal is None:
            normal = normal_form(self)
            object.__setattr__(self, "_normal", normal)
        return normal

    def equivalent(self, other: Layout) -> bool:
        return self.normalized() == other.normalized()

    def __str__(self) -> str:
        text = f"{list(self.shape)} dm{self.device_matrix} tm{self.tensor_map}"
        if self.partial:
            op = "" if self.partial_op == "sum" else f"{self.partial_op} "
            text += f" partial({op}{', '.join(str(a) for a in self.partial)})"
        return text


def _axis_roles(layout: Layout) -> list[tuple]:
    """Per device-matrix position (left to right): what the axis does in the layout."""
    matrix = layout.device_matrix
    roles: list[tuple] = [("free",)] * matrix.ndim
    for dim, entry in enumerate(layout.tensor_map.entries):
        # Count order only over axes of size > 1: a size-1 axis between two others is dropped.
        split = [axis for axis in entry if matrix.axis_size(axis) > 1]
        for order, axis in enumerate(split):
            roles[matrix.position(axis)] = ("dim", dim, order)
    for axis in layout.partial:
        roles[matrix.position(axis)] = ("partial",)
    return roles


def _continues(previous: tuple, role: tuple) -> bool:
    if role[0] != previous[0]:
        return False
    if role[0] == "dim":
        return role[1] == previous[1] and role[2] == previous[2] + 1
    return True


def remembered_hash(instance, compute=None) -> int:
    """The hash of `instance`, computed once (by `compute(instance)`; by default the hash a frozen
    dataclass would have, its compared fields') and kept in its ``__dict__``; with `without_hash`
    as its ``__getstate__``, since a string's hash differs between processes and a pickled one
    would file the object under the wrong bucket of a worker's memos.

    Example:
        >>> rows = Layout(DeviceMatrix((4,)), TensorMap((0, -1)), (4, 12))
        >>> remembered_hash(rows) == hash((rows.device_matrix, rows.tensor_map, rows.shape, (), "sum")) == hash(rows)
        True
    """
    found = instance.__dict__.get("_hash")
    if found is None:
        found = compute(instance) if compute else hash(tuple(getattr(instance, one.name) for one in fields(instance) if one.compare))
        instance.__dict__["_hash"] = found  # past a frozen dataclass's __setattr__, as `object.__setattr__` would go
    return found


def without_hash(instance) -> dict:
    """`instance`'s state to pickle: its ``__dict__`` without the `remembered_hash`."""
    return {key: value for key, value in instance.__dict__.items() if key != "_hash"}


@lru_cache(maxsize=8192)  # a few MB; a search at 1 024 devices meets more, the recent ones again
def normal_form(layout: Layout) -> Layout:
    """`_normalize`, remembered for the most recent layouts (`Layout.normalized`)."""
    return _normalize(layout)


def _normalize(layout: Layout) -> Layout:
    # Cases: a size-1 axis splits nothing, so it is dropped; two neighbouring axes merge when the
    # right one continues what the left one does, because row-major order then makes their
    # combined coordinate the coordinate of one axis of the product size.
    sizes = layout.device_matrix.shape
    kept = [(size, role) for size, role in zip(sizes, _axis_roles(layout)) if size > 1]
    merged: list[list] = []  # [size, role, first-role] per merged axis, left to right
    for size, role in kept:
        if merged and _continues(merged[-1][1], role):
            merged[-1][0] *= size
            merged[-1][1] = role
        else:
            merged.append([size, role, role])
    ndim = len(merged)
    entries: list[list[int]] = [[] for _ in layout.shape]
    partial = []
    for position, (_, _, role) in enumerate(merged):
        axis = ndim - 1 - position
        if role[0] == "dim":
            entries[role[1]].append((role[2], axis))
        elif role[0] == "partial":
            partial.append(axis)
    tensor_map = TensorMap(tuple(tuple(axis for _, axis in sorted(entry)) for entry in entries))
    matrix = DeviceMatrix(tuple(size for size, _, _ in merged) or (1,))
    op = layout.partial_op if partial else "sum"
    return Layout(matrix, tensor_map, layout.shape, tuple(partial), op)


@cache
def _dim_shards(shape: tuple[int, ...], positions: tuple[int, ...]) -> tuple[int, ...]:
    coordinates = np.unravel_index(np.arange(math.prod(shape)), shape)
    shard = np.zeros(math.prod(shape), dtype=np.int64)
    for position in positions:
        shard = shard * shape[position] + coordinates[position]
    return tuple(shard.tolist())
