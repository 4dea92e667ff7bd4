"""Run a plan on simulated ranks: a list of per-rank numpy pieces, one process.

Each step does what its collective does on a real cluster, member by member: a group's pieces
are concatenated in chunk order, split into chunks, reduced by the partial op, or sent to one
other rank, or reshaped in place, or zeroed (a PartialCreate of a sum, on every member of a
group but the first). Which chunk a rank takes is read from the layouts the step goes between, so a step
whose layouts and data movement disagree produces a wrong tensor (the tests check that). The
runtime's LocalBackend uses this as its reference.
"""

from __future__ import annotations

import numpy as np

from autostrat.errors import LayoutError
from autostrat.redistribution.plan import RedistributionPlan, RedistributionStep

_REDUCE = {"sum": np.add, "max": np.maximum, "min": np.minimum}


def simulate(plan: RedistributionPlan, pieces) -> list[np.ndarray]:
    """The pieces every rank holds after `plan`, from the pieces of ``plan.src``.

    Example:
        >>> from autostrat.layout import DeviceMatrix, Layout, TensorMap, assemble_tensor, split_tensor
        >>> from autostrat.redistribution import plan_redistribution
        >>> src = Layout(DeviceMatrix((4,)), TensorMap((0, -1)), (8, 2))
        >>> dst = Layout(DeviceMatrix((4,)), TensorMap((-1, 0)), (8, 2 * 2))
        >>> x = np.arange(32.0).reshape(8, 4)
        >>> plan = plan_redistribution(Layout(src.device_matrix, src.tensor_map, (8, 4)), dst)
        >>> out = simulate(plan, split_tensor(x, plan.src))
        >>> str(plan), bool((assemble_tensor(out, dst) == x).all())
        ('AllToAll(axes (1, 0) dim 0->1, 24B); 24B', True)
    """
    pieces = [np.asarray(piece) for piece in pieces]
    if len(pieces) != plan.src.device_num:
        raise LayoutError(f"plan {plan} needs {plan.src.device_num} pieces, got {len(pieces)}")
    for step in plan.steps:
        pieces = simulate_step(step, pieces)
    return pieces


def _chunk(step: RedistributionStep, rank: int, dim: int) -> int:
    """The chunk of `dim` that `rank` holds after the step, among the step's group."""
    return step.after.shard_index(rank)[dim] % step.group_size


def _reduced(step: RedistributionStep, pieces, group) -> np.ndarray:
    combine = _REDUCE[step.before.partial_op]
    total = pieces[group[0]]
    for rank in group[1:]:
        total = combine(total, pieces[rank])
    return total


def _created(step: RedistributionStep, first: bool, piece: np.ndarray) -> np.ndarray:
    """A rank's piece after a PartialCreate: its own, or zeros when the op is a sum and the
    rank is not its group's first member (only that one keeps the value)."""
    return piece.copy() if first or step.after.partial_op != "sum" else np.zeros_like(piece)


def simulate_step(step: RedistributionStep, pieces: list[np.ndarray]) -> list[np.ndarray]:
    """The pieces after one step (new arrays; the input list is not changed)."""
    if step.kind == "CollectivePermute":
        return [pieces[source].copy() for source in step.sources]
    if step.kind == "Reshape":
        # Local: a row-major reshape of every piece (the planner only reshapes when that gives
        # every rank its piece of the reshaped tensor).
        return [np.reshape(piece, step.after.slice_shape).copy() for piece in pieces]
    if step.kind == "PartialCreate":
        firsts = {group[0] for group in step.groups}
        return [_created(step, rank in firsts, piece) for rank, piece in enumerate(pieces)]
    result: list = [None] * len(pieces)
    g = step.group_size
    if step.kind not in ("Slice", "AllGather", "AllToAll", "AllReduce", "ReduceScatter"):
        raise LayoutError(f"cannot simulate step kind {step.kind!r}")
    for group in step.groups:
        # What the whole group combines, once per group (a group may have a thousand members).
        if step.kind == "AllGather":
            whole = np.concatenate([pieces[member] for member in group], axis=step.dims[0])
        elif step.kind in ("AllReduce", "ReduceScatter"):
            whole = _reduced(step, pieces, group)
        elif step.kind == "AllToAll":
            source, target = step.dims
            split = [np.split(pieces[member], g, axis=target) for member in group]
        for rank in group:
            if step.kind == "Slice":
                result[rank] = np.split(pieces[rank], g, axis=step.dims[0])[_chunk(step, rank, step.dims[0])].copy()
            elif step.kind == "AllGather":
                result[rank] = whole.copy()
            elif step.kind == "AllToAll":
                chunk = _chunk(step, rank, target)
                result[rank] = np.concatenate([parts[chunk] for parts in split], axis=source)
            elif step.kind == "AllReduce":
                result[rank] = whole.copy()
            else:  # ReduceScatter
                result[rank] = np.split(whole, g, axis=step.dims[0])[_chunk(step, rank, step.dims[0])].copy()
    return result
