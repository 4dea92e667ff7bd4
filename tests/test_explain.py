"""explain(plan, op): the chain back to the seed, and alternatives checked against rebuilt plans."""

from __future__ import annotations

import pytest

from autostrat.errors import ConfigError
from autostrat.frontend import trace
from autostrat.frontend.config import load_config
from autostrat.frontend.run import plan_config
from autostrat.models import FFN
from autostrat.nn import Tensor
from autostrat.report.alternatives import other_candidates, swapped_plan
from autostrat.report.explain import explain
from autostrat.search import SearchOptions, search
from autostrat.search.plan import build_plan
from autostrat.search.search import follow_parameters
from autostrat.search.problem import searched_graph


def _ffn_plan(options: SearchOptions = SearchOptions()):
    net = FFN()
    net.dense1.matmul.shard(((2, 1), (1, 4)))
    return search(trace(net, Tensor(shape=(64, 64)), device_num=8), 8, options)


@pytest.fixture(scope="module")
def ffn():
    return _ffn_plan()


@pytest.fixture(scope="module")
def gpt():
    return plan_config(load_config("configs/gpt_train.yaml", phase="train"))[0]


def _rebuilt(plan, op, strategy):
    """The plan with `op` running `strategy`, built here from the strategies directly."""
    strategies = {name: o.strategy for name, o in plan.ops.items()}
    strategies[op] = strategy
    followers = searched_graph(plan.graph)[1]
    searched = {name: s for name, s in strategies.items() if name not in followers}
    strategies |= {name: s for name, (s, _) in follow_parameters(plan.graph, searched, plan.device_num).items()}
    return build_plan(plan.graph, plan.device_num, plan.mode, strategies, {name: "" for name in strategies}, (),
                      cost_model=plan.cost_model, hardware=plan.hardware)


def _candidate(plan, op, text):
    return next(s for s in other_candidates(plan, op) if str(s) == text)


def _check_deltas(plan, op, alternative):
    other = _rebuilt(plan, op, _candidate(plan, op, alternative.strategy))
    assert alternative.phase_bytes == {p: other.phase_bytes()[p] - plan.phase_bytes()[p] for p in plan.phase_bytes()}
    assert alternative.bytes == other.total_bytes - plan.total_bytes
    assert alternative.step_time_ns == other.prediction.step_time_ns - plan.prediction.step_time_ns
    assert alternative.peak_bytes == other.prediction.peak_bytes - plan.prediction.peak_bytes


def test_every_propagated_chain_ends_at_the_seed_with_the_plans_edge_bytes(ffn):
    for name, op in ffn.ops.items():
        chain = explain(ffn, name, alternatives=0).chain
        assert chain[0].op == name and chain[-1].op == "dense1.matmul" and chain[-1].origin == "seed"
        for hop, following in zip(chain, chain[1:]):
            assert hop.source == following.op and hop.origin == f"propagated from {following.op}"
            assert hop.tensors == (ffn.graph.ops[following.op].outputs[0],)
            paid = [e.cost for e in ffn.redistributions if e.tensor in hop.tensors and e.consumer == hop.op]
            assert hop.bytes == sum(paid)
    assert explain(ffn, "dense2.bias_add").chain[0].bytes == 6144  # the plan's one ReduceScatter


def test_every_candidate_evaluated_matches_a_rebuild_and_its_local_delta(ffn):
    # Brute force: every candidate of every op evaluated. The FFN's redistributions are never
    # shared, so the local change in bytes is the plan's whole change.
    for name in ffn.ops:
        why = explain(ffn, name, alternatives=100)
        assert why.alternatives and all(a.evaluated for a in why.alternatives)
        for alternative in why.alternatives:
            _check_deltas(ffn, name, alternative)
            assert alternative.local_bytes == alternative.bytes
            assert alternative.better == (alternative.bytes < 0)


def test_the_evaluated_alternatives_are_the_best_ranked(ffn):
    for name in ffn.ops:
        alternatives = explain(ffn, name, alternatives=3).alternatives
        evaluated = [a for a in alternatives if a.evaluated]
        assert len(evaluated) == 3 and len(alternatives) == explain(ffn, name).candidates
        assert all(a.local_bytes >= evaluated[-1].local_bytes for a in alternatives if not a.evaluated)
        assert [a.local_bytes for a in evaluated] == sorted(a.local_bytes for a in evaluated)


