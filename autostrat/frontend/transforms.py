"""MindSpore's dataset transforms the parallel samples use, as callables on one column's numpy
value: ``vision.Rescale``, ``vision.Normalize``, ``vision.HWC2CHW`` and ``transforms.TypeCast``.

Example:
    >>> image = np.full((2, 2, 1), 255, np.uint8)
    >>> HWC2CHW()(Normalize((0.5,), (0.5,))(Rescale(1 / 255, 0)(image))).tolist()
    [[[1.0, 1.0], [1.0, 1.0]]]
"""

from __future__ import annotations

import numpy as np

from autostrat.errors import ConfigError


class Rescale:
    """``image * rescale + shift`` as float32."""

    def __init__(self, rescale: float, shift: float):
        self.rescale, self.shift = float(rescale), float(shift)

    def __call__(self, image) -> np.ndarray:
        return (np.asarray(image, np.float32) * np.float32(self.rescale) + np.float32(self.shift)).astype(np.float32)


class Normalize:
    """``(image - mean) / std`` per channel, as float32; channels last (`is_hwc`) or first."""

    def __init__(self, mean, std, is_hwc: bool = True):
        self.mean, self.std, self.is_hwc = np.asarray(mean, np.float32), np.asarray(std, np.float32), is_hwc
        if self.mean.shape != self.std.shape or self.mean.ndim != 1 or np.any(self.std <= 0):
            raise ConfigError(f"Normalize: mean and std must be sequences of one length, std positive; got mean={mean!r}, std={std!r}")

    def __call__(self, image) -> np.ndarray:
        image = np.asarray(image, np.float32)
        channels = image.shape[-1] if self.is_hwc else image.shape[0]
        if channels != len(self.mean):
            raise ConfigError(f"Normalize: {len(self.mean)} channel means for an image of {channels} channels, shape {list(image.shape)}")
        shape = (-1,) if self.is_hwc else (-1,) + (1,) * (image.ndim - 1)
        return ((image - self.mean.reshape(shape)) / self.std.reshape(shape)).astype(np.float32)


class HWC2CHW:
    """An image ``[height, width, channel]`` as ``[channel, height, width]``."""

    def __call__(self, image) -> np.ndarray:
        image = np.asarray(image)
        if image.ndim != 3:
            raise ConfigError(f"HWC2CHW: expected an image [height, width, channel], got shape {list(image.shape)}")
        return np.ascontiguousarray(image.transpose(2, 0, 1))


class TypeCast:
    """The value as `data_type` (``ms.int32``, a numpy dtype or its name)."""

    def __init__(self, data_type):
        self.dtype = np.dtype(data_type)

    def __call__(self, value) -> np.ndarray:
        return np.asarray(value).astype(self.dtype)
