"""A 2-layer GPT-style decoder trained with Adam on 8 ranks, checked against one device.

    mpiexec -n 8 python -m mpi4py train.py megatron        # Megatron-LM seeds: 4-way tensor x 2-way data
    mpiexec -n 8 python -m mpi4py train.py data_parallel   # every op splits the batch 8 ways
    python train.py megatron                               # the 8 ranks as threads of one process

Prints the loss of every step, then the stand-alone run of the same steps, the bytes per step
and the equality check; the exit status is 0 when the check passes.

It sets gradients_mean=True (the mean over replicas, one device's whole-batch gradient): summed
over 8 data-parallel replicas (MindSpore's default), the rounding noise of gradients that are
exactly zero (an attention key's bias: softmax ignores a shift) grows 8 times against Adam's
eps, Adam turns it into steps of either sign, and 20 steps end 1.5e-5 from one device's.
"""

import sys

from autostrat import nn, set_auto_parallel_context
from autostrat.frontend.train import train
from autostrat.models import GPT, megatron_seeds

MODES = ("megatron", "data_parallel")
mode = sys.argv[1] if len(sys.argv) > 1 else "megatron"
steps = int(sys.argv[2]) if len(sys.argv) > 2 else 20
if mode not in MODES:
    sys.exit(f"usage: train.py [{' | '.join(MODES)}] [STEPS]; got mode {mode!r}")

net = GPT(layers=2, batch=8)
if mode == "megatron":
    set_auto_parallel_context(parallel_mode="auto_parallel", search_mode="sharding_propagation", device_num=8,
                              gradients_mean=True)
    primitives = dict(net.primitives_and_names())
    for name, (strategy, _) in megatron_seeds(2, 4, data_parallel=2).items():
        primitives[name].shard(strategy)
else:
    set_auto_parallel_context(parallel_mode="data_parallel", device_num=8, gradients_mean=True)
train_net = nn.TrainOneStepCell(net, nn.Adam(net.trainable_params(), learning_rate=1e-3))

report = train(train_net, net.example_inputs(), steps=steps)
if report is not None:  # rank 0
    print(report.text, flush=True)
    sys.exit(0 if report.ok else 1)
