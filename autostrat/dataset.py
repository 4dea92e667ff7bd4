"""MindSpore's ``mindspore.dataset``: `GeneratorDataset`, `NumpySlicesDataset` (thin face).

Example:
    >>> import numpy as np
    >>> import autostrat.dataset as ds
    >>> [batch[0].shape for batch in ds.NumpySlicesDataset(np.zeros((4, 3)), shuffle=False).batch(2)]
    [(2, 3), (2, 3)]
"""

from autostrat.frontend.dataset import Dataset, GeneratorDataset, NumpySlicesDataset

__all__ = ["Dataset", "GeneratorDataset", "NumpySlicesDataset"]
