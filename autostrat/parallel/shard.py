"""MindSpore's ``mindspore.parallel.shard``: `Layout` and the functional `shard` (thin face)."""

from autostrat.frontend.cell import shard
from autostrat.layout.named import NamedLayout as Layout  # MindSpore's name, as mindspore.Layout

__all__ = ["Layout", "shard"]
