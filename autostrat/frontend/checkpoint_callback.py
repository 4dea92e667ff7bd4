"""MindSpore's ``train.CheckpointConfig`` and ``train.ModelCheckpoint``: `Model.train` writes the
network's parameters as MindSpore ``.ckpt`` files (`runtime.mindspore_ckpt`), named as MindSpore
names them (``{prefix}-{epoch}_{step in epoch}.ckpt`` in `directory`), each rank into the
directory its script gives (``rank_{get_rank()}`` in MindSpore's samples).

With ``integrated_save=True`` (MindSpore's default) a file holds whole parameters; with False,
this rank's slices of them, by the training plan's layouts (MindSpore's per-rank checkpoints,
merged again by its ``transform_checkpoints``). `Model.train` runs all epochs in one go and has
the trained values only at the end: a checkpoint is written at the last step (as MindSpore also
does), and a configuration asking for one before it is refused before the first step.
"""

from __future__ import annotations

from pathlib import Path

from autostrat.errors import ConfigError
from autostrat.frontend.model import Callback, RunContext
from autostrat.layout.slicing import rank_slices
from autostrat.runtime.mindspore_ckpt import save_mindspore_checkpoint


class CheckpointConfig:
    """When and how `ModelCheckpoint` saves: every `save_checkpoint_steps` steps, at most
    `keep_checkpoint_max` files kept, whole parameters or this rank's slices (`integrated_save`).
    MindSpore's other options are refused when set to anything but their defaults.

    Example:
        >>> CheckpointConfig(save_checkpoint_steps=1000, keep_checkpoint_max=1, integrated_save=False).integrated_save
        False
    """

    _DEFAULTS = {"save_checkpoint_seconds": 0, "keep_checkpoint_per_n_minutes": 0, "async_save": False, "saved_network": None,
                 "append_info": None, "enc_key": None, "exception_save": False, "crc_check": False, "format": "ckpt"}

    def __init__(self, save_checkpoint_steps: int = 1, keep_checkpoint_max: int = 5, integrated_save: bool = True, **options):
        for name, value in options.items():
            if name not in self._DEFAULTS and name not in ("enc_mode", "remove_redundancy"):
                raise ConfigError(f"CheckpointConfig: unknown argument {name!r}")
            if name in self._DEFAULTS and value != self._DEFAULTS[name]:
                raise ConfigError(f"CheckpointConfig: {name}={value!r} is not supported (only its default {self._DEFAULTS[name]!r})")
        for name, value in (("save_checkpoint_steps", save_checkpoint_steps), ("keep_checkpoint_max", keep_checkpoint_max)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"CheckpointConfig: {name} must be a positive integer, got {value!r}")
        self.save_checkpoint_steps, self.keep_checkpoint_max = save_checkpoint_steps, keep_checkpoint_max
        self.integrated_save = bool(integrated_save)


class ModelCheckpoint(Callback):
    """Saves the network's parameters during `Model.train` (see the module docstring); runs on
    every rank, each writing its own file."""

    every_rank = True  # `Model.train` runs the other callbacks on rank 0 only

    def __init__(self, prefix: str = "CKP", directory=None, config: CheckpointConfig | None = None, **options):
        if options:
            raise ConfigError(f"ModelCheckpoint: {sorted(options)[0]!r} is not supported (prefix, directory and config are)")
        if not isinstance(prefix, str) or not prefix or "/" in prefix:
            raise ConfigError(f"ModelCheckpoint: prefix must be a file name prefix without '/', got {prefix!r}")
        self.prefix, self.directory = prefix, Path(directory if directory is not None else ".")
        self.config = config if config is not None else CheckpointConfig()
        self.saved: list[Path] = []

    def on_train_begin(self, run_context: RunContext) -> None:
        params = run_context.original_args()
        last = params.epoch_num * params.batch_num
        every = self.config.save_checkpoint_steps
        if every < last:
            raise ConfigError(f"ModelCheckpoint: save_checkpoint_steps={every} asks for a checkpoint at step {every}, before "
                              f"the run's last step {last}: Model.train has the trained values only at its end; "
                              f"set save_checkpoint_steps >= {last}")

    def on_train_end(self, run_context: RunContext) -> None:
        params = run_context.original_args()
        path = self.directory / f"{self.prefix}-{params.cur_epoch_num}_{params.step_in_epoch}.ckpt"
        save_mindspore_checkpoint(self._parameters(params), path)
        self.saved.append(path)
        while len(self.saved) > self.config.keep_checkpoint_max:
            self.saved.pop(0).unlink(missing_ok=True)

    def _parameters(self, params) -> dict:
        """The network's parameters by name: whole, or this rank's slices by the plan's layouts."""
        whole = {name: parameter.asnumpy() for name, parameter in params.train_network.parameters_and_names()}
        if self.config.integrated_save:
            return whole
        names = {id(value): name for name, value in params.plan.graph.values.items()}
        owners = dict(params.train_network.parameters_and_names())
        return {name: array[rank_slices(params.plan.layouts[names[id(owners[name])]], params.rank)]
                for name, array in whole.items()}
