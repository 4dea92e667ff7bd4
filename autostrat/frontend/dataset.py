"""MindSpore's datasets, the part a training script uses: `GeneratorDataset`,
`NumpySlicesDataset` and ``.batch``. A dataset yields tuples of numpy arrays, one per column;
`Model.train` reads it once per call and iterates the steps from those batches.

What a rank reads is its share of the global batch unless ``full_batch`` (MindSpore's
semantics; `frontend.batches` joins the ranks' elements into global batches).
"""

from __future__ import annotations

import numpy as np

from autostrat.errors import ConfigError
from autostrat.frontend.tensor import Tensor


class Dataset:
    """Rows of columns, batched or not; iterate it for tuples of arrays. A sharded dataset (read
    as one of `num_shards` shards) can be read again as another shard (`for_shard`), which is
    how one process running every rank as a thread finds each rank's rows."""

    def __init__(self, rows, column_names, num_shards: int | None = None, remake=None):
        self._rows, self.column_names = rows, list(column_names) if column_names else None
        self.num_shards, self._remake = num_shards, remake  # remake: shard id -> this dataset read as that shard

    def for_shard(self, shard_id: int) -> Dataset:
        """This dataset, every step of it, read as shard `shard_id` (itself when unsharded)."""
        return self if self._remake is None else self._remake(shard_id)

    def _derived(self, rows, make) -> Dataset:
        """A dataset of `rows` made from this one by `make`, which remakes it from another shard."""
        remake = None if self._remake is None else (lambda shard_id: make(self.for_shard(shard_id)))
        return Dataset(rows, self.column_names, self.num_shards, remake)

    def __iter__(self):
        for row in self._rows():
            yield tuple(np.asarray(value) for value in (row if isinstance(row, (tuple, list)) else (row,)))

    def batch(self, batch_size: int, drop_remainder: bool = False) -> Dataset:
        """Rows stacked `batch_size` at a time (the last, shorter batch dropped with `drop_remainder`).

        Example:
            >>> data = NumpySlicesDataset((np.arange(5), np.arange(5) * 2), shuffle=False).batch(2, drop_remainder=True)
            >>> [tuple(a.tolist() for a in batch) for batch in data]
            [([0, 1], [0, 2]), ([2, 3], [4, 6])]
        """
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ConfigError(f"Dataset.batch: batch_size must be a positive integer, got {batch_size!r}")

        def rows():
            pending = []
            for row in self:
                pending.append(row)
                if len(pending) == batch_size:
                    yield tuple(np.stack(column) for column in zip(*pending))
                    pending = []
            if pending and not drop_remainder:
                yield tuple(np.stack(column) for column in zip(*pending))

        return self._derived(rows, lambda dataset: dataset.batch(batch_size, drop_remainder))

    def map(self, operations, input_columns=None, output_columns=None, num_parallel_workers=None, **kwargs) -> Dataset:
        """MindSpore's ``map``: each row's `input_columns` (a name or a list; default the first
        column) passed through `operations` (one callable or a list, applied in order), the
        results in their place. Other MindSpore options (`output_columns`, ...) are refused by name.

        Example:
            >>> data = NumpySlicesDataset({"x": np.arange(3), "y": np.arange(3)}).map([lambda x: x * 10, lambda x: x + 1], "y")
            >>> [row[1].tolist() for row in data]
            [1, 11, 21]
        """
        refused = sorted(set(kwargs) | ({"output_columns"} if output_columns is not None else set()))
        if refused:
            raise ConfigError(f"Dataset.map: {refused[0]!r} is not supported (operations and input_columns are)")
        names = [input_columns] if isinstance(input_columns, str) else list(input_columns or (self.column_names or [])[:1])
        unknown = [name for name in names if name not in (self.column_names or ())]
        if unknown or not names:
            raise ConfigError(f"Dataset.map: input_columns must name columns of {self.column_names}, got {input_columns!r}")
        steps = list(operations) if isinstance(operations, (list, tuple)) else [operations]
        positions = [self.column_names.index(name) for name in names]

        def rows():
            for row in self:
                values = [row[position] for position in positions]
                for step in steps:
                    values = step(*values)
                    values = list(values) if isinstance(values, tuple) else [values]
                changed = list(row)
                for position, value in zip(positions, values):
                    changed[position] = value
                yield tuple(changed)

        return self._derived(rows, lambda dataset: dataset.map(operations, input_columns))

    def get_dataset_size(self) -> int:
        return sum(1 for _ in self)

    def create_tuple_iterator(self, num_epochs: int = 1, output_numpy: bool = True):
        """The rows as tuples of arrays (`output_numpy` False: of Tensors), `num_epochs` times."""
        for _ in range(num_epochs):
            for row in self:
                yield row if output_numpy else tuple(Tensor(value) for value in row)


def GeneratorDataset(source, column_names=None, shuffle: bool = True, num_parallel_workers=None) -> Dataset:  # noqa: N802
    """MindSpore's ``GeneratorDataset``: rows from a callable returning an iterator, an iterable,
    or an object with ``__getitem__`` and ``__len__``. Rows keep their order (`shuffle` would
    give every rank and the stand-alone reference different batches).

    Example:
        >>> [row[0].tolist() for row in GeneratorDataset(lambda: iter([[1], [2]]), ["x"])]
        [1, 2]
    """
    if callable(source) and not hasattr(source, "__getitem__"):
        rows = source
    elif hasattr(source, "__getitem__") and hasattr(source, "__len__"):
        def rows():
            return (source[index] for index in range(len(source)))
    elif hasattr(source, "__iter__"):
        def rows():
            return iter(source)
    else:
        raise ConfigError(f"GeneratorDataset: expected a generator function, an iterable or a random-access source, "
                          f"got {type(source).__name__}")
    return Dataset(rows, column_names)


def NumpySlicesDataset(data, column_names=None, shuffle: bool = True) -> Dataset:  # noqa: N802
    """MindSpore's ``NumpySlicesDataset``: row i of a dict, tuple or list of arrays is every
    column's element i (a single array: one column)."""
    columns = list(data.values()) if isinstance(data, dict) else list(data) if isinstance(data, tuple) else [data]
    names = column_names or (list(data) if isinstance(data, dict) else None)
    arrays = [np.asarray(column) for column in columns]
    if not arrays or len({len(array) for array in arrays}) != 1:
        raise ConfigError(f"NumpySlicesDataset: expected columns of one length, got lengths {[len(a) for a in arrays]}")

    def rows():
        return (tuple(array[index] for array in arrays) for index in range(len(arrays[0])))

    return Dataset(rows, names)
