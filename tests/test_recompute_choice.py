"""Recompute searched under a memory budget (`auto_recompute`, ``recompute: auto``): the count
search against brute force over every count, and the chosen plan against the plans of every
count forced."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autostrat.autodiff import Adam
from autostrat.autodiff.recompute import RECOMPUTE_PREFIX
from autostrat.errors import ConfigError, InfeasibleError, SolverError
from autostrat.frontend.api import plan_for
from autostrat.frontend.config import load_config
from autostrat.frontend.context import ParallelContext
from autostrat.frontend.tensor import Tensor
from autostrat.frontend.train import synthetic_batches
from autostrat.models import TransformerStack
from autostrat.runtime.executor import graph_values
from autostrat.runtime.training import reference_graph, train_locally, train_single_device
from autostrat.search.recompute_choice import choose_recompute, plan_cost, repeated_layers

ROOT = Path(__file__).resolve().parent.parent


def _fake_plan(cost: int, peak: int):
    return SimpleNamespace(cost_model="time", prediction=SimpleNamespace(step_time_ns=cost, peak_bytes=peak))


@st.composite
def _counts(draw):
    """Per count 0..n: a cost and a peak, where the peaks fall with the count (so whether a
    count fits is monotone) and the costs over the counts fall, then rise."""
    n = draw(st.integers(1, 9))
    peaks = sorted(draw(st.lists(st.integers(1, 50), min_size=n + 1, max_size=n + 1)), reverse=True)
    turn = draw(st.integers(0, n))
    falling = sorted(draw(st.lists(st.integers(0, 30), min_size=turn + 1, max_size=turn + 1)), reverse=True)
    rising = sorted(draw(st.lists(st.integers(falling[-1], 60), min_size=n - turn, max_size=n - turn)))
    budget = draw(st.one_of(st.none(), st.integers(0, 55)))
    missing = draw(st.sets(st.integers(0, n)))  # counts whose search fails: proven infeasible
    return n, peaks, falling + rising, budget, missing


@settings(max_examples=300, deadline=None)
@given(_counts())
def test_the_count_search_finds_the_brute_force_best(case):
    n, peaks, costs, budget, infeasible = case
    # Infeasible counts must keep fitting monotone: a proof that nothing fits at k holds below k.
    infeasible = set(range(max(infeasible) + 1)) if infeasible else set()
    tried = []

    def plan_with(cells):
        count = len(cells)
        tried.append(count)
        if count in infeasible:
            raise InfeasibleError(f"{count}: nothing fits")
        return _fake_plan(costs[count], peaks[count])

    layers = tuple(f"blocks.{i}" for i in range(n))
    fitting = [k for k in range(n + 1) if k not in infeasible and (budget is None or peaks[k] <= budget)]
    if budget is None:
        fitting = [0] if 0 not in infeasible else []
    if not fitting:
        with pytest.raises(InfeasibleError):
            choose_recompute(plan_with, layers, budget)
        return
    plan, choice = choose_recompute(plan_with, layers, budget)
    best = min(fitting, key=lambda k: (costs[k], k))
    assert choice.count == best and plan_cost(plan) == costs[best] and choice.cells == layers[:best]
    assert len(tried) == len(set(tried))  # no count planned twice
    assert len(tried) <= n.bit_length() + 2 + n - min(fitting)  # bisection, then the descent


def test_a_count_over_the_budget_or_unsolved_is_reported_not_chosen():
    plans = {0: SolverError("time limit"), 1: _fake_plan(10, 120), 2: _fake_plan(12, 90)}

    def plan_with(cells):
        found = plans[len(cells)]
        if isinstance(found, Exception):
            raise found
        return found

    plan, choice = choose_recompute(plan_with, ("a.0", "a.1"), 100)
    assert choice.count == 2 and plan is plans[2]
    summary = choice.summary()
    assert "0: no plan (none found within the time limit)" in summary
    assert "1: 10 ns, peak 120 bytes (over the budget)" in summary


def test_repeated_layers_are_cells_of_a_cell_list_in_forward_order():
    assert repeated_layers(["head.0.mm", "blocks.1.mm", "blocks.0.mm", "head.1.mm"]) == ("head.0", "blocks.1", "blocks.0", "head.1")


# A stack whose activations outweigh its weights, small enough for CP-SAT to prove every plan.
_STACK = dict(layers=2, hidden=8, heads=2, seq=16, batch=8)
_BUDGET = 100_000  # no plan without recompute fits (proven); one layer or two do


def _stack_plan(recompute=(), **context):
    net = TransformerStack(**_STACK)
    inputs = (Tensor(shape=(128, 8)), Tensor(shape=(128, 8)))
    ctx = ParallelContext(parallel_mode="auto_parallel", device_num=2, phase="train", max_device_memory=_BUDGET, **context)
    return plan_for(net, inputs, ctx, optimizer=Adam(1e-3), recompute=recompute)


@pytest.mark.slow
def test_auto_recompute_chooses_the_cheapest_count_that_fits():
    forced = {}
    for count in range(3):
        try:
            forced[count] = _stack_plan(tuple(f"blocks.{i}" for i in range(count)))
        except InfeasibleError:
            continue
    assert 0 not in forced and forced, "the budget must make recompute matter"
    assert all(plan.refinement.result.status == "OPTIMAL" for plan in forced.values())
    best = min(forced, key=lambda count: (plan_cost(forced[count]), count))
    plan = _stack_plan(auto_recompute=True)
    assert plan.recompute.count == best and plan_cost(plan) == plan_cost(forced[best])
    assert plan.prediction.peak_bytes <= _BUDGET
    recomputed = {name.removeprefix(RECOMPUTE_PREFIX).split(".")[1] for name in plan.ops if name.startswith(RECOMPUTE_PREFIX)}
    assert recomputed == {str(i) for i in range(best)}
    assert plan.to_dict()["recompute"]["count"] == best
    assert "recompute searched: " in plan.table()
    values, batches = graph_values(plan.graph, {}), synthetic_batches(plan.graph, 2)
    run, alone = train_locally(plan, values, batches), train_single_device(reference_graph(plan), values, batches)
    np.testing.assert_allclose(run.losses, alone.losses, rtol=1e-5)
    assert run.bytes_match and max(run.measured_peaks) <= _BUDGET


def test_auto_recompute_is_refused_without_a_training_step_or_layers():
    net = TransformerStack(**_STACK)
    inputs = (Tensor(shape=(128, 8)), Tensor(shape=(128, 8)))
    with pytest.raises(ConfigError, match="auto_recompute chooses layers to recompute in a training step"):
        plan_for(net, inputs, ParallelContext(device_num=2, auto_recompute=True))
    with pytest.raises(ConfigError, match="TransformerStack.* has none left to choose"):
        _stack_plan(("blocks",), auto_recompute=True)


_STACK_YAML = """\
parallel_mode: auto_parallel
device_num: 2
optimizer: {name: adam, learning_rate: 0.001}
model: {name: TransformerStack, params: {layers: 2, hidden: 8, heads: 2, seq: 16, batch: 8}}
inputs: [{shape: [128, 8]}, {shape: [128, 8]}]
"""


def test_yaml_and_the_command_line_turn_auto_recompute_on(tmp_path, capsys):
    from autostrat.cli import main

    path = tmp_path / "stack.yaml"
    path.write_text(_STACK_YAML + "recompute: auto\n")
    assert load_config(path).context.auto_recompute and load_config(path).recompute == ()
    path.write_text(_STACK_YAML)
    assert main(["search", str(path), "--recompute", "auto", "--max-device-memory", str(_BUDGET)]) == 0
    out = capsys.readouterr().out
    assert "recompute searched: 2 of 2 layers (blocks.0, blocks.1); counts tried: 0: no plan (proven not to fit)" in out
    assert "recompute/blocks.1." in out


def test_auto_recompute_runs_on_mpi_ranks(tmp_path):
    from tests.test_mpi import assert_nothing_left, run

    path = tmp_path / "stack.yaml"
    path.write_text(_STACK_YAML + f"recompute: auto\nmax_device_memory: {_BUDGET}\n")
    code, out, err, run_dir, _ = run(tmp_path, str(path), "--device-num", "2", "--steps", "2", timeout=180)
    assert code == 0, err
    assert "recompute searched: 2 of 2 layers" in out and "recompute/blocks.1." in out
    assert "bytes: measured = predicted on every rank" in out and ": OK" in out and "measured/predicted 1.000..1.000: equal" in out
    assert_nothing_left(run_dir, 2)
