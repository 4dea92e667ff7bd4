"""Cost tables filled on demand: an entry is priced the first time a search reads it.

BFS propagation reads, of each table it crosses, the row leaving the producer's chosen
candidate or the column into the consumer's; pricing every pair up front cost tens of thousands
of redistribution searches on a GPT at 64 devices where propagation reads a small share of them.
Entries are priced by `cost_table` itself, a block of missing ones at a time, so every entry
equals the eager table's and shares its memo.
"""

from __future__ import annotations

import numpy as np

from autostrat.redistribution.table import cost_table

_INDEX = (int, np.integer)  # a key that reads one entry


class LazyCostTable:
    """An edge's cost table (rows = producer layouts, columns = consumer layouts) whose entries
    are computed when first read, then kept: bytes, or with an α–β `model` nanoseconds
    (`cost_table`).

    Reads that touch only some entries: ``t[i, j]`` (a float), ``t[i]``, ``t[i, :]`` and
    ``t[:, j]`` (fresh arrays). `full()` (or ``np.asarray(t)``, or any other index) computes
    every entry; `computed` counts the entries computed so far. Every entry is multiplied by
    `scale` (a once-per-step cost weighed against a micro-batch's: `search.problem`).

    Example:
        >>> from autostrat.layout import DeviceMatrix, Layout, TensorMap
        >>> rows = Layout(DeviceMatrix((4,)), TensorMap((0, -1)), (8, 8))
        >>> whole = Layout(DeviceMatrix((4,)), TensorMap((-1, -1)), (8, 8))
        >>> table = LazyCostTable([rows, whole], [rows, whole])
        >>> table[0, :].tolist(), table.computed, table.shape
        ([0.0, 192.0], 2, (2, 2))
        >>> table.full().tolist(), table.computed
        ([[0.0, 192.0], [0.0, 0.0]], 4)
    """

    def __init__(self, producer_layouts, consumer_layouts, dtype="float32", model=None, then=None,
                 then_dtype=None, scale: float = 1.0) -> None:
        self.scale = scale
        self.producer_layouts = tuple(producer_layouts)
        self.consumer_layouts = tuple(consumer_layouts)
        self.dtype, self.model = dtype, model
        # Per column, None or a further redistribution ``(layout, layout)`` every entry of the
        # column also pays (a sharded parameter's gather after its update, `search.problem`),
        # of a tensor in `then_dtype` (default `dtype`: a 16-bit parameter after an fp32 gradient differs).
        self.then_dtype = then_dtype or dtype
        self.then = tuple(then) if then is not None else (None,) * len(self.consumer_layouts)
        self._then = np.full(len(self.then), np.nan)  # their prices, once computed
        self._values = np.zeros((len(self.producer_layouts), len(self.consumer_layouts)))
        self._known = np.zeros(self._values.shape, dtype=bool)

    @property
    def shape(self) -> tuple[int, int]:
        return self._values.shape

    @property
    def size(self) -> int:
        return self._values.size

    @property
    def computed(self) -> int:
        """How many entries have been computed (each one redistribution price)."""
        return int(np.count_nonzero(self._known))

    def __repr__(self) -> str:
        return f"LazyCostTable(shape={self.shape}, computed={self.computed})"

    def __getitem__(self, key):
        if type(key) is tuple and len(key) == 2 and isinstance(key[0], _INDEX) and isinstance(key[1], _INDEX) and self._known[key]:
            return float(self._values[key])  # an entry known already: the searches' most frequent read
        block = _block(key)
        if block is None:  # fancy indexing (np.ix_, masks...): rare, and wants most entries anyway
            return self.full()[key]
        rows, columns = block
        self._fill(rows, columns)
        found = self._values[rows, columns]
        return float(found) if np.ndim(found) == 0 else found.copy()

    def full(self) -> np.ndarray:
        """Every entry (computing the missing ones), as a read-only array."""
        self._fill(slice(None), slice(None))
        view = self._values.view()
        view.setflags(write=False)
        return view

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        values = self.full()
        if dtype is not None:
            return values.astype(dtype)
        return values.copy() if copy else values

    def missing(self):
        """The ``(src, dst, dtype, model)`` pairs whose prices the missing entries still need: an
        entry's own, and its column's further redistribution (`then`) while unpriced.

        Example:
            >>> from autostrat.layout import DeviceMatrix, Layout, TensorMap
            >>> rows = Layout(DeviceMatrix((4,)), TensorMap((0, -1)), (8, 8))
            >>> table = LazyCostTable([rows], [rows])
            >>> len(list(table.missing())), table[0, 0], list(table.missing())
            (1, 0.0, [])
        """
        for column in np.flatnonzero(~self._known.all(axis=0)):
            pair = self.then[column]
            if pair is not None and np.isnan(self._then[column]):
                yield pair[0], pair[1], self.then_dtype, self.model
            for row in np.flatnonzero(~self._known[:, column]):
                yield self.producer_layouts[row], self.consumer_layouts[column], self.dtype, self.model

    def _fill(self, rows, columns) -> None:
        """Compute the missing entries of a block, one `cost_table` call per row or per column
        (whichever there are fewer of), or one call when the whole block is missing."""
        row_ids = np.atleast_1d(np.arange(self.shape[0])[rows])
        column_ids = np.atleast_1d(np.arange(self.shape[1])[columns])
        missing = ~self._known[np.ix_(row_ids, column_ids)]
        if not missing.any():
            return
        if missing.all():
            self._compute(row_ids, column_ids)
        elif len(row_ids) <= len(column_ids):
            for k in range(len(row_ids)):
                self._compute(row_ids[k:k + 1], column_ids[missing[k]])
        else:
            for k in range(len(column_ids)):
                self._compute(row_ids[missing[:, k]], column_ids[k:k + 1])

    def _then_costs(self, column_ids: np.ndarray) -> np.ndarray:
        """The price of each column's further redistribution (`then`), priced once per column."""
        for column in column_ids:
            if np.isnan(self._then[column]):
                pair = self.then[column]
                self._then[column] = 0.0 if pair is None else cost_table([pair[0]], [pair[1]], self.then_dtype, self.model)[0, 0]
        return self._then[column_ids]

    def _compute(self, row_ids: np.ndarray, column_ids: np.ndarray) -> None:
        if not len(row_ids) or not len(column_ids):
            return
        block = cost_table([self.producer_layouts[i] for i in row_ids], [self.consumer_layouts[j] for j in column_ids],
                           self.dtype, self.model)
        block += self._then_costs(column_ids)
        self._values[np.ix_(row_ids, column_ids)] = block * self.scale
        self._known[np.ix_(row_ids, column_ids)] = True


def _block(key):
    """``(rows, columns)``, each an int or a slice, for the keys read without filling the table;
    None for any other key."""
    if not isinstance(key, tuple):
        key = (key, slice(None))
    if len(key) != 2 or not all(isinstance(part, (int, np.integer, slice)) for part in key):
        return None
    if any(isinstance(part, bool) for part in key):
        return None
    return key
