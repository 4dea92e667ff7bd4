"""MindSpore's sharding-propagation tutorial as a MindSpore user writes it: the FFN of two
hand-written Dense cells, one MatMul seeded with ((2, 1), (1, 4)), auto_parallel with
sharding_propagation, trained with Model.train on a dataset. Only the imports changed
("mindspore" -> "autostrat"); `run.sh` in this folder launches it like MindSpore's.
"""

import numpy as np

import autostrat as ms                                  # import mindspore as ms
import autostrat.dataset as ds                          # import mindspore.dataset as ds
from autostrat import nn, ops                           # from mindspore import nn, ops
from autostrat.common.initializer import initializer    # from mindspore.common.initializer import initializer
from autostrat.communication import init                # from mindspore.communication import init
from autostrat.train import LossMonitor, Model          # from mindspore.train import LossMonitor, Model

ms.set_context(mode=ms.GRAPH_MODE, save_graphs=2, save_graphs_path="./graphs")
ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.AUTO_PARALLEL, search_mode="sharding_propagation")
init()
ms.set_seed(1)


class Dense(nn.Cell):
    def __init__(self, in_channels, out_channels):
        super().__init__()
        self.weight = ms.Parameter(initializer("normal", [in_channels, out_channels], ms.float32))
        self.bias = ms.Parameter(initializer("normal", [out_channels], ms.float32))
        self.matmul = ops.MatMul()
        self.add = ops.Add()

    def construct(self, x):
        x = self.matmul(x, self.weight)
        x = self.add(x, self.bias)
        return x


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


def create_dataset(batch_size):
    rng = np.random.default_rng(1)
    data = rng.standard_normal((4 * batch_size, 64)).astype(np.float32)
    label = rng.integers(0, 64, 4 * batch_size).astype(np.int32)
    dataset = ds.NumpySlicesDataset((data, label), column_names=["data", "label"], shuffle=False)
    return dataset.batch(batch_size)


net = FFN()
net.dense1.matmul.shard(((2, 1), (1, 4)))
loss_fn = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
optimizer = nn.Momentum(net.trainable_params(), learning_rate=0.01, momentum=0.9)
model = Model(net, loss_fn=loss_fn, optimizer=optimizer)
model.train(2, create_dataset(64), callbacks=[LossMonitor()], dataset_sink_mode=False)