def test_reasons_are_truthful(ffn):
    why = explain(ffn, "dense2.matmul")
    best = why.alternatives[0]
    assert best.better and best.reason.startswith(f"better by {-best.bytes:,} bytes") and "--refine cpsat" in best.reason
    seeded = explain(ffn, "dense1.matmul")
    assert "seed fixes this op" in seeded.text
    worse = explain(ffn, "dense1.bias_add").alternatives[0]
    assert worse.bytes > 0 and worse.reason.startswith(f"sends +{worse.bytes:,} bytes")
    assert "grows from 0 to" in worse.reason


def test_an_unknown_op_is_refused_with_close_names(ffn):
    with pytest.raises(ConfigError, match=r"the plan has no op named 'dense2.matmull'; did you mean dense2.matmul"):
        explain(ffn, "dense2.matmull")


def test_a_refined_plan_names_the_solver_for_the_ops_it_changed():
    plan = _ffn_plan(SearchOptions(refine="cpsat"))
    assert plan.refinement.changed
    for name in plan.refinement.changed:
        why = explain(plan, name, alternatives=1)
        assert why.origin.startswith("chosen by the CP-SAT refinement (objective 6,144 -> 1,536 bytes per device, OPTIMAL")
        assert len(why.chain) == 1
        _check_deltas(plan, name, why.alternatives[0])
    kept = next(name for name in plan.ops if name not in plan.refinement.changed and name != "dense1.matmul")
    assert "CP-SAT, which kept" in explain(plan, kept, alternatives=0).text


def test_a_plan_refined_by_the_iopddl_solver_names_it():
    plan = _ffn_plan(SearchOptions(refine="solve"))
    assert plan.refinement.changed
    for name in plan.refinement.changed:
        why = explain(plan, name, alternatives=0)
        assert why.origin.startswith("chosen by the IOPDDL solver's refinement (objective 6,144 -> 1,536 bytes per "
                                     "device, FEASIBLE")
    kept = next(name for name in plan.ops if name not in plan.refinement.changed)  # the seeded dense1.matmul at least
    assert "refined by the IOPDDL solver, which kept" in explain(plan, kept, alternatives=0).text


def test_a_training_plan_rebuilt_unchanged_predicts_the_same(gpt):
    for name in ("blocks.1.ffn1.matmul", "bprop/blocks.1.ffn1.matmul/mat_mul_1", "blocks.0.ln1.layer_norm"):
        same = swapped_plan(gpt, name, gpt.ops[name].strategy)
        assert same.prediction == gpt.prediction and same.redistributions == gpt.redistributions


def test_a_backward_op_of_a_training_plan(gpt):
    name = "bprop/blocks.1.ffn1.matmul/mat_mul_1"
    why = explain(gpt, name)
    assert why.origin == "backward of blocks.1.ffn1.matmul"
    assert [hop.op for hop in why.chain] == [name, "blocks.1.ffn1.matmul"] and why.chain[-1].origin == "seed"
    evaluated = [a for a in why.alternatives if a.evaluated]
    assert len(evaluated) == 3
    for alternative in evaluated:
        _check_deltas(gpt, name, alternative)
    assert "sync" in why.text  # its weight gradient's synchronisation changes too


def test_an_update_op_follows_its_parameters_first_reader(gpt):
    why = explain(gpt, "optimizer/blocks.1.ffn1.weight")
    assert why.origin == "follows blocks.1.ffn1.weight"
    assert why.chain[1].op == "blocks.1.ffn1.matmul" and why.chain[0].tensors == ("blocks.1.ffn1.weight",)
    assert not why.searched and why.alternatives == ()
    assert "alternatives: none (not searched)" in why.text


def test_a_propagated_op_of_a_training_plan_changes_its_parameters_update(gpt):
    why = explain(gpt, "blocks.1.ffn1.bias_add")
    for alternative in why.alternatives[:3]:
        _check_deltas(gpt, "blocks.1.ffn1.bias_add", alternative)
    assert why.alternatives[0].phase_bytes["sync"] > 0  # the bias's update follows its new layout
