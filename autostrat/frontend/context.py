"""The MindSpore-style parallel context: the only global state in autostrat.

`set_auto_parallel_context` validates and stores keys; everything below the front end receives
`current_context()`, a frozen snapshot, so a search never reads global state.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace

from autostrat.errors import ConfigError

PARALLEL_MODES = ("auto_parallel", "data_parallel", "semi_auto_parallel", "stand_alone")
SEARCH_MODES = ("sharding_propagation",)


@dataclass(frozen=True)
class ParallelContext:
    """A validated snapshot of the parallel context.

    - `parallel_mode`: stand_alone (one device), data_parallel (split every op's batch dim),
      semi_auto_parallel (configured strategies, data parallel for the rest), auto_parallel
      (search, as `search_mode` says).
    - `fully_use_devices`: when False, candidates may use fewer devices (repeated calculation).
    - `full_batch`: every rank loads the whole batch (True) or only its own share (False).
    """

    parallel_mode: str = "stand_alone"
    search_mode: str = "sharding_propagation"
    device_num: int = 1
    global_rank: int = 0
    full_batch: bool = False
    fully_use_devices: bool = True
    strategy_ckpt_save_file: str = ""
    strategy_ckpt_load_file: str = ""

    def __post_init__(self) -> None:
        _check_choice("parallel_mode", self.parallel_mode, PARALLEL_MODES)
        _check_choice("search_mode", self.search_mode, SEARCH_MODES)
        for key in ("device_num", "global_rank"):
            value = getattr(self, key)
            if not isinstance(value, int) or isinstance(value, bool) or value < (1 if key == "device_num" else 0):
                bound = "a positive integer" if key == "device_num" else "a non-negative integer"
                raise ConfigError(f"{key} must be {bound}, got {value!r}")
        if self.global_rank >= self.device_num:
            raise ConfigError(f"global_rank {self.global_rank} must be below device_num {self.device_num}")
        for key in ("full_batch", "fully_use_devices"):
            if not isinstance(getattr(self, key), bool):
                raise ConfigError(f"{key} must be True or False, got {getattr(self, key)!r}")
        for key in ("strategy_ckpt_save_file", "strategy_ckpt_load_file"):
            if not isinstance(getattr(self, key), str):
                raise ConfigError(f"{key} must be a file path string, got {getattr(self, key)!r}")

    def as_dict(self) -> dict:
        return asdict(self)


def _check_choice(key: str, value, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ConfigError(f"{key} must be one of {', '.join(choices)}; got {value!r}")


def _check_keys(keys) -> None:
    unknown = sorted(set(keys) - set(KEYS))
    if unknown:
        raise ConfigError(f"unknown auto-parallel context key {unknown[0]!r}; valid keys: {', '.join(KEYS)}")


KEYS = tuple(f.name for f in fields(ParallelContext))
_context = ParallelContext()


def set_auto_parallel_context(**kwargs) -> None:
    """Set context keys, MindSpore style; unknown keys or values raise `ConfigError`.

    Example:
        >>> set_auto_parallel_context(parallel_mode="auto_parallel", device_num=8)
        >>> get_auto_parallel_context("device_num")
        8
        >>> reset_auto_parallel_context()
    """
    global _context
    _check_keys(kwargs)
    _context = replace(_context, **kwargs)


def get_auto_parallel_context(key: str):
    _check_keys([key])
    return getattr(_context, key)


def reset_auto_parallel_context() -> None:
    global _context
    _context = ParallelContext()


def current_context() -> ParallelContext:
    """The frozen context that searches and runs receive."""
    return _context
