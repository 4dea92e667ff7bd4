"""Run under mpiexec (``python -m mpi4py tests/mpi_sharded_training.py DATA OUT``): every rank
reads its own shard of the MNIST files in DATA (MindSpore's ``num_shards``/``shard_id``) and
trains `tests.test_mindspore_samples`'s network with Model.train, full_batch=False, its first
layer split by its weight's rows (every rank computes on the whole global batch); rank 0 saves
the trained parameters to OUT (an .npz), which the test compares with one device trained on
the ranks' rows together."""

from __future__ import annotations

import sys

import autostrat as ms
import autostrat.dataset as ds
from autostrat.communication import get_group_size, get_rank, init
from tests.test_mindspore_samples import _mnist_model, _sample_pipeline


def main(data: str, out: str) -> None:
    init()
    net, model = _mnist_model(get_group_size(), model_parallel=True, gradients_mean=True)
    model.train(2, _sample_pipeline(ds.MnistDataset(data, num_shards=get_group_size(), shard_id=get_rank(), shuffle=False), 4))
    if get_rank() == 0:
        ms.save_checkpoint(net, out)


if __name__ == "__main__":
    main(*sys.argv[1:])
