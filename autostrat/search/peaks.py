"""The memory constraints of the solver's model: the bytes live at each step of the schedule as
linear forms over the one-hot booleans, keeping only the steps no other step implies.

A step's form is ``constant + sum(coefficient * boolean)`` over the coarse model's booleans
(column ``(owner, kept index)``). Two reductions, both exact (tested against `peak_bytes` on
brute-forced and random choices):

1. Dominance. Exactly one boolean per owner is true, so form A bounds form B for every choice
   when ``constant_A - constant_B + sum over owners of min over the owner's columns of (A - B)
   >= 0``; B is dropped. With shared layers, each forward step of layer k+1 holds what the same
   step of layer k holds plus one more layer's saved activations: only the last layer's remain.
2. Progressions (`_drop_progressions`). A backward step of layer k holds k layers' saved
   activations and the gradients of the layers after it: linear in k, so only the first and
   the last shared layer's steps can hold the peak.

Without them a 32-layer training step had 2,360 constraints, each as long as the whole stack
(26,777 terms, built in 36 s); with them, 113 of at most 1,262 terms (0.2 s), whatever the depth.
The forms are built in step order as a running sum (add a tensor's bytes where it is produced,
remove them after its last use), linear in the tensors rather than in steps times live tensors.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np

from autostrat.search.coarsen import Coarsening
from autostrat.search.memory import TensorBytes, spans, tensor_bytes
from autostrat.search.problem import SearchProblem

_CONSTANT, _NEVER = -1, -2  # a candidate's bytes are always held, or its candidate cannot be chosen
WINDOW = 16  # a large model's new form is compared with this many kept ones at least...
COMPARED = 1_000_000  # ...and with as many more as this many coefficients allow


@dataclass(frozen=True)
class PeakForms:
    """Each form bounds the bytes live at one step: ``constant + values @ booleans[indices]``,
    the booleans being ``columns`` (owner, kept index) of the coarse model."""

    columns: tuple[tuple[str, int], ...]
    forms: tuple[tuple[int, np.ndarray, np.ndarray], ...]  # (constant, indices, values)


def peak_forms(problem: SearchProblem, coarse: Coarsening) -> PeakForms:
    """The per-step forms of the per-device peak (parameters plus live activations) that no
    other form implies.

    Example:
        >>> from autostrat.frontend import trace
        >>> from autostrat.models import FFN
        >>> from autostrat.nn import Tensor
        >>> from autostrat.search.coarsen import coarsen
        >>> from autostrat.search.problem import build_problem
        >>> problem = build_problem(trace(FFN(), Tensor(shape=(64, 64)), device_num=8), 8)
        >>> forms = peak_forms(problem, coarsen(problem, "exact", budget=True))
        >>> len(forms.forms), len(forms.columns)  # of its 5 steps, 4 may hold the peak
        (4, 36)
    """
    columns, starts, column_of = _columns(problem, coarse)
    resident, activations = tensor_bytes(problem)
    base_constant, base_row = 0, np.zeros(len(columns), dtype=np.int64)
    for item in resident:
        base_constant += _add(base_row, item, column_of[item.owner])
    antichain = _Antichain(starts, base_constant, base_row)
    intervals = spans(problem, activations)
    ops = list(problem.graph.ops)
    repeats = Counter(coarse.owner[ops[start]] for start in {start for start, _ in intervals})
    steps = _step_forms(ops, coarse, activations, intervals, column_of, len(columns))
    for constant, row in _drop_progressions(steps, repeats):
        antichain.add(constant, row)
    if not antichain.count:  # no activations: the parameters alone
        antichain.add(0, np.zeros(len(columns), dtype=np.int64))
    return PeakForms(columns, antichain.forms())


def _columns(problem: SearchProblem, coarse: Coarsening):
    """The boolean columns, where each owner's columns start, and per op a column (or `_CONSTANT`,
    `_NEVER`) per candidate."""
    offset, columns = {}, []
    for owner, count in coarse.variables.items():
        offset[owner] = len(columns)
        columns.extend((owner, kept) for kept in range(count))
    column_of = {}
    for op, candidates in problem.candidates.items():
        owner, mapped = coarse.owner[op], np.full(len(candidates), _NEVER)
        for kept, index in enumerate(coarse.kept[op]):
            if owner in offset:
                mapped[index] = offset[owner] + kept
            elif kept == 0:  # an owner without variables holds its first kept candidate
                mapped[index] = _CONSTANT
        column_of[op] = mapped
    return tuple(columns), np.array(sorted(offset.values()), dtype=np.intp), column_of


def _add(row: np.ndarray, item: TensorBytes, mapped: np.ndarray, sign: int = 1) -> int:
    """Add the item's bytes to `row` (in place); returns its constant bytes."""
    sizes = np.asarray(item.bytes, dtype=np.int64) * sign
    variable = mapped >= 0
    np.add.at(row, mapped[variable], sizes[variable])
    return int(sizes[mapped == _CONSTANT].sum())


