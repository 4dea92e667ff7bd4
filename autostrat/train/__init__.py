"""MindSpore's ``mindspore.train``: `Model`, the callbacks and the checkpoint callback (thin face)."""

from autostrat.frontend.checkpoint_callback import CheckpointConfig, ModelCheckpoint
from autostrat.frontend.model import Callback, LossMonitor, Model, RunContext

__all__ = ["Callback", "CheckpointConfig", "LossMonitor", "Model", "ModelCheckpoint", "RunContext"]
