"""A small ResNet-style conv net: a stem convolution, residual blocks of two 3x3
convolutions, global average pooling, a Dense classifier and the loss."""

from __future__ import annotations

from autostrat import ops
from autostrat.frontend.cell import Cell, CellList
from autostrat.frontend.layers import Conv2d, Dense, SoftmaxCrossEntropyWithLogits
from autostrat.models.sizes import check_sizes


class ResidualBlock(Cell):
    def __init__(self, channels: int):
        super().__init__()
        self.conv1 = Conv2d(channels, channels, 3, has_bias=True)
        self.relu1 = ops.ReLU()
        self.conv2 = Conv2d(channels, channels, 3, has_bias=True)
        self.residual = ops.Add()
        self.relu2 = ops.ReLU()

    def construct(self, x):
        y = self.conv2(self.relu1(self.conv1(x)))
        return self.relu2(self.residual(x, y))


class ResNet(Cell):
    """Inputs: images ``[batch, in_channels, size, size]`` and class labels ``[batch]``.

    Example:
        >>> net = ResNet(blocks=1, channels=8, classes=4)
        >>> net.stem.weight.shape
        (8, 3, 3, 3)
    """

    def __init__(self, blocks: int = 2, in_channels: int = 3, channels: int = 16, classes: int = 8):
        super().__init__()
        check_sizes("ResNet", blocks=blocks, in_channels=in_channels, channels=channels, classes=classes)
        self.stem = Conv2d(in_channels, channels, 3, has_bias=True)
        self.stem_relu = ops.ReLU()
        self.blocks = CellList(ResidualBlock(channels) for _ in range(blocks))
        self.pool = ops.ReduceMean()
        self.classifier = Dense(channels, classes)
        self.loss = SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")

    def construct(self, images, labels):
        x = self.stem_relu(self.stem(images))
        for block in self.blocks:
            x = block(x)
        return self.loss(self.classifier(self.pool(x, (2, 3))), labels)
