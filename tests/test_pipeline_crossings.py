"""A partial tensor crossing pipeline stages is reduced on the sender (`search.crossings`,
`runtime.stage_crossings`): a split-k matmul ends stage 0 and its partial sum goes to stage 1.
On 8 local ranks (2 stages of 4): the sender's collective and its smaller send, bytes counted
where they are sent = predicted, peaks measured = predicted, training equal to one device."""

from __future__ import annotations

import math
from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pytest

from autostrat import nn, ops, reset_auto_parallel_context, set_auto_parallel_context
from autostrat.cost import Hardware
from autostrat.frontend.train import relative_error, train_single_device, training_plan
from autostrat.layout import DeviceMatrix, Layout, TensorMap
from autostrat.redistribution.algorithms import plan_with_algorithms
from autostrat.runtime.instructions import Communicate
from autostrat.runtime.stage_program import Recv, Send, lower_stage_programs
from autostrat.runtime.training import reference_graph, train_locally
from autostrat.search.cell_stages import marked_units
from autostrat.search.crossings import resolved_readers
from autostrat.search.plan import EdgeRedistribution
from autostrat.search.precision import TensorSizes
from autostrat.search.stages import unit_costs

PARTIAL = "first.matmul:0"  # the split-k matmul's output, partial over stage 0's 4 devices


class _Part(nn.Cell):
    def __init__(self, seed: int, strategy, relu_strategy=None):
        super().__init__()
        values = np.random.default_rng(seed).standard_normal((32, 32)).astype(np.float32) * 0.2
        self.weight = nn.Parameter(nn.Tensor(values), name=f"part{seed}.weight")
        self.matmul, self.relu = ops.MatMul().shard(strategy), ops.ReLU()
        if relu_strategy is not None:
            self.relu.shard(relu_strategy)


class _SplitK(nn.Cell):
    """Stage 0: ``x @ w1`` split along k (partial); stage 1: ``relu(h @ w2)`` and the loss,
    its matmul taking ``h`` by rows (the sender ReduceScatters) or whole (it AllReduces)."""

    def __init__(self, rows: bool):
        super().__init__()
        self.first = _Part(1, ((1, 4), (4, 1)))
        self.second = _Part(2, ((4, 1), (1, 1)) if rows else ((1, 1), (1, 4)), ((4, 1),) if rows else None)
        self.loss = nn.MSELoss()
        self.first.pipeline_stage, self.second.pipeline_stage = 0, 1

    def construct(self, x, y):
        h = self.first.matmul(x, self.first.weight)
        return self.loss(self.second.relu(self.second.matmul(h, self.second.weight)), y)


@pytest.fixture(autouse=True)
def _clean_context():
    reset_auto_parallel_context()
    yield
    reset_auto_parallel_context()


def _plan(rows: bool):
    set_auto_parallel_context(parallel_mode="auto_parallel", device_num=8, pipeline_stages=2)
    net = _SplitK(rows)
    cell = nn.TrainOneStepCell(nn.PipelineCell(net, micro_size=2), nn.SGD(net.trainable_params(), 0.1))
    return training_plan(cell, None, (nn.Tensor(shape=(16, 32)), nn.Tensor(shape=(16, 32))), steps=2)


def _pipeline_traffic(program) -> list[tuple[str, str, int]]:
    """(slot, kind, bytes) of every send and collective of a rank's micro-batch slots, in order."""
    return [(slot, i.kind, i.predicted) for chunk in program.chunks for slot in ("forward", "backward")
            for i in chunk.instructions(slot) if isinstance(i, (Send, Communicate)) and i.phase != "output"]


def _check_run(plan, values, batches):
    run, alone = train_locally(plan, values, batches), train_single_device(reference_graph(plan), values, batches)
    assert relative_error(run.losses, alone.losses) <= 1e-5 and relative_error(run.parameters, alone.parameters) <= 1e-5
    assert run.bytes_match  # every rank's bytes per phase, counted where sent, are its program's
    assert run.measured_peaks == run.predicted_peaks  # held arrays = `stage_buffers`' replay, crossings included
    return run


