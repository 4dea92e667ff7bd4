"""The refinement at coarsening "exact" (`search.solve.untied`): never worse than the layer-tied
optimum, even when CP-SAT finds nothing on the untied model (as on the 7B-shaped step within its
time); never worse than BFS; its bound a lower bound on the true optimum (brute force)."""

from __future__ import annotations

import functools

import pytest
from ortools.sat.python import cp_model

import autostrat.search.refine as refine_module
from autostrat.autodiff import SGD, build_training
from autostrat.frontend import trace
from autostrat.frontend.config import apply_seeds
from autostrat.models import GPT, megatron_seeds
from autostrat.search.deadline import Deadline
from autostrat.search.problem import build_problem
from autostrat.search.propagate import propagate
from autostrat.search.refine import refine
from autostrat.search.solve.convert import shares_nothing
from autostrat.search.solve.refinement import SOLVER, _relaxed_bound
from autostrat.search.solve.untied import refine_untied
from tests.test_refine import CASES, brute_force, small_problem


@functools.cache
def gpt_training():
    """A 2-block GPT training step on 2 devices, Megatron's seeds on block 0: its backward blocks
    repeat; BFS sends 49 920 bytes, the tied optimum 34 816, the untied one 20 480."""
    net = GPT(layers=2, hidden=32, heads=4, seq=8, batch=4, vocab=64)
    graph = apply_seeds(trace(net, *net.example_inputs(), device_num=2), megatron_seeds(2, 2, first_layer_only=True), 2)
    return build_problem(build_training(graph, SGD(1e-3)), 2)


@pytest.fixture
def untied_finds_nothing(monkeypatch):
    """CP-SAT's solve of the untied model ends without a plan; the tied model's is solved."""
    solve = refine_module._solve

    def tied_only(problem, built, objective, *args):
        if built.coarse.level == "exact":
            return cp_model.UNKNOWN, None, objective.constant  # the constant bytes: a true bound
        return solve(problem, built, objective, *args)

    monkeypatch.setattr(refine_module, "_solve", tied_only)


def test_the_exact_refinement_is_never_worse_than_the_tied_optimum(untied_finds_nothing):
    problem = gpt_training()
    bfs = propagate(problem).choice
    tied = refine(problem, bfs, time_limit=30, coarsen_level="layers")
    assert tied.status == "OPTIMAL" and not tied.exact and tied.objective < problem.cost(bfs)  # BFS is not tied-optimal
    exact = refine(problem, bfs, time_limit=30, coarsen_level="exact")
    assert exact.exact and exact.objective <= tied.objective
    untied = refine_untied(problem, bfs, time_limit=30, rounds=20)
    assert untied.objective == problem.cost(untied.choice) <= tied.objective
    assert "then the IOPDDL solver" in untied.coarsening  # CP-SAT proved nothing: the solver ran


def test_a_proven_exact_optimum_is_returned_without_the_solver():
    problem = gpt_training()
    untied = refine_untied(problem, propagate(problem).choice, time_limit=30)
    assert untied.status == "OPTIMAL" and untied.solver == "CP-SAT" and "IOPDDL" not in untied.coarsening
    assert untied.objective == untied.bound == problem.cost(untied.choice)


@pytest.mark.parametrize("device_num, seed", CASES[1::5])
def test_after_the_solver_the_bound_holds_and_the_plan_is_never_worse_than_bfs(untied_finds_nothing, device_num, seed):
    """Random graphs (every one has shared readers) whose CP-SAT solve finds nothing: the bound
    is the relaxed instance's."""
    problem = small_problem(device_num, seed)
    bfs = propagate(problem).choice
    result = refine_untied(problem, bfs, time_limit=30, rounds=20)
    assert result.bound <= brute_force(problem) <= result.objective == problem.cost(result.choice) <= problem.cost(bfs)
    assert result.solver == SOLVER or result.objective == problem.cost(bfs)


def test_the_relaxed_bound_never_exceeds_the_optimum():
    """`refinement._relaxed_bound`, the solver's bound under shared readers, against brute force."""
    bounds, optima = [], []
    for device_num, seed in CASES:
        problem = small_problem(device_num, seed)
        assert not shares_nothing(problem)
        bounds.append(_relaxed_bound(problem, Deadline(60.0)))
        optima.append(brute_force(problem))
    assert all(bound <= optimum for bound, optimum in zip(bounds, optima))
    assert sum(0 < bound for bound in bounds) >= len(CASES) // 3  # not a bound of 0 everywhere
    assert any(0 < bound == optimum for bound, optimum in zip(bounds, optima))  # and tight on some
