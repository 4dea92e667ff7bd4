"""`parallelize`: trace a Cell under the current parallel context and search its plan."""

from __future__ import annotations

import warnings
from dataclasses import replace

from autostrat.autodiff import Momentum, build_training, op_phase
from autostrat.autodiff.recompute import in_cell
from autostrat.errors import ConfigError
from autostrat.frontend.cell import recomputed_cells
from autostrat.frontend.config import apply_seeds, check_op_names
from autostrat.frontend.context import ParallelContext, current_context
from autostrat.frontend.ms_context import graphs_folder
from autostrat.frontend.pipeline import pipeline_parts, plan_pipeline_for
from autostrat.frontend.tracing import trace
from autostrat.search import Plan, load_checkpoint_seeds, search, seeds_by_phase
from autostrat.search.mindspore_checkpoint import read_mindspore_plan, resolve_names
from autostrat.search.recompute_choice import choose_recompute, repeated_layers


def training_parts(net, context: ParallelContext, optimizer=None) -> tuple:
    """The network to trace and the optimiser of a training plan (None: plan a forward pass).
    A `TrainOneStepCell` brings its own; ``phase="train"`` without one uses Momentum(0.01, 0.9)."""
    parts = getattr(net, "train_parts", None)
    if parts is not None:
        net, own = parts()
        return net, optimizer or own
    if optimizer is None and context.phase == "train":
        optimizer = Momentum(0.01, 0.9)
    return net, optimizer


def plan_for(net, inputs, context: ParallelContext, seeds: dict | None = None, progress=None, optimizer=None,
             recompute: tuple[str, ...] = ()) -> Plan:
    """Trace, add seeds (from `seeds`, then the strategy checkpoint), build the training graph
    when training (see `training_parts`), with the cells `net` marks (`Cell.recompute`) and the
    cell paths `recompute` recomputed in the backward, search, save the checkpoint.

    A training plan's strategy checkpoint seeds the forward ops; its backward and update ops
    are rebuilt, and ignored when planning a forward pass. Seeds of backward ops (autostrat's
    own: MindSpore derives them) are applied to the training graph, after it is built.

    Example (a product's weight gradient seeded as its forward is split):
        >>> from autostrat.autodiff import SGD
        >>> from autostrat.frontend.context import ParallelContext
        >>> from autostrat.models import FFN
        >>> from autostrat.nn import Tensor
        >>> context = ParallelContext(device_num=4, parallel_mode="semi_auto_parallel")
        >>> seeds = {"dense1.matmul": (((1, 1), (1, 4)), None), "bprop/dense1.matmul/mat_mul_1": (((1, 1), (1, 4)), None)}
        >>> plan = plan_for(FFN(), (Tensor(shape=(64, 64)),), context, seeds, optimizer=SGD())
        >>> plan.ops["bprop/dense1.matmul/mat_mul_1"].origin
        'seed'
    """
    net, optimizer = training_parts(net, context, optimizer)
    net, micro_batches = pipeline_parts(net)
    where = context.strategy_ckpt_load_file
    mindspore = read_mindspore_plan(where) if where else None  # (seeds, parameter layouts) of a checkpoint MindSpore saved
    checkpoint = seeds_by_phase(load_checkpoint_seeds(where)) if where and mindspore is None else {}
    seeds, backward_seeds = _by_phase(seeds or {})

    def seeded(graph, device_num: int):
        graph = apply_seeds(graph, seeds, device_num) if seeds else graph
        if mindspore:
            saved, layouts = mindspore
            return apply_seeds(graph, resolve_names(graph, saved, where, layouts), device_num, where=where)
        return apply_seeds(graph, checkpoint["forward"], device_num, where=where) if checkpoint else graph

    schedule, chunks = context.pipeline_schedule_chunks()
    chunks = chunks or 1  # auto without pipeline_interleave_num: the search chooses them
    if context.pipeline_stages > 1 or micro_batches > 1 or chunks > 1:
        if optimizer is None:
            virtual = f" of {chunks} model stages each ({schedule}, pipeline_interleave_num)" if chunks > 1 else ""
            raise ConfigError(f"pipeline_stages {context.pipeline_stages}{virtual} with {micro_batches} micro-batch(es) plans a "
                              f"training step: give an optimizer (TrainOneStepCell, or phase='train')")

        def training(graph, device_num: int):
            graph = build_training(seeded(graph, device_num), optimizer, gradients_mean=context.gradients_mean,
                                   recompute=recomputed_cells(net) + tuple(recompute))
            return apply_seeds(graph, backward_seeds, device_num) if backward_seeds else graph

        plan = plan_pipeline_for(net, inputs, micro_batches, context, training, progress)
        return _finished(plan, context)
    graph = seeded(trace(net, *inputs, device_num=context.device_num), context.device_num)
    if optimizer is None:
        check_op_names(graph, backward_seeds)  # a forward pass has no backward op to seed
        if context.auto_recompute:
            raise ConfigError("auto_recompute chooses layers to recompute in a training step; this plan is of a forward "
                              "pass (set phase='train' or give an optimizer)")
        plan = search(graph, context.device_num, context.search_options(), progress)
    else:
        # A checkpoint's backward and update ops are checked by name, not seeded: the search
        # derives them from the forward seeds again, as when the checkpoint was saved. (Seeding
        # them too would pin pairs the saved plan joined by a redistribution: "seeds disagree".)
        saved = (checkpoint["backward"] | checkpoint["update"]) if checkpoint else {}
        plan = _training_plan(graph, optimizer, context, recomputed_cells(net) + tuple(recompute), progress, saved, where,
                              backward_seeds)
    return _finished(plan, context)


