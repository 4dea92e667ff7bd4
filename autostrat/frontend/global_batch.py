"""MindSpore's batch semantics on the functional loop and on a bare ``net(x)`` call: which rows
the plan is made for, from what each rank was given.

- ``full_batch=True`` (``dataset_strategy="full_batch"``): every rank is given the whole batch;
  the plan is made for it as given.
- ``full_batch=False`` (MindSpore's default): each rank is given its share of the batch, and the
  global batch is the ranks' shares one after the other (rank order, along the first dim).
  The shares are those of the data-parallel ranks, ``device_num / pipeline_stages`` of them
  (`batches.batch_split`, the rule `Model.train` follows too): the ranks of the first stage, whose
  rows every later stage's ranks read again. Under mpiexec every process is one rank: the shares
  are gathered from the ranks. Run alone, this one process feeds every rank the batch it read (as
  each of MindSpore's ranks reads the same unsharded dataset), so the global batch is that many
  copies of it.

The gathering is data loading, outside the plan's counted traffic.
"""

from __future__ import annotations

import numpy as np

from autostrat.frontend.batches import BatchSplit
from autostrat.frontend.world import world_backend


def global_arrays(arrays: list[np.ndarray], split: BatchSplit) -> list[np.ndarray]:
    """The global batch the plan runs on, from this rank's `arrays` (see the module docstring).
    A 0-d array (no batch dim) is the same on every rank and stays as given.

    Example:
        >>> [a.shape for a in global_arrays([np.zeros((2, 3)), np.zeros(())], BatchSplit(4, False))]
        [(8, 3), ()]
        >>> global_arrays([np.zeros((2, 3))], BatchSplit(1, True))[0].shape
        (2, 3)
    """
    if split.full_batch or split.ranks == 1:
        return list(arrays)
    backend = world_backend()
    if backend is None:
        return [array if array.ndim == 0 else np.concatenate([array] * split.ranks) for array in arrays]
    world = tuple(range(backend.device_num))
    backend.prepare(((world,),))
    gathered = []
    for array in arrays:
        if array.ndim == 0:
            gathered.append(array)
            continue
        pieces = backend.allgather(np.ascontiguousarray(array), world)[: split.ranks]
        gathered.append(np.concatenate([piece.reshape(array.shape) for piece in pieces]))
    return gathered


def global_shapes(arrays: list[np.ndarray], split: BatchSplit) -> list[tuple]:
    """The shapes `global_arrays` gives, without gathering (every rank's share alike).

    Example:
        >>> global_shapes([np.zeros((2, 3))], BatchSplit(4, False))
        [(8, 3)]
    """
    if split.full_batch or split.ranks == 1:
        return [array.shape for array in arrays]
    return [array.shape if array.ndim == 0 else (array.shape[0] * split.ranks, *array.shape[1:]) for array in arrays]


def rank_share(array: np.ndarray, rows: int, split: BatchSplit) -> np.ndarray:
    """This rank's rows of an output `array` of the global batch, where each rank was given
    `rows` rows (`global_arrays`): all of it with ``full_batch``, or when its first dim is not
    the global batch (a scalar loss); otherwise the share of rank r's data-parallel index,
    r mod `split.ranks` (run alone: rank 0's, the rows this process was given).

    Example:
        >>> rank_share(np.arange(8), 2, BatchSplit(4, False)).tolist()
        [0, 1]
        >>> rank_share(np.arange(8), 8, BatchSplit(1, True)).tolist()
        [0, 1, 2, 3, 4, 5, 6, 7]
    """
    if split.full_batch or split.ranks == 1 or array.ndim == 0 or array.shape[0] != rows * split.ranks:
        return array
    backend = world_backend()
    index = 0 if backend is None else backend.rank % split.ranks
    return array[index * rows:(index + 1) * rows]
