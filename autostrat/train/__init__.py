"""MindSpore's ``mindspore.train``: `Model` and the callbacks (thin face)."""

from autostrat.frontend.model import Callback, LossMonitor, Model, RunContext

__all__ = ["Callback", "LossMonitor", "Model", "RunContext"]
