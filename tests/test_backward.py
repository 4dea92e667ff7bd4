"""The training graph: names, accumulation, pruning, errors, determinism, and that the search
plans it unchanged."""

from __future__ import annotations

import numpy as np
import pytest

from autostrat import ops
from autostrat.autodiff import build_backward, gradient_name
from autostrat.errors import ConfigError, UnknownOpError
from autostrat.frontend import trace
from autostrat.frontend.config import apply_seeds
from autostrat.models import FFN, GPT, megatron_seeds
from autostrat.models.megatron_plan import sequence_parallel_seeds
from autostrat.nn import Cell, Parameter, Tensor
from autostrat.search.plan import build_plan
from autostrat.search import search
from tests.graph_eval import evaluate


def _ops_text(graph) -> str:
    lines = [f"{op.name} = {op.op_type}({', '.join(op.inputs)}) -> {', '.join(op.outputs)}" for op in graph.ops.values()]
    return "\n".join(lines + [f"outputs: {', '.join(graph.outputs)}"]) + "\n"


def test_ffn_training_graph_matches_the_golden_file(golden):
    golden("ffn_training.txt", _ops_text(build_backward(trace(FFN(), Tensor(shape=(64, 64))))))


def test_building_twice_gives_the_same_graph():
    net = GPT(layers=1, hidden=16, heads=2, seq=4, batch=2, vocab=32)
    first, second = (_ops_text(build_backward(trace(net, *net.example_inputs()))) for _ in range(2))
    assert first == second


def test_residual_gradients_are_accumulated_and_unused_gradients_pruned():
    net = GPT(layers=1, hidden=16, heads=2, seq=4, batch=2, vocab=32)
    training = build_backward(trace(net, *net.example_inputs()))
    accumulated = [op for op in training.ops.values() if op.name.startswith("accumulate/")]
    # ln1's output feeds Q, K and V (two Adds); the block input feeds ln1 and the residual.
    assert {op.name for op in accumulated} >= {"accumulate/blocks.0.ln1.layer_norm:0", "accumulate/blocks.0.ln1.layer_norm:0_1", "accumulate/flatten:0"}
    assert all(op.op_type == "Add" for op in accumulated)
    # No gradient flows into the integer ids and labels, or through the labels' OneHot.
    assert not any(op.name.startswith("bprop/loss.one_hot") for op in training.ops.values())
    assert "grad/ids" not in training.tensors and "grad/labels" not in training.tensors


class _Shared(Cell):
    """Two parameters added: both gradients are one tensor, so each gets an Identity; a third
    feeds an op the loss does not depend on, so its gradient is zero."""

    def __init__(self):
        super().__init__()
        self.p, self.q, self.unused = (Parameter(Tensor(np.ones((4, 3), np.float32))) for _ in range(3))
        self.add, self.sum, self.neg = ops.Add(), ops.ReduceSum(), ops.Neg()

    def construct(self, x):
        self.neg(self.unused)
        return self.sum(self.add(self.add(self.p, self.q), x), ())


def test_parameters_always_get_their_named_gradient():
    training = build_backward(trace(_Shared(), Tensor(shape=(4, 3))))
    assert training.outputs == ("grad/unused", "grad/p", "grad/q")  # the order of graph.parameters()
    assert training.producer("grad/p").op_type == "Identity" and training.producer("grad/q").op_type == "Identity"
    assert training.tensors["grad/unused"].kind == "constant"
    values = evaluate(training, {"x": np.zeros((4, 3))})
    assert np.array_equal(values["grad/p"], np.ones((4, 3))) and not values["grad/unused"].any()


class _ThroughSlice(Cell):
    def __init__(self):
        super().__init__()
        self.w = Parameter(Tensor(np.ones((4, 6), np.float32)))
        self.slice = ops.Slice()

    def construct(self, x):
        return self.slice(self.w, (0, 0), (4, 3))


BACKWARD_ERRORS = {
    "several outputs": (lambda: build_backward(trace(_Pair(), Tensor(shape=(4,))) ), ConfigError, r"_Pair has 2 outputs \['relu:0', 'neg:0'\]; name the loss to differentiate"),
    "unknown loss": (lambda: build_backward(trace(FFN(), Tensor(shape=(8, 64))), loss="nothing"), ConfigError, r"the loss must be a tensor of FFN, got 'nothing'"),
    "integer loss": (lambda: build_backward(trace(_Pair(), Tensor(shape=(4,), dtype="int32")), loss="relu:0"), ConfigError, r"the loss relu:0 must be floating point, got int32"),
    "no bprop": (lambda: build_backward(trace(_ThroughSlice(), Tensor(shape=(4, 6)))), UnknownOpError, r"slice: a gradient must flow through Slice, which has no bprop \(only bprops use it"),
}


class _Pair(Cell):
    def __init__(self):
        super().__init__()
        self.relu, self.neg = ops.ReLU(), ops.Neg()

    def construct(self, x):
        return self.relu(x), self.neg(x)


