"""MindSpore's ``mindspore.communication``: `init`, `get_rank`, `get_group_size`.

Example:
    >>> from autostrat.communication import get_group_size, get_rank
    >>> get_rank()
    0
"""

from autostrat.frontend.world import get_group_size, get_rank, init

__all__ = ["get_group_size", "get_rank", "init"]
