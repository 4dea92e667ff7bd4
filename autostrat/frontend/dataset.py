"""MindSpore's datasets, the part a training script uses: `GeneratorDataset`,
`NumpySlicesDataset` and ``.batch``. A dataset yields tuples of numpy arrays, one per column;
`Model.train` reads it once per call and iterates the steps from those batches.

Every rank reads the whole dataset (each takes its slices of the batch, as MindSpore's
``full_batch``): the data is small next to what a plan moves, and ranks agree without sharding
the files.
"""

from __future__ import annotations

import numpy as np

from autostrat.errors import ConfigError
from autostrat.frontend.tensor import Tensor


class Dataset:
    """Rows of columns, batched or not; iterate it for tuples of arrays."""

    def __init__(self, rows, column_names):
        self._rows, self.column_names = rows, list(column_names) if column_names else None

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

        return Dataset(rows, self.column_names)

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
