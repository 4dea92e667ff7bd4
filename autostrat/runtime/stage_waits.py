"""Refuse a pipeline whose ranks would wait for one another forever, before its first step.

A rank of a pipeline runs its schedule's order (`StageProgram.order`): each F, B or W is a run
of one chunk's slot, then the update slot. Of what it runs, only a `Recv` waits: for the `Send`
of the same source, destination and tag (the k-th `Recv` of a tag takes the k-th `Send`, as both
backends deliver a tag's messages in order); a `Send` waits for nothing (MPI's ``Isend``, the
local backend's mailbox), and a group's collectives join ranks that run the same order. So the
step ends iff the relation "runs before" (each rank's order, each `Send` before its `Recv`) has
no cycle. A cycle is a dependency no schedule has, e.g. a stage's backward reading what the next
stage's backward writes (recomputed copies once did: tests/test_pipeline_recompute.py); it is
refused before the first step, naming each receive of the cycle (its key, the op writing it, the
stages, slots and micro-batches of both ends) instead of hanging at a rank's timeout. A receive
no rank sends, or a send no rank receives (an MPI rank may wait for it at the step's end), is
refused too. The ranks of a device group run alike (their sends go to the same device of another
group), so one rank per group stands for its group.
"""

from __future__ import annotations

from collections import deque
from typing import NamedTuple

from autostrat.errors import RuntimeBackendError
from autostrat.runtime.instructions import Recv, Send
from autostrat.search.stage_buffers import PARTS


class _Wait(NamedTuple):
    """One `Send` or `Recv` as a rank runs it: where (its model stage, slot, micro-batch)."""

    message: Send | Recv
    stage: int | None  # None: the update slot
    slot: str
    micro_batch: int | None


def refuse_waits_forever(plan, programs) -> None:
    """Raise `RuntimeBackendError` when the ranks of `programs` (one `StageProgram` per rank of
    the pipeline plan `plan`) would wait for one another forever (see the module docstring).

    Example (a 2-block stack on 2 stages: its programs run to the end):
        >>> from autostrat.autodiff import SGD, build_training
        >>> from autostrat.frontend import trace
        >>> from autostrat.models import TransformerStack
        >>> from autostrat.runtime.stage_program import lower_stage_programs
        >>> from autostrat.search import SearchOptions
        >>> from autostrat.search.pipeline import plan_pipeline
        >>> net = TransformerStack(layers=2, hidden=16, heads=2, seq=4, batch=4)
        >>> plan = plan_pipeline(build_training(trace(net, *net.example_inputs()), SGD()), 4, 2, 2, SearchOptions())
        >>> refuse_waits_forever(plan, lower_stage_programs(plan))  # lowering refuses it already when it would hang
    """
    group = plan.pipeline.group_size
    runs = {program.rank: _waits(program) for program in programs if program.rank % group == 0}
    places = [(rank, index) for rank, waits in runs.items() for index in range(len(waits))]
    node_of = {place: node for node, place in enumerate(places)}
    sends: dict[tuple[int, int, int], deque] = {}  # (source, destination, tag) -> its sends' nodes, in order
    for rank, index in places:
        if isinstance(message := runs[rank][index].message, Send):
            sends.setdefault((rank, message.dest, message.tag), deque()).append(node_of[(rank, index)])
    matched = {}  # a receive's node -> its send's
    for rank, index in places:
        if isinstance(message := runs[rank][index].message, Recv):
            queue = sends.get((message.source, rank, message.tag))
            if not queue:
                raise RuntimeBackendError(_never_sent(plan, runs[rank][index], rank))
            matched[node_of[(rank, index)]] = queue.popleft()
    for (rank, _, _), queue in sends.items():
        if queue:
            raise RuntimeBackendError(_never_received(plan, runs[rank][places[queue[0]][1]], rank))
    stuck = _stuck(places, matched)
    if stuck:
        raise RuntimeBackendError(_waits_forever(plan, runs, places, matched, stuck))


def _stuck(places: list[tuple[int, int]], matched: dict[int, int]) -> set[int]:
    """The nodes that never run: Kahn's order over each rank's order and each send before its receive."""
    after: list[list[int]] = [[] for _ in places]  # node -> the nodes that run only after it
    blocked = [0] * len(places)
    for node, (rank, index) in enumerate(places):
        if index:
            after[node - 1].append(node)
            blocked[node] += 1
    for receive, send in matched.items():
        after[send].append(receive)
        blocked[receive] += 1
    ready = deque(node for node, count in enumerate(blocked) if not count)
    while ready:
        for later in after[ready.popleft()]:
            blocked[later] -= 1
            if not blocked[later]:
                ready.append(later)
    return {node for node, count in enumerate(blocked) if count}


def _waits(program) -> list[_Wait]:
    """The sends and receives of `program`, in the order its rank runs them."""
    found = []
    for part in program.order():
        chunk = program.chunks[part.chunk]
        found += [_Wait(i, chunk.stage, PARTS[part.kind], part.micro_batch) for i in chunk.instructions(PARTS[part.kind])
                  if isinstance(i, (Send, Recv))]
    return found + [_Wait(i, None, "update", None) for i in program.update if isinstance(i, (Send, Recv))]


def _writer(plan, key: str) -> str:
    tensor = plan.graph.tensors.get(key.split(">")[0])
    return tensor.producer if tensor is not None and tensor.producer else "?"


def _where(wait: _Wait) -> str:
    if wait.stage is None:
        return "the update"
    return f"the {wait.slot} of stage {wait.stage} (micro-batch {wait.micro_batch})"


def _waits_forever(plan, runs: dict, places: list, matched: dict, stuck: set[int]) -> str:
    """The cycle of ranks each waiting for the next: from the lowest rank's first stuck node (a
    receive: a send waits for nothing), to the first stuck node of the rank its send is on."""
    first = {}  # rank -> its first stuck node
    for node in sorted(stuck):
        first.setdefault(places[node][0], node)
    node, cycle = min(first.values()), []
    while node not in cycle:
        cycle.append(node)
        node = first[places[matched[node]][0]]
    waits = []
    for node in cycle[cycle.index(node):]:
        (rank, index), (source, sent) = places[node], places[matched[node]]
        wait = runs[rank][index]
        waits.append(f"{_where(wait)} receives {wait.message.key} (written by op {_writer(plan, wait.message.key)}) "
                     f"sent in {_where(runs[source][sent])}")
    return (f"pipeline ({plan.pipeline.schedule}): the ranks would wait for one another forever: {'; '.join(waits)} (each "
            "send runs only after the receive named next on its rank, the last's after the first); expected the transfers "
            "a schedule orders (activations forward in F, their gradients back in B)")


def _never_received(plan, wait: _Wait, rank: int) -> str:
    return (f"pipeline ({plan.pipeline.schedule}): {_where(wait)} (rank {rank}) sends {wait.message.key} (written by op "
            f"{_writer(plan, wait.message.key)}) more often than rank {wait.message.dest} receives it; expected one receive per send")


def _never_sent(plan, wait: _Wait, rank: int) -> str:
    return (f"pipeline ({plan.pipeline.schedule}): {_where(wait)} (rank {rank}) receives {wait.message.key} (written by op "
            f"{_writer(plan, wait.message.key)}) more often than rank {wait.message.source} sends it; expected one send per receive")
