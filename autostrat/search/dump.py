"""IR dumps of a plan, named as MindSpore's ``save_graphs`` names its passes' dumps
(``<pass>_<serial>.ir``):

- ``step_parallel_begin_0000.ir``: the whole graph, each op annotated with its strategy;
- ``step_parallel_end_0001.ir``: one rank's sliced graph: local shapes, and the redistribution
  primitives inserted before the ops that need them (with that rank's communication group).
"""

from __future__ import annotations

from pathlib import Path

from autostrat.io import write_files_atomically
from autostrat.layout.named import is_layout_strategy
from autostrat.redistribution import lower_step


def _type(dtype: str, shape) -> str:
    return f"<Tensor[{dtype.capitalize()}], ({', '.join(str(s) for s in shape)})>"


def _seed_text(strategy) -> str:
    """A configured strategy as MindSpore's IR prints it: tuples, or Layouts as ``in_layout`` dicts."""
    if not is_layout_strategy(strategy):
        return str(strategy)
    return "(" + ", ".join(layout.ir_text() for layout in strategy) + ")"


def _attrs(op) -> str:
    """The primitive's attributes, and its configured strategies as MindSpore lists them."""
    layouts = is_layout_strategy(op.in_strategy)
    seeds = [("in_layout" if layouts else "in_strategy", op.in_strategy), ("out_layout" if layouts else "out_strategy", op.out_strategy)]
    return "{" + ", ".join(f"{k}: {_seed_text(v) if k.endswith('layout') else v}"
                           for k, v in list(op.attrs) + [(k, v) for k, v in seeds if v is not None]) + "}"


def _header(plan, sliced: bool) -> list[str]:
    """The graph line with its inputs, at global shapes or at one rank's slice shapes."""
    def shape(name: str):
        return plan.layouts[name].slice_shape if sliced else plan.layouts[name].shape

    args = ", ".join(f"%{t.name}: {_type(t.dtype, shape(t.name))}" for t in plan.graph.inputs())
    return [f"graph {plan.graph.name}({args})"]


def _stage(plan, op: str) -> str:
    return "" if plan.pipeline is None else f" {{pipeline_stage: {plan.pipeline.stage_label(op)}}}"


def annotated_text(plan) -> str:
    """Every op with its inputs, attributes, strategy and global shapes."""
    graph = plan.graph
    where = f"{plan.device_num} devices"
    if plan.pipeline is not None:  # the ops of every stage, each on its stage's devices, one micro-batch
        where = (f"{plan.device_num} devices per stage, {plan.pipeline.stages} stages, one of "
                 f"{plan.pipeline.micro_batches} micro-batches")
    lines = [f"# step_parallel_begin: {graph.name} on {where} ({plan.mode})", *_header(plan, sliced=False)]
    for tensor in graph.parameters():
        lines.append(f"  %{tensor.name} = Parameter : {_type(tensor.dtype, tensor.shape)}")
    for name, op in graph.ops.items():
        ins = ", ".join(_type(graph.tensors[t].dtype, graph.tensors[t].shape) for t in op.inputs)
        outs = ", ".join(_type(graph.tensors[t].dtype, graph.tensors[t].shape) for t in op.outputs)
        call = f"{op.op_type}({', '.join('%' + t for t in op.inputs)})"
        strategy = plan.ops[name].strategy
        lines.append(
            f"  %{', %'.join(op.outputs)} = {call} {{instance name: {name}}} primitive_attrs: {_attrs(op)}\n"
            f"      {{in_strategy: {strategy}}}{_stage(plan, name)} {{origin: {plan.ops[name].origin}}} : ({ins}) -> ({outs})"
            + (f"\n      # In file {op.source}" if op.source else "")
        )
    lines.append(f"  return {', '.join('%' + t for t in graph.outputs)}")
    return "\n".join(lines) + "\n"


def _redistribution_lines(edge, rank: int, source: str, dtype: str) -> tuple[list[str], str]:
    lines, current = [], source
    for index, step in enumerate(edge.plan.steps):
        group = next((g for g in step.groups if rank in g), (rank,))
        primitives = " -> ".join(str(p) for p in lower_step(step))
        target = f"{edge.tensor}.to.{edge.consumer}[{edge.input_index}].{index}"
        lines.append(
            f"  %{target} = {primitives} {{group_ranks: {'-'.join(str(r) for r in group)}, bytes: {step.bytes}}}\n"
            f"      : ({_type(dtype, step.before.slice_shape)}) -> ({_type(dtype, step.after.slice_shape)})"
        )
        current = target
    return lines, current


def sliced_text(plan, rank: int = 0) -> str:
    """Rank `rank`'s program: local slice shapes and the inserted redistribution primitives."""
    graph = plan.graph
    lines = [f"# step_parallel_end: {graph.name}, rank {rank} of {plan.device_num}", *_header(plan, sliced=True)]
    for tensor in graph.parameters():
        lines.append(f"  %{tensor.name} = Parameter : {_type(tensor.dtype, plan.layouts[tensor.name].slice_shape)}")
    edges = {(e.consumer, e.input_index): e for e in plan.redistributions}
    for name, op in graph.ops.items():
        strategy = plan.ops[name].strategy
        arguments = []
        for index, tensor in enumerate(op.inputs):
            edge = edges.get((name, index))
            if edge is None:
                arguments.append(tensor)
                continue
            if edge.shares:  # the earlier op's redistributed input
                arguments.append(f"{tensor}.to.{edge.shares[0]}[{edge.shares[1]}].{len(edge.plan.steps) - 1}")
                continue
            inserted, current = _redistribution_lines(edge, rank, tensor, graph.tensors[tensor].dtype)
            lines.extend(inserted)
            arguments.append(current)
        ins = ", ".join(_type(graph.tensors[t].dtype, layout.slice_shape) for t, layout in zip(op.inputs, strategy.input_layouts))
        outs = ", ".join(
            _type(graph.tensors[t].dtype, layout.slice_shape) + (f" partial{list(layout.partial)}" if layout.partial else "")
            for t, layout in zip(op.outputs, strategy.output_layouts)
        )
        lines.append(
            f"  %{', %'.join(op.outputs)} = {op.op_type}({', '.join('%' + a for a in arguments)}) "
            f"{{in_strategy: {strategy}}} : ({ins}) -> ({outs})"
        )
    lines.append(f"  return {', '.join('%' + t for t in graph.outputs)}")
    return "\n".join(lines) + "\n"


ANNOTATED, SLICED = "step_parallel_begin_0000.ir", "step_parallel_end_0001.ir"


def dump_texts(plan, directory: Path, rank: int = 0) -> dict[Path, str]:
    """The dumps' paths in `directory` and their texts (the sliced one of `rank`), for writing
    with other files at once."""
    return {directory / ANNOTATED: annotated_text(plan), directory / SLICED: sliced_text(plan, rank)}


def write_dumps(plan, directory: Path, rank: int = 0) -> list[Path]:
    """Write both dumps into `directory` (created if missing), both or neither: a failed write
    leaves no file and no folder behind."""
    return write_files_atomically(dump_texts(plan, directory, rank))
