"""Layout algebra: device matrices, tensor maps, layouts, strategies and per-rank slices."""

from autostrat.layout.device_matrix import DeviceMatrix
from autostrat.layout.followed import FollowedStrategy
from autostrat.layout.layout import Layout, TensorMap
from autostrat.layout.slicing import SliceContext, assemble_tensor, rank_slices, split_tensor
from autostrat.layout.strategy import FactorRule, Strategy

__all__ = [
    "DeviceMatrix",
    "FactorRule",
    "FollowedStrategy",
    "Layout",
    "SliceContext",
    "Strategy",
    "TensorMap",
    "assemble_tensor",
    "rank_slices",
    "split_tensor",
]
