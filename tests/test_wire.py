"""Bytes on the wire: collectives moved as point-to-point messages, each counted at its send
call, by code that never reads the cost model (DESIGN section 5), on LocalBackend threads."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest

from autostrat.cost import collective_bytes
from autostrat.runtime.local import LocalCluster
from autostrat.runtime.wire import Message

ROOT = Path(__file__).resolve().parents[1]
# Where messages are sent and counted: none of these may import or name the cost model.
COUNTING_MODULES = ("autostrat/runtime/wire.py", "autostrat/runtime/backend.py", "autostrat/runtime/local.py",
                    "autostrat/runtime/mpi.py")


def _cost_references(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names if alias.name.startswith("autostrat.cost")]
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if module.startswith("autostrat.cost") or (module == "autostrat" and any(a.name == "cost" for a in node.names)):
                found.append(module)
        elif isinstance(node, ast.Name) and node.id in ("collective_bytes", "cost"):
            found.append(node.id)
        elif isinstance(node, ast.Attribute) and node.attr in ("collective_bytes", "cost"):
            found.append(node.attr)
    return found


@pytest.mark.parametrize("module", COUNTING_MODULES)
def test_the_counting_code_never_reads_the_cost_model(module):
    assert _cost_references(ROOT / module) == []


def test_the_ast_check_sees_a_cost_import(tmp_path):
    sneaky = tmp_path / "sneaky.py"
    sneaky.write_text("from autostrat.cost.collective import collective_bytes\nimport autostrat.cost\n")
    assert _cost_references(sneaky) == ["autostrat.cost.collective", "autostrat.cost"]


def _messages(device_num: int, call):
    """Every rank's result of ``call(backend)`` and the messages it sent."""
    return LocalCluster(device_num).run(lambda backend: (call(backend), list(backend.sent)))


@pytest.mark.parametrize("group", [(0, 1, 2), (2, 0, 1, 3)])
def test_ring_allgather_sends_every_other_piece_to_the_right_neighbour(group):
    runs = _messages(4, lambda b: b.allgather(np.full((2, 3), b.rank, np.float32), group) if b.rank in group else [])
    for rank in group:
        pieces, sent = runs[rank]
        assert [int(p[0, 0]) for p in pieces] == list(group)
        right = group[(group.index(rank) + 1) % len(group)]
        assert sent == [Message(right, 24)] * (len(group) - 1)


@pytest.mark.parametrize("g", [2, 3, 5])
def test_ring_reduce_scatter_sends_one_block_per_step(g):
    def call(backend):
        blocks = [np.arange(4, dtype=np.float64) + 10 * backend.rank + block for block in range(g)]
        return backend.reduce_scatter(blocks, tuple(range(g)), "sum")

    runs = _messages(g, call)
    for rank, (result, sent) in enumerate(runs):
        want = sum(np.arange(4) + 10 * member + rank for member in range(g))
        assert np.array_equal(result, want)
        assert sent == [Message((rank + 1) % g, 32)] * (g - 1)


@pytest.mark.parametrize("g,elements", [(8, 1), (3, 7), (4, 4), (5, 3), (2, 1)])
def test_allreduce_of_uneven_chunks_sends_what_the_model_says_per_member(g, elements):
    runs = _messages(g, lambda b: b.allreduce(np.arange(elements, dtype=np.float32) * (b.rank + 1), tuple(range(g)), "sum"))
    sents = []
    for rank, (result, sent) in enumerate(runs):
        assert np.array_equal(result, np.arange(elements, dtype=np.float32) * sum(range(1, g + 1)))
        assert {message.dest for message in sent} <= {(rank + 1) % g}
        sents.append(sum(message.bytes for message in sent))
        assert sents[-1] == collective_bytes("AllReduce", g, 4 * elements, 4, rank)
    assert max(sents) == collective_bytes("AllReduce", g, 4 * elements, 4)


def test_pairwise_alltoall_sends_each_block_to_its_member():
    group = (3, 1, 0, 2)

    def call(backend):
        return backend.alltoall([np.full(2, 10 * backend.rank + member, np.int32) for member in group], group)

    runs = _messages(4, call)
    for rank, (received, sent) in enumerate(runs):
        assert [int(block[0]) for block in received] == [10 * member + rank for member in group]
        assert sorted(sent, key=lambda m: m.dest) == [Message(member, 8) for member in sorted(group) if member != rank]


def test_a_permute_sends_one_message_and_none_to_itself():
    partner = {0: 0, 1: 2, 2: 1}  # ranks 1 and 2 swap pieces, rank 0 keeps its own
    runs = _messages(3, lambda b: b.sendrecv(np.full(5, b.rank, np.int64), partner[b.rank], partner[b.rank]))
    assert [int(received[0]) for received, _ in runs] == [0, 2, 1]
    assert [sent for _, sent in runs] == [[], [Message(2, 40)], [Message(1, 40)]]


@pytest.mark.parametrize("config", ["ffn", "gpt_train"])
def test_the_measured_device_traffic_is_the_predicted_one(config):
    from autostrat.frontend.run import RunOptions, _prepare
    from autostrat.report.data import device_traffic
    from autostrat.runtime.local import run_job_locally

    job, _, _, planned = _prepare(ROOT / f"configs/{config}.yaml", RunOptions(steps=2))
    check = run_job_locally(job)
    measured, predicted = np.array(check.measured["traffic"]), device_traffic(planned.plan)
    assert check.bytes_match and predicted.any()
    assert np.array_equal(measured, predicted)
