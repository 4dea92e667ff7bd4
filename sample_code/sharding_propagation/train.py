"""MindSpore's sharding-propagation tutorial, as a user writes it, on autostrat.

Run it on 8 MPI ranks with ``bash run.sh 8`` (this folder), or as one process with
``python train.py`` (the 8 ranks then run as threads). Until training lands, it runs forward
passes on random batches and checks every one against the single-device result.
"""

import sys

from autostrat import nn, ops, set_auto_parallel_context
from autostrat.frontend.run import run_forward
from autostrat.frontend.tensor import initializer


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


set_auto_parallel_context(parallel_mode="auto_parallel", search_mode="sharding_propagation", device_num=8)
net = FFN()
net.dense1.matmul.shard(((2, 1), (1, 4)))

check = run_forward(net, nn.Tensor(shape=(64, 64)), steps=3)
if check is not None:  # rank 0
    print(check.text, flush=True)
    sys.exit(0 if check.ok else 1)
