"""MindSpore's ``mindspore.dataset``: `GeneratorDataset`, `NumpySlicesDataset`, `MnistDataset`, and
the `vision` and `transforms` modules (thin face).

Example:
    >>> import numpy as np
    >>> import autostrat.dataset as ds
    >>> [batch[0].shape for batch in ds.NumpySlicesDataset(np.zeros((4, 3)), shuffle=False).batch(2)]
    [(2, 3), (2, 3)]
    >>> ds.vision.HWC2CHW()(np.zeros((28, 28, 1))).shape
    (1, 28, 28)
"""

from autostrat.dataset import transforms, vision
from autostrat.frontend.dataset import Dataset, GeneratorDataset, NumpySlicesDataset
from autostrat.frontend.mnist import MnistDataset

__all__ = ["Dataset", "GeneratorDataset", "MnistDataset", "NumpySlicesDataset", "transforms", "vision"]
