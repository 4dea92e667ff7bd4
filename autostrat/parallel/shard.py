"""MindSpore's ``mindspore.parallel.shard``: where its samples import `Layout` from
(``from mindspore.parallel.shard import Layout``).

Example:
    >>> from autostrat.parallel.shard import Layout
    >>> Layout((2, 4), ("x", "y"))("None", ("y", "x")).tensor_map
    (-1, (0, 1))
"""

from autostrat.frontend.cell import shard
from autostrat.layout.named import NamedLayout as Layout

__all__ = ["Layout", "shard"]
