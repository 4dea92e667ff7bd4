"""MindSpore's ``mindspore.dataset.transforms``: `TypeCast` (thin face)."""

from autostrat.frontend.transforms import TypeCast

__all__ = ["TypeCast"]
