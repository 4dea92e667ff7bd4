"""Pipeline training on 8 ranks, checked against one device.

    mpiexec -n 8 python -m mpi4py train.py gpt 2          # the 2-layer GPT sample as 2 stages x 4 devices
    mpiexec -n 8 python -m mpi4py train.py stack 4 gpipe  # a 4-block stack as 4 stages x 2 devices, GPipe
    mpiexec -n 8 python -m mpi4py train.py all 5          # both models as 2 x 4 and 4 x 2, 5 steps each
    python train.py gpt 2                                 # the 8 ranks as threads of one process

Arguments: the model (gpt or stack), the number of stages (dividing 8), the schedule (1f1b,
default, or gpipe), the steps (default 10), and "marked" to set every block's
``pipeline_stage`` by hand instead of letting the split be searched. Every block is seeded with
Megatron-LM's tensor parallelism over a stage's devices; each step runs 4 micro-batches.

Prints the plan (with each op's stage), the loss of every step next to the stand-alone run of
the whole batch, the bytes per step (phase "pipeline": sends between stages), the bubble and
the memory per rank; the exit status is 0 when every run equals the stand-alone run.
"""

import sys

from autostrat import nn, reset_auto_parallel_context, set_auto_parallel_context
from autostrat.frontend.train import train
from autostrat.models import GPT, TransformerStack, megatron_seeds

MODELS = {
    "gpt": (2, lambda: GPT(layers=2, hidden=64, heads=8, seq=16, batch=8, vocab=128)),
    "stack": (4, lambda: TransformerStack(layers=4, hidden=64, heads=8, seq=16, batch=8)),
}
ALL = (("gpt", 2, "1f1b", False), ("gpt", 4, "1f1b", False), ("stack", 2, "1f1b", False), ("stack", 4, "gpipe", True))


def run(model: str, stages: int, schedule: str, steps: int, marked: bool) -> bool:
    """Train one model as `stages` stages; True when it equals the stand-alone run (rank 0)."""
    layers, build = MODELS[model]
    net = build()
    reset_auto_parallel_context()
    set_auto_parallel_context(parallel_mode="auto_parallel", search_mode="sharding_propagation", device_num=8,
                              pipeline_stages=stages, pipeline_config={"pipeline_scheduler": schedule})
    primitives = dict(net.primitives_and_names())
    for name, (strategy, _) in megatron_seeds(layers, 8 // stages).items():
        primitives[name].shard(strategy)
    if marked:  # the blocks spread evenly over the stages, by hand
        for index, block in enumerate(net.blocks):
            block.pipeline_stage = index * stages // layers
    cell = nn.TrainOneStepCell(nn.PipelineCell(net, micro_size=4), nn.Adam(net.trainable_params(), learning_rate=1e-3))
    report = train(cell, net.example_inputs(), steps=steps)
    if report is None:  # not rank 0
        return True
    print(report.text, f"\n{model} as {stages} stages ({schedule}): {'OK' if report.ok else 'FAILED'}\n", flush=True)
    return report.ok


args = sys.argv[1:]
marked = "marked" in args
args = [a for a in args if a != "marked"]
if args[:1] == ["all"]:
    steps = int(args[1]) if len(args) > 1 else 10
    cases = [(model, stages, schedule, steps, mark) for model, stages, schedule, mark in ALL]
else:
    model = args[0] if args else "gpt"
    stages = int(args[1]) if len(args) > 1 else 2
    if model not in MODELS or 8 % stages:
        sys.exit(f"usage: train.py [gpt | stack | all] [STAGES dividing 8] [1f1b | gpipe] [STEPS] [marked]; got {sys.argv[1:]}")
    cases = [(model, stages, args[2] if len(args) > 2 else "1f1b", int(args[3]) if len(args) > 3 else 10, marked)]
sys.exit(0 if all([run(*case) for case in cases]) else 1)
