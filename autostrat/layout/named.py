"""MindSpore's ``Layout`` (2.3+): a device matrix whose axes have names, and, once called with
one name per tensor dim, a tensor map written with those names.

    layout = Layout((2, 4), ("dp", "mp"))
    matmul.shard(in_strategy=(layout("dp", "mp"), layout("mp", "None")))

Axes are counted from the right, as in tensor maps: ``dp`` is axis 1, ``mp`` axis 0. A dim may
be split over several axes, major first (``layout(("dp", "mp"), "None")``), and the names may
come in any order, which strategy tuples cannot say (a tuple always puts an op's factors on the
device axes in one order). `Strategy.from_tuples` turns a tuple of these into a strategy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from autostrat.errors import LayoutError

NONE = "None"  # MindSpore's name for "not split"


@dataclass(frozen=True)
class NamedLayout:
    """A device matrix with named axes, and (after a call) one tensor's map over them.

    Example:
        >>> layout = NamedLayout((2, 4), ("dp", "mp"))
        >>> layout("dp", "mp").tensor_map, layout(("dp", "mp"), "None").tensor_map
        ((1, 0), ((1, 0), -1))
        >>> str(layout("mp", "None"))
        "layout((2, 4), ('dp', 'mp'))('mp', 'None')"
    """

    device_matrix: tuple[int, ...]
    alias_name: tuple[str, ...]
    rank_list: None = None  # MindSpore's devices in another order than 0..n-1: not supported
    names: tuple | None = None  # per tensor dim: an alias, NONE, or a tuple of aliases (major first)

    def __post_init__(self) -> None:
        matrix, aliases = self.device_matrix, self.alias_name
        if self.rank_list is not None:
            raise LayoutError(f"Layout: rank_list is not supported (the device matrix numbers the devices 0 to n - 1), "
                              f"got {self.rank_list!r}")
        if not isinstance(matrix, (tuple, list)) or not matrix or not all(
                isinstance(s, int) and not isinstance(s, bool) and s > 0 for s in matrix):
            raise LayoutError(f"Layout: device_matrix must be a tuple of positive integers such as (2, 4), got {matrix!r}")
        if not isinstance(aliases, (tuple, list)) or len(aliases) != len(matrix) or not all(isinstance(a, str) for a in aliases):
            raise LayoutError(f"Layout: alias_name must be a tuple of {len(matrix)} strings (one per device-matrix axis), "
                              f"got {aliases!r}")
        if len(set(aliases)) != len(aliases) or NONE in aliases:
            raise LayoutError(f"Layout: alias names must be distinct and not {NONE!r}, got {tuple(aliases)!r}")
        object.__setattr__(self, "device_matrix", tuple(matrix))
        object.__setattr__(self, "alias_name", tuple(aliases))

    def __call__(self, *names) -> NamedLayout:
        """This device matrix with one tensor's map: per dim an alias, "None", or a tuple of aliases."""
        used: list[str] = []
        for name in names:
            for alias in (name if isinstance(name, (tuple, list)) else (name,)):
                if alias == NONE and not isinstance(name, (tuple, list)):
                    continue
                if alias not in self.alias_name:
                    raise LayoutError(f"Layout{self.alias_name}: unknown axis name {alias!r} in {names!r}; "
                                      f"use one of {', '.join(self.alias_name)} or {NONE!r}")
                if alias in used:
                    raise LayoutError(f"Layout{self.alias_name}: axis {alias!r} splits two dims in {names!r}")
                used.append(alias)
        return NamedLayout(self.device_matrix, self.alias_name,
                           names=tuple(tuple(n) if isinstance(n, (tuple, list)) else n for n in names))

    def _axis(self, alias: str) -> int:
        return len(self.alias_name) - 1 - self.alias_name.index(alias)

    @property
    def tensor_map(self) -> tuple:
        """MindSpore's tensor map: per dim the axis (from the right), -1, or a tuple of axes."""
        if self.names is None:
            raise LayoutError(f"Layout{self.alias_name} names no tensor dims: call it, such as layout('dp', 'None')")
        return tuple(-1 if n == NONE else tuple(self._axis(a) for a in n) if isinstance(n, tuple) else self._axis(n)
                     for n in self.names)

    def dim_axes(self) -> tuple[tuple[int, ...], ...]:
        """Per dim, the axes splitting it (major first), () when not split."""
        return tuple(() if entry == -1 else entry if isinstance(entry, tuple) else (entry,) for entry in self.tensor_map)

    def parts(self) -> tuple[int, ...]:
        """The strategy tuple this layout implies: the parts of each dim."""
        sizes = dict(zip(self.alias_name, self.device_matrix))
        return tuple(math.prod(sizes[a] for a in (n if isinstance(n, tuple) else (n,)) if a != NONE) for n in self.names)

    def ir_text(self) -> str:
        """As MindSpore's IR prints it in ``in_layout``: `to_dict` with unquoted axis names."""
        names = ", ".join(self.alias_name) + ("," if len(self.alias_name) == 1 else "")
        return (f"{{'device_matrix': {self.device_matrix}, 'tensor_map': {self.tensor_map}, "
                f"'interleaved_parallel': false, 'alias_name': ({names})}}")

    def to_dict(self) -> dict:
        """As MindSpore prints it in ``in_layout`` (IR dumps) and returns from ``Layout.to_dict``."""
        return {"device_matrix": self.device_matrix, "tensor_map": self.tensor_map, "interleaved_parallel": False,
                "alias_name": self.alias_name}

    def __str__(self) -> str:
        text = f"layout({self.device_matrix}, {self.alias_name})"
        return text if self.names is None else f"{text}{self.names}"


