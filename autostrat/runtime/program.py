"""Lower a plan to one program per rank: slice loads, kernels on local slices, collective steps.

A program is plain data (frozen dataclasses, tuples, a `SliceContext` per kernel), so it can be
written to a file by the launcher and read by every rank without importing the search. Every
rank's program has the same instructions in the same order; only slices, chunk indices, peers
and predicted bytes differ. That is what lets MPI ranks (and LocalBackend threads) meet in every
collective without any further coordination.

Partial results (an op with a split reduction factor) are carried on the edge, as the plan
does: the op itself sends nothing and the consumer edge's AllReduce or ReduceScatter resolves
them. Graph outputs that are still split or partial get one more redistribution, to the
replicated layout, so that every rank ends with the whole result; its bytes are predicted by the
same planner and reported apart (phase "output") from the plan's forward bytes.

A training plan also has phases "backward", "sync" (gradient synchronisation: the edges into
the update ops) and "update" (writebacks: an updated parameter or state redistributed back to
the layout it is stored in), with ZeRO-3 "gather" (a parameter resting sharded, gathered for
each op reading it), and `Program.updates` names, per updated parameter or optimiser
state, the store key of its next value, already in that layout: the next step loads it from there.
A plan with `bucket_bytes` (`search.prediction.sync_buckets`) runs its "sync" edges on the
communication stream (`bucketed`, `runtime.stream`): a bucket started after the backward kernel
making its last gradient final, its AllReduces over one group fused into one (`search.fusion`),
each edge waited for before its update.
"""

from __future__ import annotations

import math

from autostrat.autodiff import UPDATE_OP_TYPES, op_phase
from autostrat.cost.algorithms import algorithm_bytes, server_size
from autostrat.errors import RuntimeBackendError
from autostrat.layout import Layout, TensorMap
from autostrat.redistribution import RedistributionPlan, plan_redistribution
from autostrat.runtime.instructions import Load, Compute, RingCompute, Communicate, Program
from autostrat.search.precision import check_runnable, held_dtype, main_gradient_name, main_name


def lower_programs(plan) -> tuple[Program, ...]:
    """One program per rank for `plan` (a `search.Plan`); checks the plan against its graph.

    Example (the tutorial FFN: one ReduceScatter after dense2.matmul, then the output gathered):
        >>> from autostrat import nn, parallelize, set_auto_parallel_context, reset_auto_parallel_context
        >>> from autostrat.models import FFN
        >>> set_auto_parallel_context(parallel_mode="auto_parallel", device_num=8)
        >>> net = FFN(); _ = net.dense1.matmul.shard(((2, 1), (1, 4)))
        >>> programs = lower_programs(parallelize(net, nn.Tensor(shape=(64, 64))))
        >>> [(c.kind, c.phase, c.predicted) for c in programs[3].communications()]
        [('ReduceScatter', 'forward', 6144), ('AllGather', 'output', 6144), ('AllGather', 'output', 8192)]
        >>> reset_auto_parallel_context()

    A plan is immutable: its programs are lowered once and kept with it (a functional loop runs
    one plan step after step, and every rank lowered every rank's program at each step).
    """
    check_runnable(plan.precision, pipeline=plan.pipeline is not None)  # every run lowers its plan first
    lowered = plan.__dict__.get("_programs")  # not a field: equality and the plan's JSON ignore it
    if lowered is None:
        check_plan(plan)
        output_plans = _output_plans(plan)
        partitions = _partitions(plan, output_plans)
        lowered = tuple(_lower_rank(plan, output_plans, partitions, rank) for rank in range(plan.device_num))
        plan.__dict__["_programs"] = lowered
    return lowered


