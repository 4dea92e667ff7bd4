"""MindSpore's batch semantics for `Model.train`: what a rank reads from its dataset is its
share of the global batch unless ``full_batch``.

MindSpore's ``full_batch=False`` (its default, ``dataset_strategy="data_parallel"``) splits the
batch dim over the data-parallel devices (``device_num`` / ``pipeline_stages``): each rank's
dataset element is its rows, and the step computes on the global batch, those elements stacked
in rank order (32 rows read per rank on 8 ranks: a step of 256 rows). ``full_batch=True`` (or
``dataset_strategy="full_batch"``) means every rank reads the whole global batch.

Under mpiexec each process reads its own dataset and the ranks exchange their elements once,
before the first step (outside the plan's counted traffic). With the ranks as threads of one
process, rank r's elements are the dataset read as shard r when it is sharded
(``MnistDataset(num_shards=..., shard_id=...)``), else the same rows as rank 0's (every rank
reads the same files, as it would in MindSpore).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from autostrat.errors import ConfigError


@dataclass(frozen=True)
class BatchSplit:
    """How many ranks' elements make one global batch (`ranks`, 1 with ``full_batch``)."""

    ranks: int
    full_batch: bool

    def describe(self, local_rows: int) -> str:
        """The sentence a run prints about the batch its plan is made for.

        Example:
            >>> BatchSplit(8, False).describe(32)
            'global batch 256 (32 rows per rank x 8 data-parallel ranks, full_batch=False)'
        """
        if self.full_batch:
            return f"global batch {local_rows} (every rank reads the whole batch, full_batch=True)"
        return f"global batch {local_rows * self.ranks} ({local_rows} rows per rank x {self.ranks} data-parallel ranks, full_batch=False)"

    def global_arrays(self, arrays: list) -> list:
        """Stand-ins for the global batch of one rank's `arrays`: each batch dim times `ranks`.

        Example:
            >>> [a.shape for a in BatchSplit(4, False).global_arrays([np.zeros((8, 3))])]
            [(32, 3)]
        """
        if self.full_batch:
            return list(arrays)
        for array in arrays:
            if np.ndim(array) == 0:
                raise ConfigError("Model.train: a dataset array without a batch dim cannot be a rank's share of a global batch "
                                  "(full_batch=False); give it a batch dim or set full_batch=True")
        return [np.broadcast_to(np.zeros((), array.dtype), (len(array) * self.ranks,) + array.shape[1:]) for array in arrays]

    def local_inputs(self, inputs) -> tuple[tuple, str]:
        """The plan's `inputs` (TensorInfos) as one rank reads them, and how to name them in an
        error: the whole inputs with ``full_batch``, else each batch dim divided by `ranks`."""
        if self.full_batch:
            return tuple(inputs), "the plan's inputs are"
        local = tuple(replace(info, shape=(info.shape[0] // self.ranks,) + tuple(info.shape[1:])) for info in inputs)
        return local, f"a rank's share of the plan's inputs, 1/{self.ranks} of the batch, is"


def batch_split(context) -> BatchSplit:
    """The split the context asks for: every data-parallel rank (``device_num`` /
    ``pipeline_stages``) unless `full_batch`.

    Example:
        >>> from types import SimpleNamespace
        >>> batch_split(SimpleNamespace(full_batch=False, device_num=8, pipeline_stages=2))
        BatchSplit(ranks=4, full_batch=False)
    """
    if context.full_batch:
        return BatchSplit(1, True)
    return BatchSplit(context.device_num // max(context.pipeline_stages, 1), False)


def _stack(per_rank: list[list], where: str) -> list[tuple]:
    """Element i of the global dataset: every rank's element i, each array stacked along dim 0
    in rank order."""
    counts = [len(elements) for elements in per_rank]
    if len(set(counts)) != 1:
        raise ConfigError(f"{where}: every rank's dataset must have the same number of elements, got {counts} (by rank)")
    stacked = []
    for index in range(counts[0]):
        columns = list(zip(*(elements[index] for elements in per_rank)))
        for column, arrays in enumerate(columns):
            shapes = {np.shape(array)[1:] for array in arrays}
            if not all(np.ndim(array) for array in arrays) or len(shapes) != 1:
                raise ConfigError(f"{where}: element {index}, array {column}: every rank's rows must have one shape with a "
                                  f"batch dim, got {[list(np.shape(array)) for array in arrays]} (by rank)")
        stacked.append(tuple(np.concatenate(arrays) for arrays in columns))
    return stacked


def global_elements(dataset, elements: list[list], split: BatchSplit, backend, where: str = "Model.train") -> list[tuple]:
    """The global batches of a run: `elements` (this process's dataset elements, as lists of
    arrays) joined with the other ranks' as `split` says (see the module docstring).

    Example (threads: an unsharded dataset is every rank's):
        >>> rows = [[np.arange(2)]]
        >>> [a.tolist() for a in global_elements(rows, rows, BatchSplit(2, False), None)[0]]
        [[0, 1, 0, 1]]
    """
    if split.full_batch or split.ranks == 1:
        return [tuple(element) for element in elements]
    if backend is not None:
        per_rank = backend.allgather_objects(elements)  # pickled arrays: once per run, outside the counted traffic
        return _stack(per_rank[: split.ranks], where)
    shards = getattr(dataset, "num_shards", None)
    if shards is None:
        return _stack([elements] * split.ranks, where)
    if shards != split.ranks:
        raise ConfigError(f"{where}: the dataset is split in {shards} shards but {split.ranks} data-parallel ranks read it "
                          f"(full_batch=False); shard it num_shards={split.ranks} or set full_batch=True")
    return _stack([[list(row) for row in dataset.for_shard(shard)] for shard in range(shards)], where)
