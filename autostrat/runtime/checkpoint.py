"""Parameter checkpoints, MindSpore style: `save_checkpoint` writes the whole (unsliced)
parameters and optimiser state of a training run as a numpy ``.npz``, `load_checkpoint` reads
them back, and `load_param_into_plan` checks them against a plan and puts them in its run's values.

Whole arrays are what makes a checkpoint portable: the run they feed may use another strategy
or another `device_num`, and each of its ranks loads its own slices by that plan's layouts (the
program's ``Load`` instructions), exactly as it loads the initial values. The optimiser state
(``moments.<parameter>``...) is saved with the parameters, so training continues rather than
restarts.

The file is an ordinary ``.npz`` (``numpy.load`` reads it) written deterministically: names in
sorted order, fixed zip timestamps, no compression, so the same arrays give the same bytes; and
atomically (a temporary file, then a rename), so a crash never leaves half a checkpoint.
"""

from __future__ import annotations

import io
import tokenize
import zipfile
import zlib
from pathlib import Path

import numpy as np

from autostrat.errors import CheckpointError, ConfigError
from autostrat.io import write_atomically

# What numpy and zipfile raise on a damaged archive: a bad array header is parsed by Python's
from autostrat.reading import read_bytes

# What numpy and zipfile raise on a damaged archive: a bad array header is parsed by Python's
# tokenizer (SyntaxError, TokenError); zipfile refuses compression methods it lacks
# (NotImplementedError) and encrypted members (RuntimeError); a corrupt deflate stream is zlib.error.
_UNREADABLE = (ValueError, EOFError, OSError, KeyError, zipfile.BadZipFile, SyntaxError, tokenize.TokenError,
               NotImplementedError, RuntimeError, zlib.error)
_EPOCH = (1980, 1, 1, 0, 0, 0)  # the earliest zip timestamp; a fixed one keeps the bytes reproducible


def checkpoint_tensors(graph) -> dict:
    """The tensors a checkpoint of `graph` holds: every tensor a training step updates (the
    parameters and the optimiser state), by name.

    Example:
        >>> from autostrat.autodiff import Momentum, build_training
        >>> from autostrat.frontend import trace
        >>> from autostrat.models import FFN
        >>> from autostrat.nn import Tensor
        >>> tensors = checkpoint_tensors(build_training(trace(FFN(), Tensor(shape=(64, 64))), Momentum()))
        >>> list(tensors)[:2], tensors["moments.dense1.weight"].shape
        (['dense1.weight', 'moments.dense1.weight'], (64, 64))
    """
    return {name: graph.tensors[name] for name, _ in graph.updates}


