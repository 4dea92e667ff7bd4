"""Optimizer sharding (MindSpore's parallel optimizer, ZeRO stages 1 to 3).

With ``enable_parallel_optimizer`` the devices that hold the same slice of a parameter (its
replicas) split that slice's optimiser work among themselves: each keeps the optimiser state
of, and updates, one part of it. The update op runs in the *shard layout*: the parameter's
layout with (up to ``optimizer_weight_shard_size`` of) its replicated device axes splitting
its first dim further, as MindSpore splits a weight's first dim over its optimiser-shard group.
So a step ReduceScatters each gradient into that layout (instead of an AllReduce), updates the
part, and AllGathers the new value back into the layout the parameter is stored in (its
writeback, in the "update" phase). In bytes a ReduceScatter and an AllGather cost what the
AllReduce they replace costs; the optimiser state and the update's compute shrink by the shard
size. MindSpore's ``optimizer_level`` "level1" (states) and "level2" (states and gradients)
behave alike here: a step has no gradient accumulation, so the gradient is never kept whole
beyond its ReduceScatter.

"level3" (ZeRO-3) also lets a parameter rest between steps in its shard layout: its update
needs no gather back, and each op reading it gathers it into the layout it uses instead (phase
"gather"; the gathered copy is dropped after that op). That trades a gather per use (the
forward's and the backward's) for a parameter held shard-sized, so the search decides it per
parameter: the first reader of each shardable parameter gets, besides each candidate, the same
strategy with the parameter at rest (`Strategy.at_rest`), priced in time and memory; the
propagation rests a parameter only where that costs nothing more (a weight read once: its
gather before the use replaces the one after the update), CP-SAT under a memory budget chooses.

A parameter is left whole-per-replica when it has no replica, when its whole size is below
``parallel_optimizer_threshold`` KB (MindSpore's rule: small weights are not worth the
messages), or when its slice's first dim does not divide by the shard size.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

from autostrat.cost import dtype_size
from autostrat.errors import ConfigError
from autostrat.layout import Layout, TensorMap
from autostrat.redistribution.refine import prime_matrix, refine_layout

LEVELS = ("level1", "level2", "level3")
CONFIG_KEYS = ("optimizer_level", "optimizer_weight_shard_size", "parallel_optimizer_threshold", "gradient_accumulation_shard")


@dataclass(frozen=True)
class OptimizerShard:
    """How parameters' optimiser work is split over their replicas.

    - `level`: MindSpore's ``optimizer_level``: "level1" or "level2" (alike here), or "level3",
      which also lets the search keep parameters sharded at rest (see the module).
    - `shard_size`: how many replicas share one parameter slice's work (MindSpore's
      ``optimizer_weight_shard_size``); -1: all of them.
    - `threshold_bytes`: parameters smaller than this (whole) are not sharded.

    Example (a [64, 32] weight split in 2 row blocks over 8 devices: 4 replicas per block, so
    its state is split 8 ways):
        >>> from autostrat.layout import DeviceMatrix
        >>> rows = Layout(DeviceMatrix((2, 4)), TensorMap((1, -1)), (64, 32))
        >>> str(OptimizerShard(threshold_bytes=0).layout(rows, "float32"))
        '[64, 32] dm[8] tm(0, -1)'
    """

    level: str = "level1"
    shard_size: int = -1
    threshold_bytes: int = 64 * 1024

    def __post_init__(self) -> None:
        if self.level not in LEVELS:
            raise ConfigError(f"parallel_optimizer_config: optimizer_level must be one of {', '.join(LEVELS)}, "
                              f"got {self.level!r}")
        size = self.shard_size
        if isinstance(size, bool) or not isinstance(size, int) or (size < 1 and size != -1):
            raise ConfigError(f"parallel_optimizer_config: optimizer_weight_shard_size must be -1 (all replicas) "
                              f"or a positive integer, got {size!r}")
        threshold = self.threshold_bytes
        if isinstance(threshold, bool) or not isinstance(threshold, int) or threshold < 0:
            raise ConfigError(f"an optimizer shard's threshold_bytes must be a non-negative integer, got {threshold!r}")

    @classmethod
    def from_config(cls, config: dict | None) -> OptimizerShard:
        """The sharding a MindSpore ``parallel_optimizer_config`` dict asks for.

        Example:
            >>> OptimizerShard.from_config({"optimizer_weight_shard_size": 2, "parallel_optimizer_threshold": 0})
            OptimizerShard(level='level1', shard_size=2, threshold_bytes=0)
        """
        if config is None:
            config = {}
        if not isinstance(config, dict):
            raise ConfigError(f"parallel_optimizer_config must be a mapping of {', '.join(CONFIG_KEYS)}, got {config!r}")
        unknown = sorted(set(config) - set(CONFIG_KEYS))
        if unknown:
            raise ConfigError(f"parallel_optimizer_config: unknown key {unknown[0]!r}; valid keys: {', '.join(CONFIG_KEYS)}")
        threshold = config.get("parallel_optimizer_threshold", 64)
        if isinstance(threshold, bool) or not isinstance(threshold, int) or threshold < 0:
            raise ConfigError(f"parallel_optimizer_config: parallel_optimizer_threshold must be a non-negative "
                              f"number of KB, got {threshold!r}")
        return cls(config.get("optimizer_level", "level1"), config.get("optimizer_weight_shard_size", -1), threshold * 1024)

    def layout(self, layout: Layout, dtype: str) -> Layout:
        """The layout a parameter stored in `layout` is updated in (its optimiser state's): the
        innermost replicated device axes, `shard_size` devices' worth, split its first dim at
        the minor end; `layout` itself when the parameter is not sharded (see the module).
        Memoised: a search asks once per candidate of every parameter's first reader."""
        return _shard_layout(self, layout, dtype)

    @property
    def at_rest(self) -> bool:
        """Whether parameters may rest in their shard layout (ZeRO-3)."""
        return self.level == "level3"


@lru_cache(maxsize=1 << 14)
def _shard_layout(sharding: OptimizerShard, layout: Layout, dtype: str) -> Layout:
    if not layout.shape or math.prod(layout.shape) * dtype_size(dtype) < sharding.threshold_bytes:
        return layout
    fine = refine_layout(layout.normalized(), prime_matrix(layout.device_matrix))
    used = fine.tensor_map.axes | set(fine.partial)
    free = [axis for axis in range(fine.device_matrix.ndim) if axis not in used]  # innermost first
    replicas = math.prod(fine.device_matrix.axis_size(axis) for axis in free)
    wanted = replicas if sharding.shard_size == -1 or sharding.shard_size % replicas == 0 else sharding.shard_size
    chosen, group = [], 1
    for axis in free:
        if group >= wanted:
            break
        chosen.append(axis)
        group *= fine.device_matrix.axis_size(axis)
    if group != wanted:
        raise ConfigError(f"parallel_optimizer_config: optimizer_weight_shard_size {sharding.shard_size} is not a "
                          f"product of the innermost replica axes of a parameter stored as {layout} "
                          f"({replicas} replicas)")
    if group == 1 or fine.slice_shape[0] % group:
        return layout
    entries = fine.tensor_map.entries
    first = entries[0] + tuple(sorted(chosen, reverse=True))  # major first: larger axis ids lead
    return Layout(fine.device_matrix, TensorMap((first,) + entries[1:]), fine.shape).normalized()


def update_layout(sharding: OptimizerShard | None, used: Layout, dtype: str) -> Layout:
    """The layout a parameter that its first reader uses in `used` is updated in: `used`
    itself without optimizer sharding, else `OptimizerShard.layout`."""
    return used if sharding is None else sharding.layout(used, dtype)


def rest_layout(sharding: OptimizerShard | None, strategy, index: int, dtype: str) -> Layout:
    """Where input `index` of an op running `strategy` rests between steps when it is a
    parameter the op reads first: the layout the op uses, or its shard layout when the
    strategy keeps it at rest (`Strategy.at_rest`, ZeRO-3).

    Example (a MatMul weight split in 2 row blocks on 8 devices; at rest, in 8 row blocks):
        >>> from dataclasses import replace
        >>> from autostrat.layout import Strategy
        >>> from autostrat.rules import make_rule
        >>> strategy = Strategy.from_tuples(make_rule("MatMul", [(16, 64), (64, 32)]), ((1, 2), (2, 1)), 8)
        >>> zero3 = OptimizerShard("level3", threshold_bytes=0)
        >>> str(rest_layout(zero3, strategy, 1, "float32")), str(rest_layout(zero3, replace(strategy, at_rest=(1,)), 1, "float32"))
        ('[64, 32] dm[1, 2, 1, 4] tm(2, 1)', '[64, 32] dm[8] tm(0, -1)')
    """
    used = strategy.input_layouts[index]
    return update_layout(sharding, used, dtype) if index in strategy.at_rest else used
