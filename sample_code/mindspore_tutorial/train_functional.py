"""A MindSpore 2.x functional training loop as a MindSpore user writes it: value_and_grad over
a forward function, a jit-decorated step, optimizer(grads), the dataset's tuple iterator. Only
the imports changed ("mindspore" -> "autostrat"). `run.sh functional` launches it; with
AUTOSTRAT_CHECK=1 every planned step's loss and parameters are checked against one device.
"""

import numpy as np

import autostrat as ms                        # import mindspore as ms
import autostrat.dataset as ds                # import mindspore.dataset as ds
from autostrat import nn, ops                 # from mindspore import nn, ops
from autostrat.communication import init      # from mindspore.communication import init

ms.set_context(mode=ms.GRAPH_MODE)
ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.AUTO_PARALLEL, search_mode="sharding_propagation")
init()
ms.set_seed(1)


class Network(nn.Cell):
    def __init__(self):
        super().__init__()
        self.layer1 = nn.Dense(32, 64)
        self.relu = ops.ReLU()
        self.layer2 = nn.Dense(64, 10)

    def construct(self, x):
        return self.layer2(self.relu(self.layer1(x)))


net = Network()
net.relu.shard(((2, 4),))
loss_fn = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
optimizer = nn.Adam(net.trainable_params(), learning_rate=1e-3)


def forward_fn(data, label):
    logits = net(data)
    loss = loss_fn(logits, label)
    return loss, logits


grad_fn = ms.value_and_grad(forward_fn, None, optimizer.parameters, has_aux=True)


@ms.jit
def train_step(data, label):
    (loss, _), grads = grad_fn(data, label)
    optimizer(grads)
    return loss


rng = np.random.default_rng(0)
dataset = ds.NumpySlicesDataset((rng.standard_normal((64, 32)).astype(np.float32), rng.integers(0, 10, 64).astype(np.int32)),
                                column_names=["data", "label"], shuffle=False).batch(16)
for epoch in range(2):
    for step, (data, label) in enumerate(dataset.create_tuple_iterator()):
        loss = train_step(data, label)
        print(f"epoch: {epoch + 1} step: {step + 1}, loss is {loss}")