def check_plan(plan) -> None:
    """Raise `RuntimeBackendError` unless every op of the graph has a strategy for its own
    shapes and every tensor a layout on `device_num` devices."""
    graph = plan.graph
    missing = [name for name in graph.ops if name not in plan.ops]
    extra = [name for name in plan.ops if name not in graph.ops]
    if missing or extra:
        raise RuntimeBackendError(
            f"the plan does not match graph {graph.name}: ops without a strategy {missing}, strategies of unknown ops {extra}"
        )
    for name, op in graph.ops.items():
        strategy = plan.ops[name].strategy
        shapes = tuple(graph.tensors[t].shape for t in op.inputs)
        if strategy.rule.op_type != op.op_type or tuple(strategy.rule.input_shapes) != shapes:
            raise RuntimeBackendError(
                f"op {name}: the plan's strategy is for {strategy.rule.op_type} on {list(strategy.rule.input_shapes)}, "
                f"the graph has {op.op_type} on {list(shapes)}"
            )
        if strategy.device_num != plan.device_num:
            raise RuntimeBackendError(f"op {name}: strategy for {strategy.device_num} devices in a plan for {plan.device_num}")
    _check_updates(plan)
    for tensor in (t for op in graph.ops.values() for t in op.inputs + op.outputs):
        layout = plan.layouts.get(tensor)
        if layout is None or layout.shape != graph.tensors[tensor].shape or layout.device_num != plan.device_num:
            raise RuntimeBackendError(f"tensor {tensor}: expected a layout of shape {list(graph.tensors[tensor].shape)} "
                                      f"on {plan.device_num} devices in the plan, got {layout}")


def _check_updates(plan) -> None:
    """Every updated parameter's next value must end in the layout the parameter is loaded
    from, or the next step would read wrong slices."""
    writebacks = {w.parameter: w.plan.dst for w in plan.writebacks}
    for parameter, value in plan.graph.updates:
        stored, final = plan.layouts.get(parameter), writebacks.get(parameter, plan.layouts.get(value))
        if stored is None or final is None or not final.equivalent(stored):
            raise RuntimeBackendError(f"update of {parameter}: its next value {value} ends in layout {final}, "
                                      f"but the parameter is stored in {stored}")


def replicated(layout: Layout) -> Layout:
    """The same tensor, whole on every rank of the same device matrix."""
    return Layout(layout.device_matrix, TensorMap((-1,) * len(layout.shape)), layout.shape)


def _output_plans(plan) -> dict[str, RedistributionPlan]:
    plans = {}
    for tensor in plan.graph.outputs:
        layout = plan.layouts[tensor]
        whole = replicated(layout)
        if not layout.equivalent(whole):
            plans[tensor] = plan_redistribution(layout, whole, plan.sizes.priced(tensor))
    return plans


def _partitions(plan, output_plans) -> tuple:
    """Every group set of every step, first use first (the order communicators are made in)."""
    found: dict = {}
    redistributions = [edge.plan for edge in plan.redistributions] + list(output_plans.values())
    redistributions += [writeback.plan for writeback in plan.writebacks]
    for redistribution in redistributions:
        for step in redistribution.steps:
            if step.kind in ("AllGather", "AllReduce", "AllToAll", "ReduceScatter"):
                found.setdefault(step.groups, None)
    return tuple(found)


def _edge_key(tensor: str, consumer: str, index: int) -> str:
    return f"{tensor}>{consumer}[{index}]"


def _lower_rank(plan, output_plans, partitions, rank: int) -> Program:
    graph = plan.graph
    edges = {(e.consumer, e.input_index): e for e in plan.redistributions}
    held = _held(plan)
    instructions: list = [
        Load(name, plan.layouts[name].slice_range(rank), held.get(name, ""))
        for name, info in graph.tensors.items()
        if info.kind != "output" and graph.consumers(name)
    ]
    mains = _main_loads(plan, rank)
    instructions += mains
    trained: dict[str, tuple[str, ...]] = {}  # parameter -> its main copy (and fp16's main gradient)
    for main in mains:
        trained[main.of] = trained.get(main.of, ()) + (main.tensor,)
    for name, op in graph.ops.items():
        keys = []
        for index, tensor in enumerate(op.inputs):
            edge = edges.get((name, index))
            key = tensor
            if edge is not None and edge.shares:  # an earlier op's input holds it already
                key = _edge_key(tensor, *edge.shares)
            elif edge is not None and edge.plan.steps:
                key = _edge_key(tensor, name, index)
                instructions += lower_steps(edge.plan, rank, tensor, key, _label(edge), plan.edge_phase(edge),
                                            _itemsize(plan, tensor))
            keys.append(key)
        instructions.append(_compute(plan, op, tuple(keys), rank, held, trained))
    outputs = []
    for tensor in graph.outputs:
        key = tensor
        if tensor in output_plans:
            key = f"{tensor}>output"
            instructions += lower_steps(output_plans[tensor], rank, tensor, key, f"{tensor} -> output", "output",
                                        _itemsize(plan, tensor))
        outputs.append((tensor, key))
    updates = _writebacks(plan, rank, instructions)
    updates += [(main.tensor, main.tensor) for main in mains]  # carried to the next step as they are
    if plan.bucket_bytes and plan.pipeline is None:
        from autostrat.runtime.bucketing import bucketed, plan_buckets  # they read this module's instruction types

        instructions = bucketed(instructions, plan_buckets(plan, rank, _label))
    inputs = tuple(info.name for info in graph.inputs())
    return Program(rank, plan.device_num, partitions, tuple(instructions), inputs, tuple(outputs), tuple(updates))


