"""MindSpore's ``set_context`` and the names scripts pass to the contexts (`GRAPH_MODE`,
`ParallelMode`).

autostrat always plans the whole graph (MindSpore's graph mode) and runs it on CPU ranks, so
most of MindSpore's execution context has nothing to act on: such a key is accepted with one
warning naming it, the first time it is set. `save_graphs` is acted on: every plan made while
it is set writes its IR dumps into ``save_graphs_path/rank_<global_rank>``. The path comes from a
Python call, so it may name any folder (only paths read from a config file are kept to the
config's folder, see `autostrat.io`); the dumps are written as every file is.
"""

from __future__ import annotations

from autostrat.errors import ConfigError
from autostrat.frontend.mindspore_keys import warn_once

GRAPH_MODE = 0
PYNATIVE_MODE = 1


class ParallelMode:
    """MindSpore's parallel mode names (the strings `set_auto_parallel_context` takes)."""

    STAND_ALONE = "stand_alone"
    DATA_PARALLEL = "data_parallel"
    SEMI_AUTO_PARALLEL = "semi_auto_parallel"
    AUTO_PARALLEL = "auto_parallel"
    HYBRID_PARALLEL = "hybrid_parallel"


ACTED = ("save_graphs", "save_graphs_path")
ACCEPTED = ("device_id", "device_target", "jit_config", "max_call_depth", "max_device_memory", "memory_optimize_level",
            "mode", "pynative_synchronize", "runtime_num_threads", "deterministic")  # nothing here to act on
_DEFAULTS = {"mode": GRAPH_MODE, "device_target": "CPU", "save_graphs": False, "save_graphs_path": "."}
_context: dict = dict(_DEFAULTS)


def set_context(**kwargs) -> None:
    """MindSpore's ``set_context(mode=..., device_target=..., save_graphs=...)``.

    Example:
        >>> set_context(save_graphs=2, save_graphs_path="ir")
        >>> get_context("save_graphs_path")
        'ir'
        >>> reset_context()
    """
    unknown = sorted(set(kwargs) - set(ACTED) - set(ACCEPTED))
    if unknown:
        raise ConfigError(f"set_context: unknown key {unknown[0]!r}; accepted keys: {', '.join(sorted(ACTED + ACCEPTED))}")
    if "save_graphs" in kwargs and not isinstance(kwargs["save_graphs"], (bool, int)):
        raise ConfigError(f"set_context: save_graphs must be True, False or a level 0-3, got {kwargs['save_graphs']!r}")
    if "save_graphs_path" in kwargs and not isinstance(kwargs["save_graphs_path"], str):
        raise ConfigError(f"set_context: save_graphs_path must be a folder path, got {kwargs['save_graphs_path']!r}")
    if kwargs.get("mode", GRAPH_MODE) not in (GRAPH_MODE, PYNATIVE_MODE):
        raise ConfigError(f"set_context: mode must be GRAPH_MODE (0) or PYNATIVE_MODE (1), got {kwargs['mode']!r}")
    for key in sorted(set(kwargs) & set(ACCEPTED)):
        if kwargs[key] != _DEFAULTS.get(key):
            warn_once(f"set_context.{key}", f"set_context: {key}={kwargs[key]!r} is accepted and has no effect in "
                                            f"autostrat (the whole graph is planned and run on CPU ranks)", stacklevel=2)
    _context.update(kwargs)


def get_context(key: str):
    if key not in ACTED + ACCEPTED:
        raise ConfigError(f"get_context: unknown key {key!r}")
    return _context.get(key)


def reset_context() -> None:
    _context.clear()
    _context.update(_DEFAULTS)


def graphs_folder(global_rank: int) -> str | None:
    """Where a plan's IR goes while ``save_graphs`` is set, else None."""
    if not _context["save_graphs"]:
        return None
    return f"{_context['save_graphs_path'].rstrip('/') or '.'}/rank_{global_rank}"
