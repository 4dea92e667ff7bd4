"""MindSpore's checkpoint functions on Cells: ``save_checkpoint(net, file)``,
``load_checkpoint(file, net)`` and ``load_param_into_net(net, params)``, over the whole-array
``.npz`` checkpoints of `runtime.checkpoint` (which also save and load training results).

Example:
    >>> import tempfile, pathlib
    >>> from autostrat.models import FFN
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "ffn.npz"
    >>> save_checkpoint(FFN(), path)
    >>> sorted(load_checkpoint(path))[:2], load_param_into_net(FFN(), load_checkpoint(path))
    (['dense1.bias', 'dense1.weight'], ([], []))
"""

from __future__ import annotations

import numpy as np

from autostrat.errors import CheckpointError
from autostrat.frontend.cell import Cell
from autostrat.frontend.tensor import Parameter
from autostrat.runtime import checkpoint


def save_checkpoint(save_obj, ckpt_file_name) -> None:
    """Write a Cell's parameters (by attribute path), ``{name: array or Parameter}`` or a
    training result to `ckpt_file_name`."""
    if isinstance(save_obj, Cell):
        save_obj = {name: parameter.asnumpy() for name, parameter in save_obj.parameters_and_names()}
    elif isinstance(save_obj, dict):
        save_obj = {name: value.asnumpy() if isinstance(value, Parameter) else np.asarray(value) for name, value in save_obj.items()}
    checkpoint.save_checkpoint(save_obj, ckpt_file_name)


def load_checkpoint(ckpt_file_name, net: Cell | None = None) -> dict[str, Parameter]:
    """The checkpoint's arrays as Parameters by name, loaded into `net` too when given."""
    parameters = {name: Parameter(array, name=name) for name, array in checkpoint.load_checkpoint(ckpt_file_name).items()}
    if net is not None:
        load_param_into_net(net, parameters)
    return parameters


def load_param_into_net(net: Cell, parameter_dict: dict, strict_load: bool = False) -> tuple[list[str], list[str]]:
    """Set `net`'s parameters from `parameter_dict` (by attribute path); returns (the net's
    parameters not in it, its names that are no parameter of the net), as MindSpore 2.x does.
    Shapes and dtypes must match (`CheckpointError` otherwise)."""
    own = dict(net.parameters_and_names())
    for name, value in parameter_dict.items():
        if name in own:
            array = np.asarray(value.asnumpy() if isinstance(value, Parameter) else value)
            if array.shape != own[name].shape or array.dtype.name != own[name].dtype:
                raise CheckpointError(f"load_param_into_net: {name} of {type(net).__name__} is {list(own[name].shape)} "
                                      f"{own[name].dtype}, the checkpoint's is {list(array.shape)} {array.dtype.name}")
            own[name].set_data(array)
    missing = [name for name in own if name not in parameter_dict]
    unexpected = [name for name in parameter_dict if name not in own]
    if strict_load and (missing or unexpected):
        raise CheckpointError(f"load_param_into_net(strict_load=True): missing {missing}, unexpected {unexpected}")
    return missing, unexpected
