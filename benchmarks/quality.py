"""Issues #15 and #17: how good the training plans are, against Megatron-LM's, data parallelism and pipelines.

Models (training steps with Adam, float32):

- stack-8/32/96: `autostrat.models.TransformerStack` (B=16, S=128, H=1024, 16 heads, FFN 4H) of
  8, 32 and 96 blocks on 8 devices;
- 7b: LLaMA-7B-shaped `GPT` (32 layers, hidden 4096, 32 heads, seq 2048, vocab 32000, one
  sequence per device) on 64 devices.

Rows per model:

- megatron: Megatron-LM's tensor parallelism inside a server (TP 8) x data parallelism across
  servers, seeded on every block and propagated;
- data parallel: parallel_mode data_parallel (every batch dim split, weights replicated);
- bfs: the same Megatron seeds on block 0 only, propagated (search_mode sharding_propagation);
- refined: that BFS plan refined by CP-SAT for the predicted step time (cost_model "time",
  ``--coarsen layers``) under a per-device memory
  budget equal to the Megatron plan's peak.

Columns: bytes per device per phase (forward, backward, gradient sync), total, peak memory per
device (parameters, optimiser state and live activations: `search.memory`), predicted step
time, search seconds (tracing excluded), the refinement's status; below the table, per model,
the redistribution pairs priced unreachable, those left to the planner's constructive
fallback and the timed searches stopped at their budget (`search.TIMED_BUDGET`, whose pairs
are not proven optimal: `redistribution.planner`) (issue #32). Targets: refined predicted
time <= every baseline's; bfs predicted time <= 1.1 x megatron's; the 7b refined row within
60 s of search and 2 GB (issue #32).

Recorded (issue #32, 2 shared cores, `/usr/bin/time -v` for the memory): the 7b refined row
OPTIMAL at 631.836 ms in 44.3 s of search, 1.10 GB (41.5 s, 0.75 GB with
``--pricing-processes 2``), two solves (the first plan's copies peak over the budget); before
fanouts of one structure were merged (`search.sharing.merged_fanouts`) it ended FEASIBLE at its
60 s limit with the 660.930 ms start, and needed 85-123 s to prove the same plan.

Pipeline rows (``--pipeline DEVICES``, issue #17): the 7b shape on each device count with one
sequence per device (a global batch of 64 sequences on 64 devices, 1024 on 1024), each row
under the per-device budget ``--budget`` (80 GB):

- megatron: no pipeline, the megatron plan above on all the devices (the cheapest to compute;
  its peak is over the budget if the row says so);
- refined (with ``--refined``): no pipeline, the refined plan above, its budget ``--budget``;
  off by default: 47 s on 64 devices (604.3 ms, 2026-12-03; about 6 minutes before
  `search.sharing.merged_fanouts`), and on 1024 it ran 17 minutes and out of 21 GB of memory
  before finishing (a 2-core, 23 GB machine; not re-run since);
- S stages (``--stages``, default 2 4 8): the devices in S equal groups, each running one
  micro-batch of ``batch / m`` sequences with the same Megatron seeds on its own devices, the
  stage split of the 34 units (embedding, 32 blocks, head and loss) searched by
  `search.pipeline.plan_pipeline` under the budget, 1F1B. ``m = 8 S`` micro-batches: a stage's
  ``device_num / S`` devices are TP 8 x ``device_num / 8S`` data-parallel replicas, and one
  sequence per replica is the smallest micro-batch a replica can take (an uneven batch split is
  rejected), so the most micro-batches and the smallest bubble, ``(S - 1) / (9 S - 1)`` with
  equal slots.

Pipeline columns: layers (blocks) per stage; the slowest stage's slot (one micro-batch's forward,
backward and sends); the predicted step time (1F1B's orders simulated on the stages' F, B
and W times, plus the slowest stage's gradient synchronisation and updates, which run once per
step: `search.pipeline.Pipeline.step_time_ns`; without a pipeline the plan's prediction); the
bubble (the devices' idle share of the simulated step: `search.stages.StageSplit.bubble`);
the largest stage's peak per device by the split's model (weights and optimiser state plus
1F1B's in-flight micro-batches' activations, replayed from the orders:
`search.schedule_split.group_peaks`; without a pipeline the plan's exact peak); and the seconds to trace, search and split (tracing included here, unlike the table above).
Target: <= 15 s per row at 1024 devices.

Collective algorithms and buckets (issue #37): ``--collectives ring`` plans and prices every
collective as a flat ring, as before `cost.algorithms` (`ring_collectives`; default ``chosen``:
each step's algorithm chosen by the plan's objective, hierarchical across servers under bytes);
``--bucket-bytes 25MB`` puts the no-pipeline row's gradient synchronisation in buckets
overlapped with its backward (`cost.overlap`; a pipeline's synchronisation runs after its last
micro-batch and is not bucketed; a bucket's AllReduces over one group run as one, `search.fusion`).
Measured 2026-12-02 at 1024 devices (load 2-9; step ms, the fastest row in brackets):

  collectives, buckets   no pipeline   2 stages   4 stages   8 stages
  ring, none             2,670.9       1,201.8    845.8      789.3     (8 stages)
  chosen, none           1,242.3       833.4      739.5      749.6     (4 stages)
  ring, 25MB             1,150.4       1,201.8    845.8      789.3     (8 stages)
  chosen, 25MB           642.9         833.4      739.5      749.6     (no pipeline)

The no-pipeline step's sync is 2,131.8 ms as rings, 703.2 ms as planned (`collective_algorithms.py`:
the 196 replicated parameters' AllReduces over 1024 devices hierarchical, 2·7 messages inside a
server and 2·127 across, not 2·1023). In buckets of 25 MB its 517 sync edges fill 196 buckets
and run as 228 collectives: 386 edges fused into 97 AllReduces (65 hierarchical over the 1024
devices, 32 rings over 128), the rest alone: 98 AllReduces alone in their bucket (66 of
gradients as large as a bucket, 32 whose neighbour did not fit), 32 ReduceScatter-ReduceScatter-
AllGather chains and an AllGather, which do not fuse. That sync
takes 405.9 ms on the stream, of which the 305 ms backward hides 302 ms: 103.8 ms stay
exposed, against 401 ms before fusing (when every edge paid its own latencies; the step was
940.1 ms, the ring row's 2,368.7). So with fused buckets and the chosen algorithms the
no-pipeline step (642.9 ms) beats the best pipeline (4 stages, 739.5 ms) by 1.15x; with flat
rings the 8-stage pipeline still wins (789.3 against 1,150.4 ms). The pipeline rows' sync runs
after their last micro-batch, unbucketed: bucketing them is not priced here.

Run: .venv/bin/python benchmarks/quality.py [--models stack-8 stack-32 stack-96 7b] [--time-limit 60] [--pricing-processes N]
     .venv/bin/python benchmarks/quality.py --pipeline 64 1024 [--stages 2 4 8] [--budget 80GB] [--refined]
          [--collectives chosen|ring] [--bucket-bytes 25MB]
(``--pipeline`` alone runs no model above unless ``--models`` names some; `benchmarks/pipeline.py`
runs the pipeline rows alone.)
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script: the repository is not installed

from phases import counted_pairs  # noqa: E402  (this folder is on sys.path)

from autostrat.autodiff import Adam, build_training  # noqa: E402
from autostrat.errors import AutostratError, InfeasibleError  # noqa: E402
from autostrat.frontend import trace  # noqa: E402
from autostrat.frontend.config import apply_seeds  # noqa: E402
from autostrat.frontend.context import parse_bytes  # noqa: E402
from autostrat.models import GPT, TransformerStack, megatron_seeds  # noqa: E402
from autostrat.search import SearchOptions, search  # noqa: E402
from autostrat.search.pipeline import plan_pipeline  # noqa: E402
from autostrat.tables import format_table  # noqa: E402

LLAMA_7B = {"layers": 32, "hidden": 4096, "heads": 32, "seq": 2048, "vocab": 32000}


def llama_7b(batch: int) -> GPT:
    """The LLaMA-7B shape ("7b") with `batch` sequences."""
    return GPT(**LLAMA_7B, batch=batch)


MODELS = {
    "stack-8": (8, lambda: TransformerStack(layers=8, hidden=1024, heads=16, seq=128, batch=16)),
    "stack-32": (8, lambda: TransformerStack(layers=32, hidden=1024, heads=16, seq=128, batch=16)),
    "stack-96": (8, lambda: TransformerStack(layers=96, hidden=1024, heads=16, seq=128, batch=16)),
    "7b": (64, lambda: llama_7b(64)),
}
TENSOR_PARALLEL = 8  # Megatron-LM's TP inside one 8-device server
HEADERS = ["model", "devices", "plan", "forward MB", "backward MB", "sync MB", "total MB", "peak MB",
           "step ms", "search s", "status"]
PIPELINE_HEADERS = ["devices", "plan", "micro-batches", "layers per stage", "slot ms", "step ms", "bubble", "peak GB",
                    "search s"]


def training_graph(net, device_num: int, seeds: dict | None, recompute: tuple[str, ...] = ()):
    graph = trace(net, *net.example_inputs(), device_num=device_num)
    if seeds:
        graph = apply_seeds(graph, seeds, device_num)
    return build_training(graph, Adam(1e-3), recompute=recompute)


def timed(call):
    """What `call()` returns, and the seconds it took."""
    started = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # unreached ops' warnings: the table says what matters
        result = call()
    return result, time.perf_counter() - started


def timed_search(graph, device_num: int, options: SearchOptions):
    return timed(lambda: search(graph, device_num, options))


def refined_options(budget: int, time_limit: float, processes: int = 0) -> SearchOptions:
    """The refined rows' search: CP-SAT for the predicted step time under `budget` bytes per device,
    its cost tables priced by `processes` processes (above 1: `SearchOptions.pricing_processes`)."""
    return SearchOptions(refine="cpsat", coarsen="layers", max_device_memory=budget, refine_time_limit=time_limit,
                         cost_model="time", pricing_processes=processes)


def row(model: str, device_num: int, name: str, plan, seconds: float) -> list[str]:
    phases, prediction = plan.phase_bytes(), plan.prediction
    status = plan.refinement.result.status if plan.refinement else "-"
    return [model, str(device_num), name, *(f"{phases[p] / 1e6:,.1f}" for p in ("forward", "backward", "sync")),
            f"{plan.total_bytes / 1e6:,.1f}", f"{prediction.peak_bytes / 1e6:,.1f}",
            f"{prediction.step_time_ns / 1e6:,.3f}", f"{seconds:.2f}", status]


def model_rows(model: str, time_limit: float, processes: int = 0) -> tuple[list[list[str]], list[str]]:
    """The four plans of one model, and the targets they meet or miss."""
    device_num, build = MODELS[model]
    layers = len(build().blocks)
    data = device_num // TENSOR_PARALLEL
    megatron_graph = training_graph(build(), device_num, megatron_seeds(layers, TENSOR_PARALLEL, data_parallel=data))
    first_block = training_graph(build(), device_num, megatron_seeds(layers, TENSOR_PARALLEL, True, data_parallel=data))
    plans = {}
    plans["megatron"] = timed_search(megatron_graph, device_num, SearchOptions())
    plans["data parallel"] = timed_search(training_graph(build(), device_num, None), device_num,
                                          SearchOptions(mode="data_parallel"))
    plans["bfs"] = timed_search(first_block, device_num, SearchOptions())
    budget = plans["megatron"][0].prediction.peak_bytes
    try:
        plans["refined"] = timed_search(first_block, device_num, refined_options(budget, time_limit, processes))
    except AutostratError as error:
        print(f"{model}: refined: {error}", file=sys.stderr)
    rows = [row(model, device_num, name, plan, seconds) for name, (plan, seconds) in plans.items()]
    return rows, targets(model, {name: plan for name, (plan, _) in plans.items()})


def targets(model: str, plans: dict) -> list[str]:
    time_of = {name: plan.prediction.step_time_ns for name, plan in plans.items()}
    found = []
    ratio = time_of["bfs"] / time_of["megatron"]
    found.append(f"{model}: bfs / megatron predicted time = {ratio:.3f} ({'met' if ratio <= 1.1 else 'missed'}: <= 1.1)")
    if "refined" not in time_of:
        return found + [f"{model}: refined: no plan (missed)"]
    worst = [name for name in ("megatron", "data parallel", "bfs") if time_of["refined"] > time_of[name]]
    found.append(f"{model}: refined predicted time {'<=' if not worst else '>'} every baseline's "
                 f"({'met' if not worst else 'missed: slower than ' + ', '.join(worst)})")
    return found


def megatron_7b(device_num: int, batch: int, first_block_only: bool = False):
    """The 7b training graph of `batch` sequences, Megatron's seeds (TP 8 x data parallelism) on `device_num` devices."""
    seeds = megatron_seeds(LLAMA_7B["layers"], TENSOR_PARALLEL, first_block_only,
                           data_parallel=device_num // TENSOR_PARALLEL)
    return training_graph(llama_7b(batch), device_num, seeds)


def no_pipeline_row(device_num: int, name: str, plan, seconds: float, budget: int) -> list[str]:
    """A row of a plan on all the devices: one stage, so no slot and no bubble."""
    prediction = plan.prediction
    over = " (over budget)" if prediction.peak_bytes > budget else ""
    return [str(device_num), name + over, "1", str(LLAMA_7B["layers"]), "-", f"{prediction.step_time_ns / 1e6:,.1f}",
            "0", f"{prediction.peak_bytes / 1e9:,.1f}", f"{seconds:.1f}"]


def pipelined_row(device_num: int, stages: int, budget: int) -> list[str]:
    """One pipeline row: `stages` stages, the split searched under `budget` bytes per device."""
    micro_batches = TENSOR_PARALLEL * stages  # one sequence per data-parallel replica: the module docstring
    group = device_num // stages
    options = SearchOptions(max_device_memory=budget)
    try:
        plan, seconds = timed(lambda: plan_pipeline(megatron_7b(group, device_num // micro_batches), device_num, stages,
                                                    micro_batches, options))
    except InfeasibleError as error:
        return [str(device_num), f"{stages} stages", str(micro_batches), f"no split fits: {error}", *["-"] * 5]
    split = plan.pipeline.split
    blocks = range(1, LLAMA_7B["layers"] + 1)  # units 1 to 32; unit 0 is the embedding, unit 33 the head and loss
    layers = "/".join(str(sum(unit in blocks for unit in range(first, end))) for first, end in split.bounds)
    return [str(device_num), f"{stages} stages", str(micro_batches), layers, f"{max(split.slot_ns) / 1e6:,.2f}",
            f"{plan.pipeline.step_time_ns / 1e6:,.1f}", f"{split.bubble:.3f}", f"{max(split.peak_bytes) / 1e9:,.1f}",
            f"{seconds:.1f}"]


def pipeline_rows(device_num: int, args: argparse.Namespace):
    """The pipeline rows of one device count (the module docstring), one at a time as they are found."""
    budget = parse_bytes(args.budget, "--budget")
    buckets = parse_bytes(args.bucket_bytes, "--bucket-bytes") if args.bucket_bytes != "0" else 0
    plan, seconds = timed(lambda: search(megatron_7b(device_num, device_num), device_num, SearchOptions(bucket_bytes=buckets)))
    yield no_pipeline_row(device_num, "megatron" + (f", buckets {args.bucket_bytes}" if buckets else ""), plan, seconds, budget)
    if args.refined:
        try:
            plan, seconds = timed(lambda: search(megatron_7b(device_num, device_num, True), device_num,
                                                 refined_options(budget, args.time_limit, args.pricing_processes)))
            yield no_pipeline_row(device_num, "refined", plan, seconds, budget)
        except AutostratError as error:
            print(f"{device_num} devices: refined: {error}", file=sys.stderr)
    for stages in args.stages:
        yield pipelined_row(device_num, stages, budget)


def add_pipeline_options(parser: argparse.ArgumentParser) -> None:
    """The options of the pipeline rows, shared with `benchmarks/pipeline.py`."""
    parser.add_argument("--stages", type=int, nargs="+", default=[2, 4, 8], help="pipeline stages per row (default 2 4 8)")
    parser.add_argument("--budget", default="80GB", help="per-device memory budget of the pipeline rows (default 80GB)")
    parser.add_argument("--refined", action="store_true", help="add the refined no-pipeline row (minutes)")
    parser.add_argument("--time-limit", type=float, default=60.0, help="CP-SAT seconds for the refined plans")
    parser.add_argument("--pricing-processes", type=int, default=0,
                        help="processes pricing the refined plans' cost tables (default 0: this one)")
    parser.add_argument("--bucket-bytes", default="0", help="the no-pipeline row's gradient synchronisation in buckets "
                                                            "of this size, overlapped with the backward (0: none)")
    parser.add_argument("--collectives", choices=("chosen", "ring"), default="chosen",
                        help="ring: every collective planned and priced as a flat ring (`ring_collectives`)")


def ring_collectives() -> None:
    """Every collective step of this process planned and priced as a flat ring, as before issue
    #37's algorithms (`cost.algorithms`): the algorithm candidates of a step are the ring alone.
    A what-if for ``--collectives ring``, set before anything is priced (the choices are cached)."""
    import autostrat.cost.algorithms as algorithms

    algorithms.candidate_algorithms = lambda model, kind, matrix, axes: ("ring",)


def print_pipeline(devices: list[int], args: argparse.Namespace) -> None:
    """Each pipeline row as it is found, then the table of them all."""
    if args.collectives == "ring":
        ring_collectives()
    rows = []
    for device_num in devices:
        with counted_pairs() as counts:
            for found in pipeline_rows(device_num, args):
                rows.append(found)
                print(format_table(PIPELINE_HEADERS, [found]), flush=True)
        print(f"{device_num} devices: {counts}", flush=True)
    print()
    print(format_table(PIPELINE_HEADERS, rows))


def print_models(models: list[str], time_limit: float, processes: int = 0) -> None:
    """Each model's rows as they are found, then the table of them all and the targets."""
    rows, notes = [], []
    for model in models:
        with counted_pairs() as counts:
            found, met = model_rows(model, time_limit, processes)
        rows += found
        # The pricing processes' searches are not seen here; their prices are (unreachable ones too).
        alone = " (fallbacks and budget stops: this process's searches only)" if processes > 1 else ""
        notes += met + [f"{model}: {counts}{alone}"]
        print(format_table(HEADERS, found), flush=True)
    print()
    print(format_table(HEADERS, rows))
    print("\n".join(notes))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="*", choices=list(MODELS),
                        help="models of the first table (default: all, or none with --pipeline)")
    parser.add_argument("--pipeline", type=int, nargs="+", default=[], metavar="DEVICES",
                        help="device counts of the 7b pipeline rows (e.g. 64 1024)")
    add_pipeline_options(parser)
    args = parser.parse_args()
    if args.collectives == "ring" and args.pricing_processes > 1:  # the what-if patches this process only
        parser.error("--collectives ring prices in this process only: give no --pricing-processes with it")
    models = args.models if args.models is not None else ([] if args.pipeline else list(MODELS))
    if models:
        print_models(models, args.time_limit, args.pricing_processes)
    if args.pipeline:
        print_pipeline(args.pipeline, args)


if __name__ == "__main__":
    main()