def _by_phase(seeds: dict) -> tuple[dict, dict]:
    """`seeds` of forward ops, and of backward ops (named as `autodiff.op_phase` knows them)."""
    backward = {name: seed for name, seed in seeds.items() if op_phase(name) == "backward"}
    return {name: seed for name, seed in seeds.items() if name not in backward}, backward


def _finished(plan: Plan, context: ParallelContext) -> Plan:
    """`plan`, its warnings issued, its strategy checkpoint saved and its IR dumped (MindSpore's
    ``set_context(save_graphs=...)``) when the contexts ask."""
    for message in plan.warnings:
        warnings.warn(message, stacklevel=4)
    if context.bucket_bytes and (plan.pipeline is not None or not plan.graph.updates):
        warnings.warn(f"bucket_bytes={context.bucket_bytes}: nothing to put in buckets: "
                      + ("a pipeline's stages synchronise their gradients after the backward (buckets are built for "
                         "plans without stages)" if plan.pipeline is not None else
                         "a forward pass synchronises no gradient"), stacklevel=4)
    if context.backward_regathers and not plan.regathered():
        warnings.warn("backward_regathers=True: nothing to gather again: the backward reads no tensor a forward "
                      "redistribution copied", stacklevel=4)
    if context.strategy_ckpt_save_file:  # a config's path is checked to stay in its folder (`io.OutputPath`)
        plan.save_strategy(context.strategy_output())
    folder = graphs_folder(context.global_rank)
    if folder is not None:
        plan.dump_ir(folder, context.global_rank)  # rank_<r>/ holds rank r's sliced graph, as in MindSpore
    return plan


def _training_plan(graph, optimizer, context: ParallelContext, recompute: tuple[str, ...], progress, saved=(),
                   where: str = "", backward_seeds: dict | None = None) -> Plan:
    """The plan of `graph`'s training step with the cells `recompute` recomputed, its backward
    ops `backward_seeds` seeded, and with ``auto_recompute`` as many more repeated layers as
    `choose_recompute` finds best; the op names `saved` (from the strategy checkpoint at
    `where`) must be ops of some such step."""
    if len(graph.outputs) != 1:
        raise ConfigError(f"training needs a network returning one loss; {graph.name} returns {len(graph.outputs)} outputs")
    layers = ()
    if context.auto_recompute:
        layers = tuple(layer for layer in repeated_layers(graph.ops) if not any(in_cell(layer, cell) or layer == cell for cell in recompute))
        if not layers:
            raise ConfigError(f"auto_recompute chooses among repeated layers (cells of a CellList); {graph.name} has none "
                              f"left to choose (recomputed already: {', '.join(recompute) or 'none'})")

    def training(cells: tuple[str, ...]):
        step = build_training(graph, optimizer, gradients_mean=context.gradients_mean, recompute=recompute + cells)
        return apply_seeds(step, backward_seeds, context.device_num) if backward_seeds else step

    if saved:  # every op any choice can have: refused before a search (a graph built only to check)
        check_op_names(training(layers), saved, where)
    options = context.search_options()

    def plan_with(cells: tuple[str, ...]) -> Plan:
        return search(training(cells), context.device_num, options, progress)

    if not context.auto_recompute:
        return plan_with(())
    plan, choice = choose_recompute(plan_with, layers, context.max_device_memory)
    return replace(plan, recompute=choice)


def parallelize(net, *inputs) -> Plan:
    """The plan of `net` on `inputs` under `set_auto_parallel_context(...)`.

    Example:
        >>> from autostrat import nn, set_auto_parallel_context, reset_auto_parallel_context
        >>> from autostrat.models import FFN
        >>> set_auto_parallel_context(parallel_mode="auto_parallel", search_mode="sharding_propagation", device_num=8)
        >>> net = FFN()
        >>> _ = net.dense1.matmul.shard(((2, 1), (1, 4)))
        >>> str(parallelize(net, nn.Tensor(shape=(64, 64))).ops["relu"].strategy)
        '((2, 4),)'
        >>> reset_auto_parallel_context()
    """
    return plan_for(net, inputs, current_context())
