"""Run under mpiexec (8 ranks): the nets of the 2-D tensor-parallel sample (``enable_nd_tp``) and
of the advanced operator-parallel sample (a dim over two axes), with their shard calls, each
trained 2 steps with SGD, one process per rank, and compared with one device. Rank 0 prints each
report; the exit status is 1 when a check fails."""

from __future__ import annotations

import sys

import autostrat as ms
from autostrat import nn
from autostrat.frontend.train import TrainOneStepCell, WithLossCell, train
from tests.test_layout_2d import advanced_net, high_dimension_net


def main() -> int:
    failed = 0
    for make, shape, rows in ((high_dimension_net, (1024, 256), 1024), (advanced_net, (32, 784), 32)):
        ms.reset_auto_parallel_context()
        ms.set_auto_parallel_context(parallel_mode="semi_auto_parallel", device_num=8)
        net = make()
        loss = WithLossCell(net, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"))
        cell = TrainOneStepCell(loss, nn.SGD(net.trainable_params(), 1e-2))
        report = train(cell, (nn.Tensor(shape=shape), nn.Tensor(shape=(rows,), dtype=ms.int32)), steps=2, log=None)
        if report is not None:  # rank 0
            print(f"{make.__name__}:\n{report.text}", flush=True)
            failed += not report.ok
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
