"""MindSpore's ``MnistDataset``: the MNIST idx files of a folder as rows ``(image, label)``, image
``[28, 28, 1]`` uint8 (height, width, channel) and label a uint32 scalar, sharded as MindSpore's
distributed sampler shards them.

The idx format (yann.lecun.com/exdb/mnist): a big-endian uint32 magic number (2051 for images,
2049 for labels), the item count (and for images the row and column counts), then one byte per
pixel or label. MindSpore reads ``train-*`` for usage "train", ``t10k-*`` for "test" and both,
train first, for "all" (the default).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from autostrat.errors import ConfigError
from autostrat.frontend.dataset import Dataset

_PREFIXES = {"train": ("train",), "test": ("t10k",), "all": ("train", "t10k")}


def _read_idx(path: Path, magic: int, header_words: int) -> np.ndarray:
    """The items of one idx file, checked against its header."""
    data = path.read_bytes()
    header = np.frombuffer(data[: 4 * header_words], dtype=">u4") if len(data) >= 4 * header_words else np.zeros(0)
    if len(header) != header_words or header[0] != magic:
        raise ConfigError(f"MnistDataset: {path} is not an MNIST idx file (expected magic number {magic}, "
                          f"got {int(header[0]) if len(header) else 'a file of ' + str(len(data)) + ' bytes'})")
    shape = tuple(int(size) for size in header[1:])
    body = np.frombuffer(data[4 * header_words:], dtype=np.uint8)
    if body.size != math.prod(shape):
        raise ConfigError(f"MnistDataset: {path} holds {body.size} bytes after its header, its header says {list(shape)}")
    return body.reshape(shape)


def read_mnist(dataset_dir, usage: str = "all") -> tuple[np.ndarray, np.ndarray]:
    """Images ``[n, 28, 28, 1]`` uint8 and labels ``[n]`` uint32 of the idx files in `dataset_dir`.

    Example:
        >>> import tempfile
        >>> folder = Path(tempfile.mkdtemp())
        >>> _ = (folder / "train-images-idx3-ubyte").write_bytes(np.array([2051, 1, 28, 28], ">u4").tobytes() + bytes(784))
        >>> _ = (folder / "train-labels-idx1-ubyte").write_bytes(np.array([2049, 1], ">u4").tobytes() + bytes([7]))
        >>> images, labels = read_mnist(folder)
        >>> images.shape, labels.tolist()
        ((1, 28, 28, 1), [7])
    """
    if usage not in _PREFIXES:
        raise ConfigError(f"MnistDataset: usage must be 'train', 'test' or 'all', got {usage!r}")
    folder = Path(dataset_dir)
    images, labels = [], []
    for prefix in _PREFIXES[usage]:
        image_file, label_file = folder / f"{prefix}-images-idx3-ubyte", folder / f"{prefix}-labels-idx1-ubyte"
        if image_file.exists() and label_file.exists():
            images.append(_read_idx(image_file, 2051, 4)[..., None])
            labels.append(_read_idx(label_file, 2049, 2).astype(np.uint32))
            if len(images[-1]) != len(labels[-1]):
                raise ConfigError(f"MnistDataset: {image_file} holds {len(images[-1])} images but {label_file} "
                                  f"{len(labels[-1])} labels")
    if not images:
        raise ConfigError(f"MnistDataset: expected {' and '.join(p + '-images-idx3-ubyte' for p in _PREFIXES[usage])} "
                          f"with its labels file in {folder}, found none")
    return np.concatenate(images), np.concatenate(labels)


def shard_indices(count: int, num_shards: int | None, shard_id: int | None, order: np.ndarray) -> np.ndarray:
    """The rows shard `shard_id` of `num_shards` reads, in `order` (a permutation of the rows):
    MindSpore's distributed sampler deals the rows out in turn (shard i reads rows i, i + n,
    i + 2n ...) and wraps around so that every shard reads ceil(count / n) rows.

    Example:
        >>> shard_indices(5, 2, 1, np.arange(5)).tolist(), shard_indices(5, None, None, np.arange(5)).tolist()
        ([1, 3, 0], [0, 1, 2, 3, 4])
    """
    if num_shards is None:
        return order
    per_shard = -(-count // num_shards)
    return order[(np.arange(per_shard) * num_shards + shard_id) % count]


def _check_shards(num_shards, shard_id) -> None:
    if num_shards is None and shard_id is None:
        return
    if not isinstance(num_shards, int) or num_shards < 1 or not isinstance(shard_id, int) or not 0 <= shard_id < num_shards:
        raise ConfigError(f"MnistDataset: num_shards must be a positive integer and shard_id one of 0..num_shards-1, "
                          f"got num_shards={num_shards!r}, shard_id={shard_id!r}")


def MnistDataset(dataset_dir, usage=None, num_samples=None, num_parallel_workers=None, shuffle=None, sampler=None,  # noqa: N802
                 num_shards=None, shard_id=None, cache=None) -> Dataset:
    """MindSpore's ``MnistDataset``: columns ``image`` and ``label`` of the idx files in
    `dataset_dir` (see `read_mnist`), this shard's rows when `num_shards` and `shard_id` are
    given (see `shard_indices`), at most `num_samples` of them. `shuffle` (default on, as MindSpore's) permutes the rows before
    sharding with a generator seeded by the pass over the data (0, 1, ...): the same order on
    every rank, a new one each epoch; MindSpore's own order is not reproduced. `sampler` and
    `cache` are refused.

    Example:
        >>> MnistDataset("/nonexistent", sampler=object())
        Traceback (most recent call last):
        autostrat.errors.ConfigError: MnistDataset: sampler is not supported (shuffle, num_shards and shard_id choose the rows)
    """
    for name, value in (("sampler", sampler), ("cache", cache)):
        if value is not None:
            raise ConfigError(f"MnistDataset: {name} is not supported (shuffle, num_shards and shard_id choose the rows)")
    _check_shards(num_shards, shard_id)
    images, labels = read_mnist(dataset_dir, usage or "all")
    passes = iter(range(1 << 62))

    def rows():
        order = np.arange(len(labels))
        if shuffle is None or shuffle:
            order = np.random.default_rng(next(passes)).permutation(len(labels))
        chosen = shard_indices(len(labels), num_shards, shard_id, order)[:num_samples]  # num_samples: per shard
        return ((images[index], labels[index]) for index in chosen)

    if num_shards is None:
        return Dataset(rows, ["image", "label"])
    return Dataset(rows, ["image", "label"], num_shards, lambda other: MnistDataset(
        dataset_dir, usage, num_samples, num_parallel_workers, shuffle, sampler, num_shards, other, cache))
