"""MindSpore's sharding-propagation tutorial, as a user writes it, on autostrat — trained.

Run it on N MPI ranks with ``bash run.sh N`` (this folder), or as one process with
``RANK_SIZE=8 python train.py`` (the 8 ranks then run as threads). It plans for the world it
runs in (``init()``, ``get_group_size()``), prints the plan, trains the tutorial FFN with a
cross-entropy loss and Momentum for 20 steps on a fixed synthetic dataset, prints the loss of
every step, then the same training on one device and the equality check.
"""

import math
import sys

from autostrat import nn, ops, set_auto_parallel_context
from autostrat.communication import get_group_size, init
from autostrat.frontend.tensor import initializer
from autostrat.frontend.train import train


class Dense(nn.Cell):
    def __init__(self, in_channels, out_channels):
        super().__init__()
        self.weight = nn.Parameter(initializer("normal", [in_channels, out_channels]), name="weight")
        self.bias = nn.Parameter(initializer("zeros", [out_channels]), name="bias")
        self.matmul = ops.MatMul()
        self.add = ops.Add()

    def construct(self, x):
        return self.add(self.matmul(x, self.weight), self.bias)


class FFN(nn.Cell):
    def __init__(self):
        super().__init__()
        self.dense1 = Dense(64, 64)
        self.relu = ops.ReLU()
        self.dense2 = Dense(64, 64)

    def construct(self, x):
        x = self.dense1(x)
        x = self.relu(x)
        x = self.dense2(x)
        return x


init()
rank_size = get_group_size()
# The tutorial's seed ((2, 1), (1, 4)) is for 8 devices. On another world keep the share of it
# that fits, by the rule `autostrat run` applies to a config's seeds: gcd(8, N) devices, rows
# given up first. Devices it leaves over repeat the work (fully_use_devices=False).
rows = 2 if rank_size % 8 == 0 else 1
columns = math.gcd(4, rank_size // rows)
set_auto_parallel_context(parallel_mode="auto_parallel", search_mode="sharding_propagation", device_num=rank_size,
                          fully_use_devices=rows * columns == rank_size)
net = FFN()
net.dense1.matmul.shard(((rows, 1), (1, columns)))
loss = nn.WithLossCell(net, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"))
train_net = nn.TrainOneStepCell(loss, nn.Momentum(net.trainable_params(), learning_rate=0.1, momentum=0.9))

inputs = (nn.Tensor(shape=(64, 64)), nn.Tensor(shape=(64,), dtype="int32"))
report = train(train_net, inputs, steps=20)
if report is not None:  # rank 0
    print(report.text, flush=True)
    sys.exit(0 if report.ok else 1)