def test_a_partial_sum_a_later_stage_wants_by_rows_is_reduce_scattered_before_it_is_sent():
    plan, values, batches = _plan(rows=True)
    [crossing] = plan.pipeline.crossings
    assert (crossing.tensor, crossing.stage, [s.kind for s in crossing.reduce.steps]) == (PARTIAL, 1, ["ReduceScatter"])
    programs = lower_stage_programs(plan)
    whole = math.prod(plan.layouts[PARTIAL].slice_shape) * 4  # what stage 0 sent before: its partial piece
    sender, receiver = _pipeline_traffic(programs[0]), _pipeline_traffic(programs[4])
    assert sender[:2] == [("forward", "ReduceScatter", 3 * whole // 4), ("forward", "Send", whole // 4)]
    [received] = [i for c in programs[4].chunks for i in c.forward if isinstance(i, Recv)]
    assert received.key == crossing.key and math.prod(received.shape) * 4 == whole // 4
    # The stage's other reader, the weight gradient wanting h whole, gathers the rows on stage 1.
    assert ("backward", "AllGather", 3 * whole // 4) in receiver and not any(kind == "ReduceScatter" for _, kind, _ in receiver)
    # The search prices the send the same way: the split's send is the resolved piece.
    marks = {"first": 0, "second": 1}
    assert unit_costs(plan, plan.hardware, marked_units(plan.graph, marks, 2), stage_units=True).send_bytes == whole // 4
    run = _check_run(plan, values, batches)
    # Sent whole (the partial pieces, resolved on stage 1), stage 0 sends 4 times the bytes.
    unreduced = replace(plan, pipeline=replace(plan.pipeline, crossings=()))
    before = train_locally(unreduced, values, batches)
    assert [m["pipeline"] for m in before.measured[:4]] == [4 * m["pipeline"] for m in run.measured[:4]]


@pytest.mark.filterwarnings("ignore:seeds of first.matmul and second.matmul disagree")
def test_a_partial_sum_a_later_stage_wants_whole_is_all_reduced_and_its_partial_gradient_comes_back_reduced():
    """Stage 1 takes h whole: stage 0 AllReduces it; h's gradient there is partial (w2 split
    by columns) and stage 0 wants it split by columns: stage 1 ReduceScatters and AllReduces
    it (one step per device axis), then sends half of its piece."""
    plan, values, batches = _plan(rows=False)
    forward, backward = plan.pipeline.crossings
    assert (forward.tensor, forward.stage, [s.kind for s in forward.reduce.steps]) == (PARTIAL, 1, ["AllReduce"])
    assert (backward.tensor, backward.stage) == (f"grad/{PARTIAL}", 0)
    assert [s.kind for s in backward.reduce.steps] == ["ReduceScatter", "AllReduce"]
    whole = math.prod(plan.layouts[PARTIAL].slice_shape) * 4
    programs = lower_stage_programs(plan)
    assert ("forward", "Send", whole) in _pipeline_traffic(programs[0])
    assert ("backward", "Send", whole // 2) in _pipeline_traffic(programs[4])
    _check_run(plan, values, batches)


def test_a_reader_that_takes_the_tensor_partial_keeps_it_sent_whole():
    plan, _, _ = _plan(rows=True)
    assert resolved_readers(plan, PARTIAL, [("second.matmul", 0)]) is not None
    assert resolved_readers(plan, PARTIAL, [("second.matmul", 0), ("loss.sub", 0)]) is None  # no edge: it reads it as it is


def test_a_reader_resolved_from_another_readers_layout_gets_the_algorithms_its_own_edge_would():
    """A partial tensor over 16 devices (2 servers of 8) read by rows (a ReduceScatter) and
    whole (an AllReduce): the sender ReduceScatters, and the whole reader's rest, an AllGather
    across the servers, is hierarchical, as `build_plan` makes an edge's collectives."""
    hardware, matrix = Hardware(), DeviceMatrix((16,))
    partial = Layout(matrix, TensorMap((-1, -1)), (64, 64), partial=(0,))
    rows, whole = Layout(matrix, TensorMap((0, -1)), (64, 64)), Layout(matrix, TensorMap((-1, -1)), (64, 64))
    timing = hardware.alpha_beta(16)
    edges = [EdgeRedistribution("h", reader, 0, plan_with_algorithms(partial, wanted, "float32", None, timing, "bytes"))
             for reader, wanted in (("by_rows", rows), ("whole", whole))]
    sizes = TensorSizes({"h": "float32"}, {}, frozenset(), frozenset(), 4)
    plan = SimpleNamespace(redistributions=edges, layouts={"h": partial}, sizes=sizes, hardware=hardware, device_num=16,
                           cost_model="bytes")
    reduce, rests = resolved_readers(plan, "h", [("by_rows", 0), ("whole", 0)])
    assert [step.kind for step in reduce.steps] == ["ReduceScatter"]
    rest = dict(rests)[("whole", 0)]
    assert rest == plan_with_algorithms(rows, whole, "float32", None, timing, "bytes")
    assert [(step.kind, step.algorithm) for step in rest.steps] == [("AllGather", "hierarchical:8")]
