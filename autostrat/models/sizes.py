"""The check every built-in model makes of its size arguments (they come from YAML configs)."""

from __future__ import annotations

from autostrat.errors import ConfigError


def check_sizes(owner: str, **sizes) -> None:
    """A `ConfigError` naming `owner` and the first size that is not a positive integer.

    Example:
        >>> check_sizes("MLP", layers=4, hidden=0)
        Traceback (most recent call last):
        ...
        autostrat.errors.ConfigError: MLP: hidden must be a positive integer, got 0
    """
    for key, value in sizes.items():
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ConfigError(f"{owner}: {key} must be a positive integer, got {value!r}")