def _label(edge) -> str:
    """How an edge's instructions name it (their `edge`)."""
    return f"{edge.tensor} -> {edge.consumer}[{edge.input_index}]"


def _writebacks(plan, rank: int, instructions: list) -> list[tuple[str, str]]:
    """Per updated parameter or state, the key of its next value in its stored layout; the
    writebacks that bring it there are appended to `instructions`."""
    updates = []
    writebacks = {w.parameter: w for w in plan.writebacks}
    for parameter, value in plan.graph.updates:
        key = value
        if parameter in writebacks:
            key = f"{value}>{parameter}"
            instructions += lower_steps(writebacks[parameter].plan, rank, value, key, f"{value} -> {parameter}", "update",
                                        _itemsize(plan, value))
        updates.append((parameter, key))
    return updates


def _compute(plan, op, keys: tuple[str, ...], rank: int, held: dict, trained: dict) -> Compute:
    """The op's kernel on the rank's slices `keys`; in 16 bits with its outputs' dtypes and,
    for an update, the main copies it steps (`trained`: parameter -> keys)."""
    main = trained.get(op.inputs[0], ()) if op.op_type in UPDATE_OP_TYPES else ()
    strategy = plan.ops[op.name].strategy
    fields = (op.name, op.op_type, keys, op.outputs, kernel_attrs(plan, op), strategy.slice_context(rank),
              tuple(held[t] for t in op.outputs) if held else (), main)
    if strategy.ring:  # its kernel sends: what the plan predicts it sends, in the key's held dtype
        return RingCompute(*fields, group=strategy.ring_group(rank), wire_dtype=held.get(op.inputs[1], ""),
                           predicted=plan.ring_bytes[op.name], edge=f"{op.name} (ring)", phase=op_phase(op.name))
    return Compute(*fields)


def kernel_attrs(plan, op) -> tuple:
    """The attributes an op's kernel runs with: its own, plus for an update that sums its
    replicas' gradients (``gradients_mean=False``) how many they are (`Plan.replicas` of its
    parameter), by which the kernel scales the gradient. The stand-alone reference gives its
    update ops the same (`training.reference_graph`), so one device computes what the ranks do."""
    if op.attr_dict.get("gradients_mean", True):
        return op.attrs
    return tuple(sorted(op.attrs + (("replicas", plan.replicas(op.inputs[0])),)))


def _itemsize(plan, tensor: str) -> int:
    """Bytes per element `tensor` moves in: what the plan prices (`TensorSizes`)."""
    return plan.sizes(tensor)


def _held(plan) -> dict[str, str]:
    """Every tensor's dtype in a 16-bit run (`precision.held_dtype`); empty in fp32, whose
    programs hold every tensor in its own dtype."""
    if plan.precision == "fp32":
        return {}
    return {name: held_dtype(plan.sizes, name, plan.precision) for name in plan.graph.tensors}


def _main_loads(plan, rank: int) -> list[Load]:
    """In 16 bits, the rank's fp32 main copy of each trained parameter, and under fp16 its fp32
    main gradient, in the layout its update reads them in (its optimiser state's, as the memory
    model holds them: `search.buffers`). A main gradient's first content (the parameter's) is
    never read: each step's update overwrites it with the step's gradient first."""
    if plan.precision == "fp32":
        return []
    loads = []
    for name, op in plan.graph.ops.items():
        if op.op_type in UPDATE_OP_TYPES and op.inputs[0] in plan.sizes.parameters:
            ranges = plan.ops[name].strategy.input_layouts[0].slice_range(rank)
            via = held_dtype(plan.sizes, op.inputs[0], plan.precision)
            loads.append(Load(main_name(op.inputs[0]), ranges, "float32", op.inputs[0], via))
            if held_dtype(plan.sizes, op.inputs[-1], plan.precision) != "float32":  # fp16's gradient: an fp32 main one
                loads.append(Load(main_gradient_name(op.inputs[0]), ranges, "float32", op.inputs[0], via))
    return loads


