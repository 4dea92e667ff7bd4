"""Shared redistributions: readers of one tensor that want it in one layout pay for it once.

A plan redistributes a tensor once per layout its readers want (`plan.EdgeRedistribution.shares`),
so the cost of a tensor read by several ops is not a sum over its edges: it is, for the layout
the tensor is held in, the sum over the distinct layouts its readers want. A `Fanout` is one
such tensor: its producer (or, for a parameter or graph input, its first reader) and the edges
of its other readers, each reader candidate labelled with the layout it wants. The CP-SAT model
(`cpsat.SolverModel`) prices it exactly: one boolean per wanted layout ("some reader wants it")
and one per held layout and wanted layout ("this redistribution is paid").

Cases the plan keeps apart: gradient-synchronisation and writeback edges never share (they are
not reads of the tensor in the data flow), and a parameter kept sharded at rest (ZeRO-3,
`Strategy.at_rest`) is gathered for each reader, so those producer candidates pay per edge.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from autostrat.search.problem import SearchProblem
from autostrat.search.problem_edges import SearchEdge


@dataclass(frozen=True)
class Fanout:
    """Readers of `tensor` held where `producer`'s candidate puts it.

    `wants[e][j]`: the index (into the layouts they want, in order of first appearance) of the
    layout edge `edges[e]`'s consumer candidate j wants; `resting[i]`: producer candidate i
    keeps the tensor sharded at rest, so every reader pays its own gather.
    """

    tensor: str
    producer: str
    edges: tuple[SearchEdge, ...]
    wants: tuple[np.ndarray, ...]
    resting: np.ndarray

    @property
    def targets(self) -> int:
        """How many distinct layouts the readers' candidates want."""
        return 1 + max(int(w.max()) for w in self.wants)

    def costs(self) -> np.ndarray:
        """``[producer candidate, wanted layout]``: the one redistribution's cost."""
        result = np.full((len(self.resting), self.targets), np.inf)
        for edge, wants in zip(self.edges, self.wants):
            table = edge.table.full()
            for j, target in enumerate(wants):
                result[:, target] = table[:, j]
        return result


def fanouts(problem: SearchProblem) -> tuple[Fanout, ...]:
    """Every tensor read over two or more sharing edges (see the module docstring), in the
    order of their first edge.

    Example (the tutorial FFN's training step: the backward ops read the ReLU's output again):
        >>> from autostrat.autodiff import SGD
        >>> from autostrat.models import tutorial_plan
        >>> from autostrat.search.problem import build_problem
        >>> problem = build_problem(tutorial_plan(optimizer=SGD()).graph, 8)
        >>> [(fanout.tensor, len(fanout.edges)) for fanout in fanouts(problem)][0]
        ('relu:0', 3)
    """
    groups: dict[tuple, list[SearchEdge]] = {}
    for edge in problem.edges:
        if not edge.sync:
            groups.setdefault(problem.share_group(edge), []).append(edge)
    return tuple(_fanout(problem, tensor, producer, edges)
                 for (tensor, producer, _), edges in groups.items() if len(edges) > 1)


def _fanout(problem: SearchProblem, tensor: str, producer: str, edges: list[SearchEdge]) -> Fanout:
    index: dict = {}
    wants = []
    for edge in edges:
        layouts = [s.input_layouts[edge.input_index].normalized() for s in problem.candidates[edge.consumer]]
        wants.append(np.array([index.setdefault(layout, len(index)) for layout in layouts], dtype=int))
    first = edges[0]
    resting = np.array([first.from_input and first.output_index in s.at_rest for s in problem.candidates[producer]])
    return Fanout(tensor, producer, tuple(edges), tuple(wants), resting)


@dataclass(frozen=True)
class CoarseFanout:
    """A `Fanout` in the coarse model's terms: variable owners and their kept candidates.

    `costs[i, t]`: the redistribution from the producer owner's kept candidate i to wanted
    layout t; `readers`: per edge, its consumer's owner, the wanted layout of each of its kept
    candidates, and the edge's table restricted to the kept candidates (for resting rows and
    unreachable pairs); `resting[i]`: every reader pays its own.
    """

    producer: str
    costs: np.ndarray
    readers: tuple[tuple[str, np.ndarray, np.ndarray], ...]
    resting: np.ndarray


def coarse_fanout(fanout: Fanout, kept: dict[str, tuple[int, ...]], owner: dict[str, str]) -> CoarseFanout:
    """`fanout` restricted to the `kept` candidates, its ops named by their `owner`."""
    rows = list(kept[fanout.producer])
    readers = tuple(
        (owner[edge.consumer], wants[list(kept[edge.consumer])], edge.table.full()[np.ix_(rows, kept[edge.consumer])])
        for edge, wants in zip(fanout.edges, fanout.wants))
    return CoarseFanout(owner[fanout.producer], fanout.costs()[rows], readers, fanout.resting[rows])


def merged_fanouts(fanouts: tuple[CoarseFanout, ...]) -> tuple[CoarseFanout, ...]:
    """`fanouts` with those of one structure made one, their costs summed: the same producer
    owner, resting rows and readers (owner and wanted layouts, in order), and the same
    unreachable entries. Their booleans would be equal ("some reader wants t", "held i and t
    paid"), so one set priced at the sum is the same model, smaller: with repeated layers
    sharing variables, each layer's fanouts otherwise repeat one another's booleans (the 7B
    step at 64 devices: 679 fanouts, 42 981 derived booleans in 32 copies, which CP-SAT found as
    orbits of 32 and could not remove). The first of each structure keeps its place.

    Example (two layers' fanouts over the same owners become one, at twice the cost):
        >>> import numpy as np
        >>> one = CoarseFanout("ln", np.array([[0.0, 4.0]]), (("mm", np.array([0, 1]), np.array([[0.0, 4.0]])),), np.array([False]))
        >>> [fanout.costs.tolist() for fanout in merged_fanouts((one, one))]
        [[[0.0, 8.0]]]
    """
    merged: dict[tuple, CoarseFanout] = {}
    for fanout in fanouts:
        key = _structure(fanout)
        if key not in merged:
            merged[key] = fanout
            continue
        first = merged[key]
        readers = tuple((owner, wants, table + other[2]) for (owner, wants, table), other in zip(first.readers, fanout.readers))
        merged[key] = CoarseFanout(first.producer, first.costs + fanout.costs, readers, first.resting)
    return tuple(merged.values())


def _structure(fanout: CoarseFanout) -> tuple:
    """What must agree for two fanouts' booleans to be the same (`merged_fanouts`)."""
    readers = tuple((owner, wants.tobytes(), table.shape, np.isfinite(table).tobytes()) for owner, wants, table in fanout.readers)
    return (fanout.producer, fanout.resting.tobytes(), fanout.costs.shape, np.isfinite(fanout.costs).tobytes(), readers)


def reader_columns(fanouts: tuple[Fanout, ...], op: str) -> list[np.ndarray]:
    """Columns that keep coarsening's dominance exact under sharing: a reader candidate may only
    stand for one wanting the same layout (its target, in both signs, so that "no worse" means
    "equal"), and a producer candidate that gathers per reader (at rest) for no shared one."""
    columns = []
    for fanout in fanouts:
        for edge, wants in zip(fanout.edges, fanout.wants):
            if edge.consumer == op:
                columns += [wants[:, None].astype(float), -wants[:, None].astype(float)]
        if fanout.producer == op:
            columns.append(fanout.resting[:, None].astype(float))
    return columns
