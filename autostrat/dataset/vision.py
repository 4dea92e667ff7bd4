"""MindSpore's ``mindspore.dataset.vision``: the image transforms (thin face)."""

from autostrat.frontend.transforms import HWC2CHW, Normalize, Rescale

__all__ = ["HWC2CHW", "Normalize", "Rescale"]