def lower_steps(redistribution: RedistributionPlan, rank: int, source: str, target: str, edge: str, phase: str,
                itemsize: int) -> list[Communicate]:
    """The rank's instructions for one redistribution of a tensor of `itemsize`-byte elements:
    the first step reads `source`, every step writes `target`."""
    lowered = []
    for step in redistribution.steps:
        lowered.append(_lower_step(step, rank, source, target, edge, phase, itemsize))
        source = target
    return lowered


def _chunk(step, rank: int, dim: int) -> int:
    """The chunk of `dim` that `rank` holds after the step, among its group (as `simulate`)."""
    return step.after.shard_index(rank)[dim] % step.group_size


def _lower_step(step, rank: int, source: str, target: str, edge: str, phase: str, itemsize: int) -> Communicate:
    # Cases: a permute pairs ranks (send to whoever takes our piece, receive from our source);
    # every other kind acts inside the rank's group, whose member order is the chunk order.
    op = step.after.partial_op if step.kind == "PartialCreate" else step.before.partial_op
    if step.kind == "CollectivePermute":
        take_from = step.sources[rank]
        give_to = step.sources.index(rank)
        sends = give_to != rank
        return Communicate("Sendrecv", source, target, (), (), (), op, (give_to, take_from), step.bytes if sends else 0, edge, phase)
    group = next(g for g in step.groups if rank in g)
    if step.kind == "Slice":
        chunks = (len(group), _chunk(step, rank, step.dims[0]))
    elif step.kind in ("AllToAll", "ReduceScatter"):
        chunks = tuple(_chunk(step, member, step.dims[-1]) for member in group)
    elif step.kind in ("AllGather", "AllReduce"):
        chunks = ()
    elif step.kind == "PartialCreate":
        chunks = (group.index(rank),)
    else:
        raise RuntimeBackendError(f"edge {edge}: cannot run a {step.kind} step (rank {rank})")
    return Communicate(step.kind, source, target, group, step.dims, chunks, op, (rank, rank),
                       _predicted(step, group, rank, itemsize), edge, phase, step.algorithm)


def _predicted(step, group: tuple[int, ...], rank: int, itemsize: int) -> int:
    """What `rank` sends in its `group`: the step's bytes, except where members send unequal
    amounts: an AllReduce of a piece its group size does not divide, or one run by recursive
    doubling (`cost.algorithms.algorithm_bytes`)."""
    if step.kind != "AllReduce" and step.algorithm == "ring":
        return step.bytes
    return member_bytes(step.kind, step.algorithm, math.prod(step.before.slice_shape) * itemsize, group, rank, itemsize)


def member_bytes(kind: str, algorithm: str, local_bytes: int, group: tuple[int, ...], rank: int, itemsize: int) -> int:
    """What `rank` sends in a `kind` of its `group` run as `algorithm` on a piece of `local_bytes`
    (`cost.algorithms.algorithm_bytes` at the rank's position).

    Example (a ring AllReduce of 10 four-byte elements over 4 ranks: chunks of 3, 3, 2 and 2
    elements, so members send unequal bytes):
        >>> [member_bytes("AllReduce", "ring", 40, (0, 1, 2, 3), rank, 4) for rank in range(4)]
        [56, 60, 64, 60]
    """
    if not algorithm.startswith("hierarchical"):
        return algorithm_bytes(kind, algorithm, len(group), local_bytes, itemsize, group.index(rank))
    size = server_size(algorithm)
    servers = list(dict.fromkeys(member // size for member in group))  # in order of first appearance
    inside = [member for member in group if member // size == rank // size]
    position = (servers.index(rank // size), inside.index(rank))
    return algorithm_bytes(kind, algorithm, len(group), local_bytes, itemsize, position, len(servers))