@pytest.mark.parametrize("case", BACKWARD_ERRORS)
def test_backward_errors(case):
    call, error, message = BACKWARD_ERRORS[case]
    with pytest.raises(error, match=message):
        call()


def test_search_plans_the_ffn_training_graph():
    net = FFN()
    net.dense1.matmul.shard(((2, 1), (1, 4)))
    training = build_backward(trace(net, Tensor(shape=(64, 64)), device_num=8))
    plan = search(training, 8)
    assert set(plan.ops) == set(training.ops)
    assert str(plan.ops["bprop/dense2.matmul/mat_mul_1"].strategy) == "((2, 4), (2, 1))"
    assert plan.total_bytes == 6144


def test_search_plans_the_gpt_training_graph():
    net = GPT(layers=1)
    graph = apply_seeds(trace(net, *net.example_inputs(), device_num=8), megatron_seeds(1, 4, data_parallel=2), 8)
    training = build_backward(graph)
    plan = search(training, 8)
    assert set(plan.ops) == set(training.ops) and len(training.ops) > 2 * len(graph.ops)
    assert plan.total_bytes >= search(graph, 8).total_bytes
    assert all(gradient_name(p.name) in plan.layouts for p in graph.parameters())


@pytest.mark.parametrize("refine, regathers", [(None, False), ("cpsat", False), (None, True), ("cpsat", True)])
def test_the_search_objective_counts_every_reader_of_a_shared_parameter(refine, regathers):
    # In a training graph each weight is read by the forward and the backward MatMul: the edge
    # from its first reader to the second must be in the problem, or CP-SAT optimises bytes the
    # plan does not send. (Readers wanting one layout share a redistribution: `SearchProblem.cost`;
    # with `backward_regathers`, and sequence parallelism, only those of one phase: the plan's rule too.)
    from autostrat.search import SearchOptions
    from autostrat.search.problem import build_problem

    net = GPT(layers=1)
    seeds = megatron_seeds(1, 4, data_parallel=2) | (sequence_parallel_seeds(net, 4, 2) if regathers else {})
    graph = apply_seeds(trace(net, *net.example_inputs(), device_num=8), seeds, 8)
    training = build_backward(graph)
    plan = search(training, 8, SearchOptions(refine=refine, refine_time_limit=30, backward_regathers=regathers))
    problem = build_problem(training, 8, allow_repeated=True, backward_regathers=regathers)  # as sharding_propagation searches
    choice = {name: problem.candidates[name].index(op.strategy) for name, op in plan.ops.items()}
    assert any(edge.from_input for edge in problem.edges)
    assert problem.cost(choice, shared=True) == plan.total_bytes
    if regathers:  # the same choice, each phase paying its own: more bytes than sharing across them
        kept = build_plan(training, 8, plan.mode, {name: op.strategy for name, op in plan.ops.items()},
                          {name: op.origin for name, op in plan.ops.items()}, ())
        assert plan.total_bytes > kept.total_bytes == build_problem(training, 8, allow_repeated=True).cost(choice)
    if refine:  # CP-SAT's model prices every reader's redistribution; the plan shares equal ones
        assert plan.total_bytes <= plan.refinement.result.objective <= plan.refinement.before


def test_weight_gradient_seeds_name_each_dense_products_weight_gradient_in_the_training_graph():
    # Every seeded Dense product of GPT and LLaMA blocks and the head gets one, named as the
    # training graph names the op writing its weight's gradient; a product without transpose_b
    # (its weight [in, out]) gets none.
    from autostrat.autodiff import SGD, build_training
    from autostrat.models import LLaMA
    from autostrat.models.megatron_plan import tensor_parallel_seeds, weight_gradient_seeds

    for net in (GPT(layers=2, hidden=32, heads=4, seq=8, batch=2, vocab=64), LLaMA(layers=2, hidden=32, ffn=48, heads=4,
                                                                                 kv_heads=2, seq=8, vocab=64)):
        seeds = tensor_parallel_seeds(net, 2, 2)
        found = weight_gradient_seeds(net, seeds)
        graph = build_training(trace(net, *net.example_inputs(), device_num=4), SGD())
        for product in (name for name in seeds if name.endswith(".matmul")):
            weight = graph.ops[product].inputs[1]
            [writer] = [name for name, op in graph.ops.items() if f"grad/{weight}" in op.outputs]
            assert found[writer][0][0][0] == seeds[product][0][0][0]  # the forward's rows
        assert len(found) == len([name for name in seeds if name.endswith(".matmul")])
    net = GPT(layers=1, hidden=32, heads=4, seq=8, batch=2, vocab=64)
    net.blocks[0].ffn1.matmul = ops.MatMul()
    assert "bprop/blocks.0.ffn1.matmul/mat_mul_1" not in weight_gradient_seeds(net, tensor_parallel_seeds(net, 2, 2))