def checkpoint_bytes(parameters: dict) -> bytes:
    """The ``.npz`` file of `parameters` (name -> array) as bytes, the same for the same arrays."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED) as archive:
        for name in sorted(parameters):
            array = np.asarray(parameters[name])
            if array.dtype.hasobject:  # would need pickle, which loading refuses
                raise CheckpointError(f"{name}: a checkpoint holds numeric arrays, got dtype {array.dtype}")
            member = io.BytesIO()
            np.lib.format.write_array(member, array, allow_pickle=False)
            archive.writestr(zipfile.ZipInfo(f"{name}.npy", date_time=_EPOCH), member.getvalue())
    return buffer.getvalue()


def save_checkpoint(save_obj, ckpt_file_name) -> None:
    """Write whole arrays to `ckpt_file_name` (``.npz``): `save_obj` is ``{name: array}`` or a
    training result, whose `parameters` (and optimiser state) are saved.

    Example:
        >>> import tempfile, pathlib
        >>> path = pathlib.Path(tempfile.mkdtemp()) / "ffn.npz"
        >>> save_checkpoint({"w": np.ones((2, 3), np.float32)}, path)
        >>> load_checkpoint(path)["w"].shape
        (2, 3)
    """
    parameters = getattr(save_obj, "parameters", save_obj)
    if not isinstance(parameters, dict):
        raise CheckpointError(f"save_checkpoint: expected {{name: array}} or a training result, got {type(save_obj).__name__}")
    write_atomically(ckpt_file_name, checkpoint_bytes(parameters))


def load_checkpoint(ckpt_file_name) -> dict[str, np.ndarray]:
    """The whole arrays of a ``.npz`` checkpoint by name (sorted), read in full.

    Example: see `save_checkpoint`.
    """
    path = Path(ckpt_file_name)
    try:
        data = read_bytes(path, "parameter checkpoint", limit=None)  # a large model's checkpoint is large
    except ConfigError as error:
        raise CheckpointError(str(error)) from None
    if not zipfile.is_zipfile(io.BytesIO(data)):  # np.load would also take a .npy or a pickle
        raise CheckpointError(f"{path}: not a parameter checkpoint (expected a numpy .npz archive)")
    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as archive:
            arrays = {name: archive[name] for name in sorted(archive.files)}
    except _UNREADABLE as error:
        raise CheckpointError(f"{path}: not a readable parameter checkpoint (.npz of numeric arrays): {error}") from None
    except MemoryError:
        raise CheckpointError(f"{path}: not a readable parameter checkpoint: an array header claims more memory than there is") from None
    if not arrays:
        raise CheckpointError(f"{path}: a parameter checkpoint with no arrays; expected the parameters (and optimizer "
                              f"state) of a model, by name")
    for name, array in arrays.items():
        if not isinstance(array, np.ndarray):  # numpy hands back the raw bytes of a member that is no .npy
            raise CheckpointError(f"{path}: member {name!r} is not a numpy array (.npy); a parameter checkpoint holds "
                                  f"only arrays")
        check_finite(name, array, str(path))
    return arrays


def check_finite(name: str, array: np.ndarray, where: str) -> None:
    """A `CheckpointError` when the floating-point `array` holds a NaN or an infinity: training
    from it gives NaN losses.

    Example:
        >>> check_finite("w", np.array([1.0, np.nan]), "ckpt.npz")
        Traceback (most recent call last):
        ...
        autostrat.errors.CheckpointError: ckpt.npz: w holds 1 NaN and 0 infinite values (of 2); a parameter must be finite
    """
    if array.dtype.kind not in "fc" or np.isfinite(array).all():
        return
    nan = int(np.isnan(array).sum())
    raise CheckpointError(f"{where}: {name} holds {nan} NaN and {int(np.isinf(array).sum())} infinite values (of {array.size}); "
                          f"a parameter must be finite")


def check_checkpoint(graph, parameters: dict, where: str = "checkpoint") -> dict[str, np.ndarray]:
    """`parameters` as arrays, after checking they are exactly the tensors `graph` updates, each
    with the graph's shape and dtype; a `CheckpointError` names `where` and the first mismatch."""
    expected = checkpoint_tensors(graph)
    missing = [name for name in expected if name not in parameters]
    if missing:
        wanted = ", ".join(f"{name} ({expected[name].dtype} {list(expected[name].shape)})" for name in missing)
        raise CheckpointError(f"{where}: missing {wanted}; the plan needs every parameter and optimizer state it updates")
    extra = sorted(set(parameters) - set(expected))
    if extra:
        raise CheckpointError(f"{where}: not a parameter or optimizer state of the plan: {', '.join(extra)} "
                              f"(it updates {', '.join(expected)})")
    arrays = {}
    for name, tensor in expected.items():
        array = np.asarray(parameters[name])
        if array.shape != tuple(tensor.shape):
            raise CheckpointError(f"{where}: {name} has shape {list(array.shape)}, the plan expects {list(tensor.shape)}")
        if array.dtype != np.dtype(tensor.dtype):
            raise CheckpointError(f"{where}: {name} has dtype {array.dtype}, the plan expects {tensor.dtype}")
        check_finite(name, array, where)
        arrays[name] = array
    return arrays


def load_param_into_plan(plan, values: dict, parameters: dict, where: str = "checkpoint") -> dict:
    """The values of a run of `plan` with its parameters and optimiser state taken from
    `parameters` (checked by `check_checkpoint`); the run's ranks slice them by `plan`'s layouts.

    Example:
        >>> from autostrat.autodiff import Momentum
        >>> from autostrat.frontend.train import training_plan
        >>> from autostrat.models import FFN
        >>> plan, values, _ = training_plan(FFN(), Momentum(0.01, 0.9))
        >>> saved = {name: values[name] + 1 for name in checkpoint_tensors(plan.graph)}
        >>> float(load_param_into_plan(plan, values, saved)["moments.dense1.weight"].max())
        1.0
    """
    return dict(values) | check_checkpoint(plan.graph, parameters, where)
