"""The vectorised brute force (tests/brute_force.py) against the slow exact evaluators it
replaces in the solver tests: `SearchProblem.cost` (shared and pairwise) and
`memory.peak_bytes`, on sampled choices of every random case."""

from __future__ import annotations

import numpy as np
import pytest

from autostrat.search.memory import peak_bytes
from tests.brute_force import choice_at, costs, every_choice, peaks
from tests.test_refine import CASES, small_problem


@pytest.mark.parametrize("device_num, seed", CASES)
def test_every_choice_costs_and_holds_what_the_problem_says(device_num, seed):
    problem = small_problem(device_num, seed)
    choices = every_choice(problem)
    assert len(choices) == np.prod([len(c) for c in problem.candidates.values()])
    rows = np.random.default_rng(seed).choice(len(choices), size=min(150, len(choices)), replace=False)
    shared, pairwise, peak = costs(problem, choices[rows]), costs(problem, choices[rows], shared=False), peaks(problem, choices[rows])
    for at, row in enumerate(rows):
        choice = choice_at(problem, choices[row])
        assert shared[at] == problem.cost(choice)
        assert pairwise[at] == problem.cost(choice, shared=False)
        assert peak[at] == peak_bytes(problem, choice)


def test_the_sampled_cases_include_shared_readers():
    # Sharing must be exercised, or the comparison above would not test the shared rule.
    assert sum(bool((costs(p, every_choice(p)) != costs(p, every_choice(p), shared=False)).any())
               for p in (small_problem(d, s) for d, s in CASES[:10])) >= 2
