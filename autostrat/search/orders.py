"""Axis-order candidates: strategies whose factors sit on the device axes in another order than
the rule's (a `Placement`), offered where a neighbour hands over a layout in such an order.

Strategy tuples put an op's factors on the device axes in the rule's factor order, the repeated
axis last. A seed written as a MindSpore ``Layout`` (or a seeded Transpose), or a candidate that
follows one, produces layouts whose axes come in another order; a neighbour in the default order then
pays a collective permute or an AllToAll just to read them. So, in data-flow order, each
unseeded op is offered its candidates re-placed on such a layout's axes (`layout.aligned`): the
output layout of a seed, or of a re-placed candidate of its producer, when no default order
reads it as it is (`_in_tuple_order`). Seeds written as Layouts are followed backwards the same
way: their producers are offered candidates whose output is the seed's input layout. Only the
orders a seed starts are offered, so a plan seeded with tuples gets no new candidate and its
cost tables stay as they were. (Offering the orders every Transpose candidate hands over too
found plans a few per cent faster on GPT training steps, for 2.5 times the candidates: not done.)
"""

from __future__ import annotations

from dataclasses import replace
from functools import cache

from autostrat.layout import Layout, Strategy
from autostrat.layout.placement import aligned


def _in_tuple_order(layout: Layout) -> bool:
    """Whether a default-order candidate can read `layout` as it is: its split dims, left to
    right, on ever more minor axes, and any other axis (repeated or partial) the most minor."""
    normal = layout.normalized()
    axes = [axis for entry in normal.tensor_map.entries for axis in entry]
    free = set(range(normal.device_matrix.ndim)) - set(axes)
    return axes == sorted(axes, reverse=True) and free <= {0}


@cache
def _variants(base: tuple[Strategy, ...], dims, layout: Layout) -> tuple[Strategy, ...]:
    """The candidates of `base` re-placed so that the operand of `dims` reads `layout` as it is
    (cached: the layers of a model ask the same questions)."""
    found: list[Strategy] = []
    for strategy in base:
        if strategy.at_rest or not isinstance(strategy, Strategy):
            continue
        placement = aligned(strategy.rule.factors, strategy.splits, dims, layout)
        if placement is not None:
            variant = replace(strategy, placement=placement)
            if variant.placement is not None and variant not in found:
                found.append(variant)
    return tuple(found)


def order_variants(graph, candidates: dict[str, tuple[Strategy, ...]]) -> dict[str, tuple[Strategy, ...]]:
    """`candidates` with the axis-order variants of the module docstring appended to each
    unseeded op's (a seed stays candidate 0, the default candidates keep their indices).

    Example (a Layout seed on the tutorial's first MatMul: its BiasAdd is offered the
    placement that reads the MatMul's output where it lies):
        >>> from autostrat.frontend import trace
        >>> from autostrat.layout.named import NamedLayout
        >>> from autostrat.models import FFN
        >>> from autostrat.nn import Tensor
        >>> from autostrat.strategies import generate_strategies
        >>> net, layout = FFN(), NamedLayout((4, 2), ("mp", "dp"))
        >>> _ = net.dense1.matmul.shard((layout("dp", "mp"), layout("mp", "None")))
        >>> graph = trace(net, Tensor(shape=(64, 64)), device_num=8)
        >>> seed = Strategy.from_tuples(graph.ops["dense1.matmul"].rule, graph.ops["dense1.matmul"].in_strategy, 8)
        >>> base = {name: (seed,) if name == "dense1.matmul" else generate_strategies(op.rule, 8)
        ...         for name, op in graph.ops.items()}
        >>> [str(s) for s in order_variants(graph, base)["dense1.bias_add"][len(base["dense1.bias_add"]):]]
        ['((2, 4), (4,)) on [4, 2]: (0, 1), (1,)']
    """
    seeded = {name for name, op in graph.ops.items() if op.is_seeded}
    result = dict(candidates)
    for name, op in graph.ops.items():  # data-flow order: a producer's variants are known first
        if name in seeded:
            continue
        base, added, seen = candidates[name], {}, set()
        for index, tensor in enumerate(op.inputs):
            producer = graph.tensors[tensor].producer
            if producer is None or producer not in result:
                continue
            output, seed = graph.ops[producer].outputs.index(tensor), producer in seeded
            for strategy in result[producer]:
                if not seed and strategy.placement is None:
                    continue
                layout = strategy.output_layouts[output]
                key = (index, layout.normalized())
                if key in seen or _in_tuple_order(layout):
                    continue
                seen.add(key)
                added.update(dict.fromkeys(_variants(base, op.rule.inputs[index], layout)))
        result[name] = base + tuple(added)
    return _follow_layout_seeds(graph, result, seeded)


def _follow_layout_seeds(graph, candidates, seeded) -> dict[str, tuple[Strategy, ...]]:
    """Producers of a seed written as Layouts offered the seed's input layouts as outputs."""
    result = dict(candidates)
    for name in seeded:
        seed = candidates[name][0]
        if seed.placement is None:
            continue
        for index, tensor in enumerate(graph.ops[name].inputs):
            producer = graph.tensors[tensor].producer
            if producer is None or producer in seeded or producer not in result:
                continue
            output = graph.ops[producer].outputs.index(tensor)
            dims = graph.ops[producer].rule.outputs[output]
            added = [v for v in _variants(candidates[producer], dims, seed.input_layouts[index]) if v not in result[producer]]
            result[producer] = result[producer] + tuple(added)
    return result
