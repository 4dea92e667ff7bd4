"""A pipeline's partial tensors resolved on the sending stage (`search.crossings`), lowered.

A device's program (`program.lower_programs`) resolves a partial tensor in each reader's
input redistribution. For every `Crossing` of the plan, `cross_stages` moves the steps that
resolve it (`Crossing.reduce`) to right after the tensor's last write, as the producer's, into
the crossing's own key; each reader's redistribution then starts from that key with the rest
of its steps (`Crossing.rests`), and a reader left with none reads the key itself. The stage
cut (`stage_program`) then sends the key from the writing stage to the reading one as any key
a stage writes and another reads, and never the partial tensor, which no reader there reads.
"""

from __future__ import annotations

from dataclasses import replace

from autostrat.cost import dtype_size
from autostrat.runtime.program import lower_steps
from autostrat.runtime.instructions import Communicate, Compute, Program


def cross_stages(plan, programs: tuple[Program, ...], owners: list) -> tuple[tuple[Program, ...], list]:
    """`programs` (one per device of a stage, in device order) and the op owning each of their
    instructions (`owners`), rewritten for the crossings of ``plan.pipeline``.

    Example: see `stage_program.lower_stage_programs`, which calls it (tested in
    tests/test_pipeline_crossings.py).
    """
    if not plan.pipeline.crossings:
        return programs, owners
    places = _Places(plan, programs[0].instructions, owners)
    rewritten = [places.rewrite(program) for program in programs]
    return tuple(program for program, _ in rewritten), rewritten[0][1]


class _Places:
    """Where the instructions change, found once in the template's (every device's program has
    the same instructions in the same order)."""

    def __init__(self, plan, template, owners):
        self.plan, self.owners = plan, owners
        self.edges = {(edge.consumer, edge.input_index): edge for edge in plan.redistributions}
        last_write = {}
        for index, instruction in enumerate(template):
            for key in _written(instruction):
                last_write[key] = index
        self.written = {crossing: last_write[crossing.tensor] for crossing in plan.pipeline.crossings}
        self.steps: dict[tuple, list[int]] = {}  # (crossing, reader) -> the positions of the reader's steps
        self.renamed: dict[str, str] = {}  # a reader's input key with no steps left -> the crossing's key
        for crossing in plan.pipeline.crossings:
            for reader, rest in crossing.rests:
                key = _edge_key(crossing.tensor, reader)
                self.steps[(crossing, reader)] = [position for position, instruction in enumerate(template)
                                                  if isinstance(instruction, Communicate) and instruction.target == key
                                                  and owners[position] == reader[0]]
                if not rest.steps:
                    self.renamed[key] = crossing.key
        self.removed = {position for positions in self.steps.values() for position in positions}

    def rewrite(self, program: Program) -> tuple[Program, list]:
        """`program` rewritten (module docstring), and the owner of each of its instructions."""
        after, instead, rank = {}, {}, program.rank
        for crossing, written in self.written.items():
            itemsize = dtype_size(self.plan.graph.tensors[crossing.tensor].dtype)
            first, _ = crossing.rests[0]
            steps = self._lowered(crossing.reduce, rank, crossing.tensor, crossing.key, crossing.tensor, first, itemsize)
            after.setdefault(written, []).extend((step, self.owners[written]) for step in steps)
            for reader, rest in crossing.rests:
                steps = self._lowered(rest, rank, crossing.key, _edge_key(crossing.tensor, reader), crossing.tensor, reader, itemsize)
                instead[self.steps[(crossing, reader)][0]] = [(step, reader[0]) for step in steps]
        found, owners = [], []
        for index, (instruction, owner) in enumerate(zip(program.instructions, self.owners)):
            kept = [] if index in self.removed else [(self._renamed(instruction), owner)]
            for step, step_owner in instead.get(index, []) + kept + after.get(index, []):
                found.append(step)
                owners.append(step_owner)
        return replace(program, instructions=tuple(found)), owners

    def _lowered(self, redistribution, rank: int, source: str, target: str, tensor: str, reader, itemsize: int) -> list:
        """`redistribution`'s steps on `rank`, labelled and phased as `reader`'s input edge."""
        label = f"{tensor} -> {reader[0]}[{reader[1]}]"
        return lower_steps(redistribution, rank, source, target, label, self.plan.edge_phase(self.edges[reader]), itemsize)

    def _renamed(self, instruction):
        if not isinstance(instruction, Compute) or not any(key in self.renamed for key in instruction.inputs):
            return instruction
        return replace(instruction, inputs=tuple(self.renamed.get(key, key) for key in instruction.inputs))


def _edge_key(tensor: str, reader: tuple[str, int]) -> str:
    return f"{tensor}>{reader[0]}[{reader[1]}]"


def _written(instruction) -> tuple[str, ...]:
    if isinstance(instruction, Compute):
        return instruction.outputs
    return (instruction.target,) if isinstance(instruction, Communicate) else ()
