"""Issue #15's propagation: backward follows forward, layers follow their seeds, one
redistribution per tensor and target layout, and partial sums added before they are reduced."""

from __future__ import annotations

import numpy as np
import pytest

from autostrat import ops
from autostrat.autodiff import Adam, build_training
from autostrat.errors import LayoutError
from autostrat.frontend import trace
from autostrat.frontend.cell import Cell
from autostrat.frontend.config import apply_seeds
from autostrat.frontend.tensor import Parameter, Tensor, initializer
from autostrat.layout import Strategy
from autostrat.models import TransformerStack, megatron_seeds
from autostrat.rules import make_rule
from autostrat.runtime.job import make_job
from autostrat.runtime.local import run_job_locally
from autostrat.search import SearchOptions, search
from autostrat.search.problem import build_problem
from autostrat.search.propagate import TIE_BREAKS, _propagate, propagate, seeded_layers
from autostrat.strategies import generate_strategies

MB = 1e6


class TwoReaders(Cell):
    """Shardy's case: ReLU's output, split by rows, is read by two MatMuls that both want it
    split by columns."""

    def __init__(self):
        super().__init__()
        self.relu = ops.ReLU()
        self.left, self.right = ops.MatMul(), ops.MatMul()
        self.w1 = Parameter(initializer("normal", (32, 16)), name="w1")
        self.w2 = Parameter(initializer("normal", (32, 16)), name="w2")
        self.add = ops.Add()

    def construct(self, x):
        x = self.relu(x)
        return self.add(self.left(x, self.w1), self.right(x, self.w2))


def two_reader_plan():
    net = TwoReaders()
    net.relu.shard(((8, 1),))
    net.left.shard(((1, 8), (8, 1)))
    net.right.shard(((1, 8), (8, 1)))
    return search(trace(net, Tensor(shape=(16, 32)), device_num=8), 8)


def test_two_readers_wanting_one_layout_share_one_redistribution():
    plan = two_reader_plan()
    into = {(e.consumer, e.input_index): e for e in plan.redistributions if e.tensor == "relu:0"}
    assert into[("right", 0)].shares == ("left", 0) and into[("left", 0)].shares is None
    # One AllToAll of the 16 x 32 float32 tensor (2 KB per device before it): 7/8 of it leaves.
    assert [s.kind for s in into[("left", 0)].plan.steps] == ["AllToAll"]
    assert into[("right", 0)].cost == 0 and into[("left", 0)].cost == 7 * 16 * 32 * 4 // 64
    assert plan.bytes_into("right") < plan.bytes_into("left")
    check = run_job_locally(make_job(plan))
    assert check.bytes_match and check.results_match, check.text


def test_the_sliced_dump_reads_the_shared_redistribution(tmp_path):
    text = (two_reader_plan().dump_ir(tmp_path)[1]).read_text()
    assert "%relu:0.to.left[0].0 = " in text and "relu:0.to.right[0]" not in text
    assert "MatMul(%relu:0.to.left[0].0, %w2)" in text