def is_layout_strategy(strategy) -> bool:
    """Whether `strategy` is a tuple of `NamedLayout` (rather than of parts tuples)."""
    return isinstance(strategy, (tuple, list)) and bool(strategy) and all(isinstance(s, NamedLayout) for s in strategy)


def axis_names(ndim: int) -> tuple[str, ...]:
    """Names for a device matrix's axes when none were given: ``axis<i>``, counted from the right."""
    return tuple(f"axis{ndim - 1 - position}" for position in range(ndim))


def as_named(matrix: tuple[int, ...], tensor_map) -> NamedLayout:
    """A tensor map (entries: -1, an axis, or a tuple of axes) over `matrix` as a `NamedLayout`
    with `axis_names`.

    Example:
        >>> str(as_named((4, 2), ((0, 1), -1)))
        "layout((4, 2), ('axis1', 'axis0'))(('axis0', 'axis1'), 'None')"
    """
    names = axis_names(len(matrix))
    name = {len(matrix) - 1 - position: alias for position, alias in enumerate(names)}
    dims = []
    for entry in tensor_map:
        axes = (entry,) if isinstance(entry, int) else tuple(entry)
        axes = tuple(axis for axis in axes if axis != -1)
        dims.append(NONE if not axes else name[axes[0]] if len(axes) == 1 else tuple(name[a] for a in axes))
    return NamedLayout(tuple(matrix), names)(*dims)


def named_layouts(strategy) -> tuple[NamedLayout, ...]:
    """`strategy`'s input layouts as MindSpore Layouts (a seed that gives it back, order
    included, through `Strategy.from_tuples`)."""
    return tuple(as_named(strategy.device_matrix.shape, layout.tensor_map.entries) for layout in strategy.input_layouts)


def layout_entry(layout) -> dict:
    """A layout's device matrix and tensor map as MindSpore's ``Layout.to_dict`` writes them
    (entries -1, an axis, or a list of axes); `as_named` reads them back.

    Example:
        >>> from autostrat.layout import DeviceMatrix, Layout, TensorMap
        >>> layout_entry(Layout(DeviceMatrix((4, 2)), TensorMap(((0, 1), -1)), (64, 64)))
        {'device_matrix': [4, 2], 'tensor_map': [[0, 1], -1]}
    """
    entries = [-1 if not entry else entry[0] if len(entry) == 1 else list(entry) for entry in layout.tensor_map.entries]
    return {"device_matrix": list(layout.device_matrix.shape), "tensor_map": entries}
