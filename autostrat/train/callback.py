"""MindSpore's ``mindspore.train.callback`` (thin face)."""

from autostrat.frontend.checkpoint_callback import CheckpointConfig, ModelCheckpoint
from autostrat.frontend.model import Callback, LossMonitor, RunContext

__all__ = ["Callback", "CheckpointConfig", "LossMonitor", "ModelCheckpoint", "RunContext"]
