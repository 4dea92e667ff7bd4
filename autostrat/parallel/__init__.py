"""MindSpore's ``mindspore.parallel``: `Layout` and the functional `shard`.

Example:
    >>> from autostrat.parallel import Layout
    >>> Layout((2, 4), ("dp", "mp"))("dp", "None").tensor_map
    (1, -1)
"""

from autostrat.frontend.cell import shard
from autostrat.layout.named import NamedLayout as Layout  # MindSpore's name, as mindspore.Layout

__all__ = ["Layout", "shard"]