def stack(layers: int, hidden: int = 1024, seeds: str = "first", device_num: int = 8):
    net = TransformerStack(layers=layers, hidden=hidden, heads=16, seq=128, batch=16)
    graph = trace(net, *net.example_inputs(), device_num=device_num)
    seeded = megatron_seeds(layers, 4, first_layer_only=seeds == "first", data_parallel=device_num // 4)
    return build_training(apply_seeds(graph, seeded, device_num), Adam())


def followed_plan(graph):
    """The plan propagated following the seeded layer (which the default keeps only when it is
    the cheaper start: on this stack it is not)."""
    from autostrat.search.search import _plan_of

    problem = build_problem(graph, 8, allow_repeated=True)
    assignment = min((_propagate(problem, None, True, tie) for tie in TIE_BREAKS), key=lambda a: problem.cost(a.choice))
    return _plan_of(problem, graph, 8, SearchOptions(), assignment, assignment.choice, None)


def test_unseeded_layers_follow_the_seeded_layer():
    plan = followed_plan(stack(3, hidden=64))
    follows = {name: op.origin for name, op in plan.ops.items() if op.origin.startswith("follows blocks.0.")
               and not name.startswith("optimizer/")}  # an update op follows its parameter
    assert follows["blocks.2.ln1.layer_norm"] == "follows blocks.0.ln1.layer_norm"
    for name in follows:
        assert str(plan.ops[name].strategy) == str(plan.ops[name.replace(name.split(".")[1], "0", 1)].strategy)
    # Inside each block the same bytes; a later block also gathers what the block before it
    # scattered (block 0 loads the input as it wants it).
    inside = {i: sum(e.cost for e in plan.redistributions
                     if e.consumer.startswith(f"blocks.{i}.") and e.tensor.startswith(f"blocks.{i}.")) for i in range(3)}
    assert inside[0] == inside[1] == inside[2] > 0
    unfollowed = search(stack(3, hidden=64), 8, SearchOptions(follow_layers=False))
    assert not any(op.origin.startswith("follows blocks.") for name, op in unfollowed.ops.items()
                   if not name.startswith("optimizer/"))


@pytest.mark.parametrize("model_parallel", [4, 8])
def test_following_a_seeded_layer_is_a_start_the_propagation_leaves_when_it_costs_more(model_parallel):
    # Forward only, block 0 seeded: copying its strategies into blocks 1 and 2 cost more than
    # propagating them (a default must never lose to turning it off).
    net = TransformerStack(layers=3, hidden=64, heads=8, seq=16, batch=4)
    seeds = megatron_seeds(3, model_parallel, first_layer_only=True, data_parallel=8 // model_parallel)
    problem = build_problem(apply_seeds(trace(net, *net.example_inputs(), device_num=8), seeds, 8), 8)
    each = {follow: min(problem.cost(_propagate(problem, None, follow, tie).choice) for tie in TIE_BREAKS)
            for follow in (True, False)}
    assert each[False] < each[True]
    assert problem.cost(propagate(problem).choice) == min(each.values())
    assert problem.cost(propagate(problem, follow_layers=False).choice) == each[False]


def test_a_layer_with_other_shapes_does_not_follow():
    problem = build_problem(stack(2, hidden=64), 8, allow_repeated=True)
    leaders = seeded_layers(problem)
    assert leaders["blocks.1.ffn2.matmul"] == "blocks.0.ffn2.matmul"
    assert not any(name.startswith("blocks.0.") for name in leaders)  # the seeded layer leads


def test_seeding_one_block_costs_what_seeding_every_block_does():
    """Issue #15's stack (B=16, S=128, H=1024, 16 heads, 8 devices, TP 4 x DP 2 on block 0):
    MindSpore 2.10 sends 302 MB per training step with the same seeds, JAX-Shardy 384 MB."""
    first, every = search(stack(8), 8), search(stack(8, seeds="all"), 8)
    assert first.total_bytes == every.total_bytes < 302 * MB
    phases = first.phase_bytes()
    assert phases["backward"] <= 1.05 * phases["forward"]  # backward follows forward
    assert phases["sync"] == pytest.approx(8 * 12 * 1024 * 1024 * 4 / 4, rel=0.01)  # weights / TP, AllReduce over 2


def test_propagation_keeps_the_cheaper_tie_break():
    problem = build_problem(stack(2, hidden=64), 8, allow_repeated=True)
    each = [problem.cost(_propagate(problem, None, follow, tie).choice) for follow in (True, False) for tie in TIE_BREAKS]
    assert problem.cost(propagate(problem).choice) == min(each)


def test_gradients_of_one_activation_are_added_before_one_reduction():
    plan = search(stack(1, hidden=64), 8)
    accumulate = plan.ops["accumulate/blocks.0.ln1.layer_norm:0"].strategy
    assert accumulate.sums_partials and str(accumulate).endswith("partial sums")
    kinds = [(e.consumer, s.kind) for e in plan.redistributions if e.cost for s in e.plan.steps
             if e.consumer.startswith("accumulate/blocks.0.ln1")]
    assert kinds == []  # Q's, K's and V's partial input gradients are added where they are


def test_partial_sum_strategies_need_repeated_work_and_a_linear_op():
    add = make_rule("Add", [(8, 8), (8, 8)])
    summing = [s for s in generate_strategies(add, 8, allow_repeated=True) if s.sums_partials]
    assert summing and all(s.repeat > 1 for s in summing)
    assert not any(s.sums_partials for s in generate_strategies(add, 8))
    assert not any(s.sums_partials for s in generate_strategies(make_rule("Mul", [(8, 8), (8, 8)]), 8, allow_repeated=True))
    strategy = Strategy(add, (2, 1), 8, sums_partials=True)
    assert [layout.partial for layout in strategy.input_layouts + strategy.output_layouts] == [(0,)] * 3
    with pytest.raises(LayoutError, match="partial-sum inputs need a repeated-calculation axis"):
        Strategy(add, (2, 4), 8, sums_partials=True)


def test_a_training_step_with_partial_sums_and_shared_redistributions_matches_one_device():
    plan = search(stack(1, hidden=32), 8)
    assert any(op.strategy.sums_partials for op in plan.ops.values())
    assert any(e.shares for e in plan.redistributions)
    check = run_job_locally(make_job(plan, steps=2))
    assert check.bytes_match and check.results_match, check.text
    assert np.isfinite(plan.total_bytes)


def test_branch_and_bound_chooses_what_pricing_every_candidate_chooses(monkeypatch):
    """`total_cost` skips candidates that cannot be cheapest (by their bounds and by the terms
    priced so far); choosing from every candidate's full price must give the same plan, on a
    training stack where ties are common."""
    import autostrat.search.propagate as propagation

    def every_price(base, terms):
        return base + sum((term(None) for term in terms), np.zeros(len(base)))

    graph = stack(2, hidden=64)
    fast = {tie: _propagate(build_problem(graph, 8, allow_repeated=True), None, True, tie).choice for tie in TIE_BREAKS}
    monkeypatch.setattr(propagation, "total_cost", every_price)
    slow = {tie: _propagate(build_problem(graph, 8, allow_repeated=True), None, True, tie).choice for tie in TIE_BREAKS}
    assert fast == slow


def test_remembered_choices_are_the_choices_priced_again(monkeypatch):
    """`best_candidate`'s memo (`candidate_prices.choice_key`) gives every op of a 4-layer
    training stack, seeded on every block, the candidate pricing it again gives, in both tie-breaks
    and followed or not, while pricing fewer ops: the repeated layers meet equal keys."""
    import autostrat.search.propagate as propagation

    priced = []
    counted = propagation.total_cost
    monkeypatch.setattr(propagation, "total_cost", lambda base, terms: priced.append(1) or counted(base, terms))
    problem = build_problem(stack(4, hidden=64, seeds="all"), 8, allow_repeated=True)
    for follow in (True, False):
        for tie in TIE_BREAKS:
            priced.clear()
            again = _propagate(problem, None, follow, tie).choice
            every = len(priced)
            priced.clear()
            assert _propagate(problem, None, follow, tie, memo={}).choice == again
            assert len(priced) < every / 2


def test_a_candidate_stops_being_priced_once_its_terms_exceed_the_best():
    """`candidate_total` prices terms in order and stops past `best`; a tie is priced whole."""
    from autostrat.search.candidate_prices import candidate_total

    priced = []

    def term(price):
        def read(indices):
            priced.append(price)
            return np.array([price])
        return read

    terms = [term(2.0), term(3.0), term(100.0)]
    assert candidate_total(1.0, terms, 0, 4.0) == np.inf and priced == [2.0, 3.0]  # 1 + 2 + 3 > 4: 100 never priced
    priced.clear()
    assert candidate_total(1.0, terms, 0, 106.0) == 106.0 and priced == [2.0, 3.0, 100.0]  # tied with the best


def test_a_partial_target_from_fewer_partial_values_is_priced_by_the_search():
    # Issue #32: these pairs were priced inf (no step created partial values); the missing
    # contributions are now created for free, after the gathers the brute force also finds.
    from autostrat.layout import DeviceMatrix, Layout, TensorMap
    from autostrat.redistribution import cost_table
    from tests.redistribution_oracle import oracle_cost

    whole = Layout(DeviceMatrix((2, 4)), TensorMap((1, 0)), (8, 8))
    summed = Layout(DeviceMatrix((2, 4)), TensorMap((1, -1)), (8, 8), (0,))
    twice = Layout(DeviceMatrix((8,)), TensorMap((-1, -1)), (8, 8), (0,))  # 8 partial values, not 4
    table = cost_table([whole, summed], [summed, twice]).tolist()
    assert table == [[oracle_cost(src, dst) for dst in (summed, twice)] for src in (whole, summed)] == [[96, 224], [0, 128]]


def test_a_sum_of_partial_gradients_fed_whole_ones_is_priced_and_searched():
    # Issue #32: the gradient accumulation of ln1's output may sum partial inputs; its inputs'
    # producers (MatMul gradients) have candidates whose output is not partial. Those pairs
    # were priced inf; a PartialCreate now feeds them, at the planner's exact price.
    from autostrat.autodiff import build_backward
    from autostrat.models import GPT
    from autostrat.redistribution import redistribution_cost

    net = GPT(layers=1, hidden=32, heads=4, seq=8, batch=4, vocab=64)
    graph = build_backward(trace(net, *net.example_inputs(), device_num=8))
    problem = build_problem(graph, 8, allow_repeated=True)
    accumulate = "accumulate/blocks.0.ln1.layer_norm:0"
    fed = 0
    for edge in (e for e in problem.edges if e.consumer == accumulate):
        for i, producer in enumerate(problem.candidates[edge.producer]):
            source = edge.source_layout(producer)
            for j, consumer in enumerate(problem.candidates[accumulate]):
                wanted = consumer.input_layouts[edge.input_index]
                assert np.isfinite(edge.table[i, j])
                if wanted.partial and not source.partial:
                    assert edge.table[i, j] == redistribution_cost(source, wanted, graph.tensors[edge.tensor].dtype)
                    fed += 1
    assert fed > 0
    plan = search(graph, 8)
    assert 0 < plan.total_bytes < float("inf")


def test_an_op_loading_a_parameter_never_sums_partial_inputs():
    from autostrat.autodiff import build_backward
    from autostrat.models import GPT

    net = GPT(layers=1, hidden=32, heads=4, seq=8, batch=4, vocab=64)
    problem = build_problem(build_backward(trace(net, *net.example_inputs(), device_num=8)), 8, allow_repeated=True)
    assert not any(s.sums_partials for s in problem.candidates["add_position"])  # reads the position table
    # Nor one reading a tensor no strategy leaves partial: a Reshape's and a BiasAdd's output.
    assert not any(s.sums_partials for s in problem.candidates["blocks.0.residual1"])
    # The gradients of ln1's output from Q, K and V (MatMuls, partial when k is split) may be summed partial.
    assert any(s.sums_partials for s in problem.candidates["accumulate/blocks.0.ln1.layer_norm:0"])
    assert any(s.sums_partials for s in problem.candidates["accumulate/blocks.0.ln1.layer_norm:0_1"])


def test_a_time_refinement_under_a_byte_plans_peak_starts_from_that_plan():
    """The plan propagated for time holds more than the one propagated for bytes here; with
    the byte plan's peak as budget and no time to search, the byte plan is the known fit."""
    graph = stack(4, hidden=64)
    budget = search(graph, 8).prediction.peak_bytes
    assert search(graph, 8, SearchOptions(cost_model="time")).prediction.peak_bytes > budget
    options = SearchOptions(cost_model="time", refine="cpsat", coarsen="layers", max_device_memory=budget,
                            refine_time_limit=0.01)
    plan = search(graph, 8, options)
    assert plan.prediction.peak_bytes <= budget and plan.refinement.result.status in ("FEASIBLE", "OPTIMAL")
