"""From a traced graph to a plan, in one of MindSpore's parallel modes."""

from __future__ import annotations

from dataclasses import replace

from autostrat.errors import ConfigError
from autostrat.ir import Graph
from autostrat.search.plan import Plan, build_plan
from autostrat.search.problem import build_problem
from autostrat.search.propagate import data_parallel, propagate

MODES = ("auto_parallel", "data_parallel", "semi_auto_parallel", "stand_alone")


def _unseeded(graph: Graph) -> Graph:
    ops = {name: replace(op, in_strategy=None, out_strategy=None) for name, op in graph.ops.items()}
    return replace(graph, ops=ops)


def _check_shared_parameters(graph: Graph, problem) -> None:
    """A parameter read by two seeded ops must be wanted in one layout by both."""
    for tensor in graph.parameters():
        wanted = {}
        for op, index in graph.consumers(tensor.name):
            if graph.ops[op].is_seeded:
                wanted[op] = problem.candidates[op][0].input_layouts[index]
        names = list(wanted)
        for other in names[1:]:
            if not wanted[other].equivalent(wanted[names[0]]):
                raise ConfigError(
                    f"parameter {tensor.name} is shared by {names[0]} and {other}, whose strategies want it in "
                    f"different layouts ({wanted[names[0]].normalized()} vs {wanted[other].normalized()}); "
                    f"seed them alike or leave one unseeded"
                )


def search(graph: Graph, device_num: int, mode: str = "auto_parallel", allow_repeated: bool = False) -> Plan:
    """A strategy for every op of `graph` on `device_num` devices.

    `mode`: auto_parallel propagates the seeds (sharding_propagation); semi_auto_parallel keeps
    the seeds and splits every other op's batch dim; data_parallel ignores seeds and splits every
    batch dim; stand_alone plans for one device.

    Example:
        >>> from autostrat.frontend import trace
        >>> from autostrat.models import FFN
        >>> from autostrat.nn import Tensor
        >>> net = FFN()
        >>> _ = net.dense1.matmul.shard(((2, 1), (1, 4)))
        >>> plan = search(trace(net, Tensor(shape=(64, 64)), device_num=8), 8)
        >>> str(plan.ops["dense2.matmul"].strategy), plan.total_bytes
        ('((2, 4), (4, 1))', 6144)
    """
    if mode not in MODES:
        raise ConfigError(f"parallel_mode must be one of {', '.join(MODES)}; got {mode!r}")
    if mode == "stand_alone":
        graph, device_num = _unseeded(graph), 1
    elif mode == "data_parallel":
        graph = _unseeded(graph)
    problem = build_problem(graph, device_num, allow_repeated)
    _check_shared_parameters(graph, problem)
    if mode == "auto_parallel":
        assignment = propagate(problem)
    else:
        assignment = data_parallel(problem, keep_seeds=mode == "semi_auto_parallel")
    strategies = {name: problem.candidates[name][index] for name, index in assignment.choice.items()}
    return build_plan(graph, device_num, mode, strategies, assignment.origin, assignment.warnings)
