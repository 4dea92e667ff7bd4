"""Validation of user strategy tuples against an op's rule, with precise messages.

Checks, in order: the form (a tuple of tuples of integers), the number of operands, the number
of dims per operand, positive parts, parts that divide the dim, a compound dim split major factor
first, a factor split the same way in every operand, need-replication factors left whole, and a
device count that fits `device_num`.
"""

from __future__ import annotations

import math

from autostrat.errors import LayoutError


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
