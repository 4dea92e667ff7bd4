"""Validation of user strategy tuples against an op's rule, with precise messages.

Checks, in order: the form (a tuple of tuples of integers), the number of operands, the number
of dims per operand, positive parts, parts that divide the dim, a compound dim split major factor
first, a factor split the same way in every operand, need-replication factors left whole, and a
device count that fits `device_num`.
"""

from __future__ import annotations

import math

from autostrat.errors import LayoutError
from autostrat.layout.placement import Placement, take_axes


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_form(strategy, count: int, kind: str, where: str, shapes) -> tuple[tuple[int, ...], ...]:
    if not isinstance(strategy, (tuple, list)) or not all(isinstance(s, (tuple, list)) for s in strategy):
        raise LayoutError(
            f"{where}: a strategy is a tuple with one tuple of parts per {kind}, such as "
            f"((2, 1), (1, 4)); got {strategy!r}"
        )
    if len(strategy) != count:
        raise LayoutError(f"{where}: expected {count} {kind} strategies (one per {kind}), got {len(strategy)}: {strategy!r}")
    for index, (parts, shape) in enumerate(zip(strategy, shapes)):
        if len(parts) != len(shape):
            raise LayoutError(
                f"{where}: {kind} {index} has {len(shape)} dims (shape {list(shape)}) "
                f"but its strategy {tuple(parts)!r} has {len(parts)} entries"
            )
        for dim, part in enumerate(parts):
            if not _is_int(part) or part < 1:
                raise LayoutError(f"{where}: {kind} {index} dim {dim}: parts must be positive integers, got {part!r}")
            if shape[dim] % part:
                raise LayoutError(
                    f"{where}: {kind} {index} dim {dim} of size {shape[dim]} cannot be split evenly into {part} parts"
                )
    return tuple(tuple(parts) for parts in strategy)


def compound_splits(factors: tuple[str, ...], sizes: dict[str, int], parts: int) -> tuple[int, ...] | None:
    """Assign `parts` of one dim to its factors, major first, so that every slice stays a
    contiguous block: a minor factor is split only once every factor before it is fully split.
    Returns None when no such assignment exists."""
    splits, remaining = [], parts
    for factor in factors:
        size = sizes[factor]
        if size % remaining == 0:
            split = remaining
        elif remaining % size == 0:
            split = size
        else:
            return None
        splits.append(split)
        remaining //= split
    return tuple(splits) if remaining == 1 else None


def _assign(rule, operands, strategy, kind: str, where: str, found: dict) -> None:
    sizes = dict(zip(rule.factors, rule.factor_sizes))
    for index, (dims, parts) in enumerate(zip(operands, strategy)):
        for dim, (factors, part) in enumerate(zip(dims, parts)):
            splits = compound_splits(factors, sizes, part) if factors else (None if part > 1 else ())
            if splits is None:
                detail = " ".join(f"{f}({sizes[f]})" for f in factors)
                raise LayoutError(
                    f"{where}: {kind} {index} dim {dim} is made of factors {detail}; {part} parts would "
                    f"not give every rank one contiguous block"
                )
            for factor, split in zip(factors, splits):
                place = f"{kind} {index} dim {dim}"
                if factor in found and found[factor][0] != split:
                    raise LayoutError(
                        f"{where}: factor '{factor}' is split into {found[factor][0]} parts by "
                        f"{found[factor][1]} but into {split} parts by {place}; both must agree"
                    )
                found[factor] = (split, place)


def splits_from_tuples(rule, in_strategy, out_strategy, device_num: int, where: str) -> tuple[int, ...]:
    """Factor splits for MindSpore `in_strategy` (and optional `out_strategy`) tuples."""
    found: dict[str, tuple[int, str]] = {}
    strategy = _check_form(in_strategy, len(rule.inputs), "input", where, rule.input_shapes)
    _assign(rule, rule.inputs, strategy, "input", where, found)
    if out_strategy is not None:
        strategy = _check_form(out_strategy, len(rule.outputs), "output", where, rule.output_shapes)
        _assign(rule, rule.outputs, strategy, "output", where, found)
    for factor in rule.factors:
        if factor in rule.need_replication and found.get(factor, (1,))[0] > 1:
            split, place = found[factor]
            raise LayoutError(
                f"{where}: {place} (factor '{factor}') must not be split for {rule.op_type}, got {split} parts"
            )
    splits = tuple(found.get(factor, (1,))[0] for factor in rule.factors)
    used = math.prod(splits)
    if used > device_num:
        raise LayoutError(f"{where}: the strategy uses {used} devices but device_num is {device_num}")
    if device_num % used:
        raise LayoutError(
            f"{where}: the strategy uses {used} devices, which does not divide device_num {device_num} "
            f"(the remaining devices could not repeat the calculation evenly)"
        )
    return splits


def placement_from_layouts(rule, in_layouts, out_layouts, device_num: int, where: str):
    """Factor splits and their `Placement` for MindSpore ``Layout`` s, one per input (and
    optionally per output): the tuple checks first (on the parts the layouts imply), then every
    factor's device axes, which must agree wherever the factor appears. A dim of several factors
    (a reshape's) gives its axes to its factors major first, as many as each factor's split."""

    layouts = tuple(in_layouts) + tuple(out_layouts or ())
    matrices = {layout.device_matrix for layout in layouts}
    if len(matrices) != 1 or any(layout.names is None for layout in layouts):
        raise LayoutError(f"{where}: the layouts of one op must share one device matrix and each name its tensor's "
                          f"dims, got {', '.join(map(str, layouts))}")
    matrix = layouts[0].device_matrix
    if math.prod(matrix) != device_num:
        raise LayoutError(f"{where}: the layouts' device matrix {matrix} has {math.prod(matrix)} devices; "
                          f"device_num is {device_num}")
    parts_out = None if out_layouts is None else tuple(layout.parts() for layout in out_layouts)
    splits = splits_from_tuples(rule, tuple(layout.parts() for layout in in_layouts), parts_out, device_num, where)
    split_of = dict(zip(rule.factors, splits))
    found: dict[str, tuple[tuple[int, ...], str]] = {}
    operands = tuple(rule.inputs) + (tuple(rule.outputs) if out_layouts is not None else ())
    for index, (dims, layout) in enumerate(zip(operands, layouts)):
        for dim, (factors, axes) in enumerate(zip(dims, layout.dim_axes())):
            for factor in factors:
                place = f"operand {index} dim {dim}"
                count = _axes_for(split_of[factor], axes, matrix, f"{where}: {place}, factor '{factor}'")
                mine, axes = axes[:count], axes[count:]
                if factor in found and found[factor][0] != mine:
                    raise LayoutError(f"{where}: factor '{factor}' is split by device axes {found[factor][0]} in "
                                      f"{found[factor][1]} but by {mine} in {place}; both must agree")
                found[factor] = (mine, place)
    return splits, Placement(matrix, tuple(found.get(factor, ((), ""))[0] for factor in rule.factors))


def _axes_for(split: int, axes: tuple[int, ...], matrix: tuple[int, ...], where: str) -> int:
    """How many of `axes` (major first) make up `split` parts."""
    count = take_axes(split, axes, tuple(reversed(matrix)))
    if count is None:
        raise LayoutError(f"{where}: device axes {axes} of sizes {[matrix[len(matrix) - 1 - a] for a in axes]} cannot make "
                          f"{split} parts of one factor")
    return count
