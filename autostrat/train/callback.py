"""MindSpore's ``mindspore.train.callback`` (thin face)."""

from autostrat.frontend.model import Callback, LossMonitor, RunContext

__all__ = ["Callback", "LossMonitor", "RunContext"]