def _step_forms(ops: list[str], coarse: Coarsening, activations: list[TensorBytes], intervals, column_of, width: int):
    """(owner of the step's op, constant, row) of the bytes live at every step that produces a
    tensor, in step order."""
    starting: dict[int, list[int]] = {}
    ending: dict[int, list[int]] = {}  # removed at the step after their last use
    for index, (start, end) in enumerate(intervals):
        starting.setdefault(start, []).append(index)
        ending.setdefault(end + 1, []).append(index)
    constant, row = 0, np.zeros(width, dtype=np.int64)
    for step in range(len(ops) + 1):
        for index in ending.get(step, ()):
            constant += _add(row, activations[index], column_of[activations[index].owner], -1)
        if step in starting:
            for index in starting[step]:
                constant += _add(row, activations[index], column_of[activations[index].owner])
            yield coarse.owner[ops[step]], constant, row.copy()


def _drop_progressions(steps, repeats: Counter):
    """The steps' (constant, row), less those midway between the previous and the next step of
    the same owner (the same op in another repeated layer; `repeats`: steps per owner).

    Where consecutive layers add the same bytes (k saved layers plus the gradients of the n-k
    after: linear in k), a run of such midpoints is an arithmetic progression: every form inside
    is a convex combination of the run's two ends, so for every choice it is at most the larger
    of them, and only the ends stay (a 96-layer stack keeps as many forms as a 3-layer one).
    """
    pending: dict[str, tuple] = {}  # owner -> (previous form, the form not yet decided)
    for owner, constant, row in steps:
        form = (constant, row)
        if repeats[owner] == 1:
            yield form
        elif owner not in pending:
            pending[owner] = (None, form)
        else:
            previous, current = pending[owner]
            if previous is None or not _midway(previous, current, form):
                yield current
            pending[owner] = (current, form)
    for _, current in pending.values():
        yield current


def _midway(previous, current, following) -> bool:
    return 2 * current[0] == previous[0] + following[0] and np.array_equal(2 * current[1], previous[1] + following[1])


class _Antichain:
    """The forms added so far that no other one dominates (first come wins among equal ones).

    A new form is compared with the latest kept ones, as many as `COMPARED` coefficients allow,
    at least `WINDOW`: every kept one in a model with few booleans, the neighbouring steps (where
    dominance mostly is) in a large one, whose forms would otherwise be compared pairwise.
    """

    def __init__(self, starts: np.ndarray, base_constant: int, base_row: np.ndarray):
        self.starts, self.base = starts, (base_constant, base_row)
        self.window = max(WINDOW, COMPARED // max(len(base_row), 1))
        self.constants = np.zeros(0, dtype=np.int64)
        self.rows = np.zeros((0, len(base_row)), dtype=np.int64)
        self.settled: list[tuple[int, np.ndarray, np.ndarray]] = []  # left the window: no longer compared

    @property
    def count(self) -> int:
        return len(self.settled) + len(self.constants)

    def _least(self, difference: np.ndarray, constants: np.ndarray) -> np.ndarray:
        """Per row, the least value of ``constants + difference @ booleans`` over one-hot choices."""
        if not len(self.starts):
            return constants
        return constants + np.minimum.reduceat(difference, self.starts, axis=1).sum(axis=1)

    def add(self, constant: int, row: np.ndarray) -> None:
        if (self._least(self.rows - row, self.constants - constant) >= 0).any():
            return  # a kept form is at least as large for every choice
        kept = self._least(row - self.rows, constant - self.constants) < 0
        constants, rows = np.append(self.constants[kept], constant), np.vstack([self.rows[kept], row])
        if len(constants) > self.window:
            self.settled.append(self._sparse(constants[0], rows[0]))
            constants, rows = constants[1:], rows[1:]
        self.constants, self.rows = constants, rows

    def _sparse(self, constant: int, row: np.ndarray) -> tuple[int, np.ndarray, np.ndarray]:
        """(constant, indices, values) of the form plus the parameters every step holds."""
        row = row + self.base[1]
        used = np.flatnonzero(row)
        return int(constant) + self.base[0], used, row[used]

    def forms(self) -> tuple[tuple[int, np.ndarray, np.ndarray], ...]:
        return tuple(self.settled + [self._sparse(c, r) for c, r in zip(self.constants, self.rows)])
