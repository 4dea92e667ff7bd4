"""A calibrated machine's profile (issue #37): the fixed cost of a kernel, its passes over its
bytes per op type, ranks sharing a server's cores; the file fields and their errors; a run's step
time (the median after a warm-up); the calibration's fit recovering known speeds, its crowded
rows, and what a collective step and a step's loads cost on the host."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import numpy as np
import pytest

from autostrat.cost import Hardware, OpCost
from autostrat.errors import ConfigError
from autostrat.frontend.hardware_file import read_hardware_file
from autostrat.models import tutorial_plan
from autostrat.runtime.job import step_seconds
from autostrat.search.prediction import predict

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
from calibration import ADD_ELEMENTS, COLLECTIVE_ELEMENTS, COLLECTIVES, MATMUL_SIZE, crowded_row, fit_profile  # noqa: E402

SPEEDS = "".join(f"{field}: {value}\n" for field, value in (
    ("device_flops", "2e11"), ("device_memory_bandwidth", "5e10"), ("intra_server_bandwidth", "1e10"),
    ("inter_server_bandwidth", "1e10"), ("intra_server_latency", "4e-6"), ("inter_server_latency", "4e-6"),
    ("devices_per_server", "8")))


def test_a_kernel_pays_its_latency_and_its_passes_over_its_bytes():
    cost = OpCost(flops_per_device=0, memory_bytes_per_device=1000)
    plain = Hardware(device_memory_bandwidth=1e9)  # 1000 bytes: 1 us
    tuned = Hardware(device_memory_bandwidth=1e9, kernel_latency=5e-6, kernel_passes={"GeLU": 30.0})
    assert plain.compute_nanoseconds(cost, ("float32",), "GeLU") == 1000
    assert tuned.compute_nanoseconds(cost, ("float32",), "GeLU") == 5000 + 30_000
    assert tuned.compute_nanoseconds(cost, ("float32",), "Add") == 5000 + 1000  # unlisted: one pass
    assert tuned.kernel_passes == (("GeLU", 30.0),)


def test_a_kernel_faster_than_the_rate_computes_at_its_own():
    cost = OpCost(flops_per_device=2_000_000, memory_bytes_per_device=0)
    plain, fast = Hardware(device_flops=2e12), Hardware(device_flops=2e12, kernel_rates={"Conv2D": 4.0})
    assert plain.compute_nanoseconds(cost, ("float16",), "Conv2D") == 1000
    assert fast.compute_nanoseconds(cost, ("float16",), "Conv2D") == 250  # four times the rate
    assert fast.compute_nanoseconds(cost, ("float16",), "MatMul") == 1000  # unlisted: the rate
    with pytest.raises(ConfigError, match="kernel_rates of Conv2D must be a finite number > 0, got 0.0"):
        Hardware(kernel_rates={"Conv2D": 0})


def test_the_plan_bound_stays_below_with_a_faster_kernel():
    from autostrat.cost import PROFILES
    from autostrat.report.estimate import GivenPlan
    from autostrat.report.plan_bound import ModelShape, step_time_bound

    shape = ModelShape(4, 64, 256, 1024, 12 * 256**2, True, 18 * 256, 4)
    given, profile = GivenPlan(2, 1, 1, "none", 0, 1, 1), PROFILES["a100-80gb"]
    from dataclasses import replace
    faster = replace(profile, kernel_rates={"MatMul": 2.0})
    assert 0 < step_time_bound(shape, given, faster, "bf16") < step_time_bound(shape, given, profile, "bf16")


def test_ranks_sharing_cores_take_the_share_of_each():
    profile = Hardware(cores_per_server=2, kernel_latency=1e-6)
    assert profile.shared(2) is profile and profile.shared(1) is profile
    four = profile.shared(8)  # 8 ranks on 2 cores: a quarter of a core each
    assert (four.device_flops, four.intra_server_bandwidth) == (profile.device_flops / 4, profile.intra_server_bandwidth / 4)
    assert (four.intra_server_latency, four.kernel_latency) == (4 * profile.intra_server_latency, 4e-6)
    assert Hardware(cores_per_server=2, devices_per_server=4).shared(16).device_flops == Hardware().device_flops / 2
    assert Hardware().shared(8) == Hardware()  # 0 cores: every device its own


def test_a_prediction_on_shared_cores_is_the_dedicated_one_scaled():
    plan = tutorial_plan()  # 8 devices
    alone = predict(plan, Hardware(kernel_latency=2e-6), ("forward",)).phases["forward"]
    shared = predict(plan, Hardware(kernel_latency=2e-6, cores_per_server=2), ("forward",)).phases["forward"]
    assert shared.bytes == alone.bytes
    assert abs(shared.compute_ns - 4 * alone.compute_ns) <= 8 * len(plan.ops)  # two roundings up per op
    assert abs(shared.communication_ns - 4 * alone.communication_ns) <= 8


def test_a_file_gives_the_host_fields(tmp_path):
    path = tmp_path / "machine.yaml"
    path.write_text(SPEEDS + "kernel_latency: 6e-6\ncores_per_server: 2\nkernel_passes:\n  GeLU: 310.5\n  Add: 1.2\n")
    profile = read_hardware_file(path)
    assert (profile.kernel_latency, profile.cores_per_server) == (6e-6, 2)
    assert profile.kernel_passes == (("Add", 1.2), ("GeLU", 310.5))
    assert read_hardware_file(_written(tmp_path, SPEEDS)).kernel_passes == ()  # each optional


def _written(folder: Path, text: str) -> Path:
    path = folder / "profile.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize("extra, message", [
    ("cores_per_server: -1\n", "cores_per_server must be a non-negative integer, got -1"),
    ("kernel_latency: -1e-6\n", "kernel_latency must be a finite number >= 0 (seconds), got -1e-06"),
    ("kernel_passes: 3\n", "kernel_passes must map op types to numbers of passes, got 3"),
    ("kernel_passes:\n  GeLU: fast\n", "kernel_passes must map op types to numbers of passes, got {'GeLU': 'fast'}"),
    ("kernel_passes:\n  GeLU: 0\n", "kernel_passes of GeLU must be a finite number > 0, got 0.0"),
    ("crowded:\n  2: [1e-5, 1e9, 2.0]\n", "crowded must map ranks per core to [message latency s, message bandwidth B/s, "
                                          "kernel slowdown, collective latency s, collective wait, its most s], got {2: ['1e-5', '1e9', 2.0]}"),
    ("crowded:\n  1: [1e-5, 1e9, 2.0, 0, 0, 0]\n", "crowded at 1 ranks per core needs a crowding > 1"),
    ("collective_wait: -0.5\n", "collective_wait must be a finite number >= 0 (a fraction of the compute before a collective)"),
    ("collective_latency: -1e-6\n", "collective_latency must be a finite number >= 0 (seconds), got -1e-06"),
])
def test_a_bad_host_field_is_refused_with_the_file_named(tmp_path, extra, message):
    path = _written(tmp_path, SPEEDS + extra)
    with pytest.raises(ConfigError, match=re.escape(f"{path}: {message}")):
        read_hardware_file(path)


def test_a_step_time_is_the_median_after_the_warm_up():
    assert step_seconds([5.0, 1.0, 2.0, 30.0]) == 2.0  # the first (5.0) left out, an outlier (30) does not move it
    assert step_seconds([5.0]) == 5.0 and step_seconds([]) == 0.0


class Gathered:
    """A rank 0 whose peers' gathered vectors are given: (host, starts..., ends...)."""

    def __init__(self, *peers):
        self.peers = peers

    def gather_report(self, values):
        return [values, *[np.array(peer, np.float64) for peer in self.peers]]


def test_the_job_step_runs_from_the_first_start_to_the_last_end_on_one_host_and_is_the_slowest_rank_across_hosts():
    import socket
    import zlib

    from autostrat.runtime.job import job_step_seconds

    here = zlib.crc32(socket.gethostname().encode())
    starts, ends = [0.0, 10.0, 20.0], [1.0, 11.0, 21.0]  # rank 0: 1 s steps
    turns = Gathered([here, 1.0, 11.0, 21.0, 2.0, 12.0, 22.0])  # a rank that starts as rank 0 ends (its turn)
    assert job_step_seconds(turns, starts, ends) == 2.0
    elsewhere = Gathered([here + 1, 5.0, 15.0, 25.0, 6.5, 16.5, 26.5])  # another host's clock: its own 1.5 s steps
    assert job_step_seconds(elsewhere, starts, ends) == 1.5

    class Peer:
        def gather_report(self, values):
            return None

    assert job_step_seconds(Peer(), starts, ends) == 1.0  # not rank 0: its own


def _calibration(alpha, beta, fixed, latency, memory, flops, ranks=2, wait=0.25) -> dict:
    """The means a calibration would measure on `ranks` ranks of a machine of these speeds
    (ring AllReduce: 2 (g - 1) messages sending 2 (g - 1) / g of the piece; AllToAll: g - 1
    messages of a g-th each; after a MatMul of 1 ms, an AllReduce waits `wait` of it)."""
    n, g = MATMUL_SIZE, ranks
    measured = {"kernel_tiny": latency, "kernel_add": latency + 12 * ADD_ELEMENTS / memory,
                "kernel_matmul": latency + 12 * n * n / memory + 2 * n**3 / flops,
                "instruction_overhead": 1.5 * latency, "kernel_call": 1e-6}
    for kind, share in zip(COLLECTIVES, (2, 1)):
        for elements in COLLECTIVE_ELEMENTS:
            messages, sent = share * (g - 1), share * (g - 1) * elements * 4
            measured |= {f"{kind}_{elements}": fixed + messages * alpha + sent / beta, f"{kind}_{elements} messages": messages,
                         f"{kind}_{elements} bytes": sent}
    measured["wait_kernel"], measured["long_wait_kernel"] = 1e-3, 8e-3
    measured["wait_pair"] = 1e-3 + measured["AllReduce_1"] + wait * 1e-3
    measured["long_wait_pair"] = 8e-3 + measured["AllReduce_1"] + 2e-3  # at most 2 ms
    return measured


def test_the_calibration_fit_recovers_the_speeds_it_was_given():
    alpha, beta, fixed, latency, memory, flops = 5e-6, 2e10, 3e-5, 8e-6, 4e10, 1e11  # flops: the float32 rate
    fields = fit_profile(_calibration(alpha, beta, fixed, latency, memory, flops))
    assert fields["kernel_latency"] == 1.5 * latency + 1e-6  # a training step's overhead per instruction, and a call
    assert fields["collective_wait"] == pytest.approx(0.25) and fields["collective_wait_most"] == pytest.approx(2e-3)
    assert fields["intra_server_latency"] == pytest.approx(alpha, rel=1e-3)  # the one-element pieces' bytes on it
    assert fields["collective_latency"] == pytest.approx(fixed, rel=1e-3)
    assert fields["intra_server_bandwidth"] == pytest.approx(beta, rel=1e-3)
    assert fields["device_memory_bandwidth"] == pytest.approx(memory, rel=1e-9)
    assert fields["device_flops"] == pytest.approx(2 * flops, rel=1e-9)  # the model runs float32 at half of it


def test_a_crowded_row_is_what_the_crowded_calibration_measured():
    alone = _calibration(5e-6, 2e10, 3e-5, 8e-6, 4e10, 1e11)
    crowded = _calibration(1e-4, 4e9, 2e-4, 8e-6 * 5, 4e10 / 5, 1e11 / 5, ranks=8, wait=0.75)
    crowding, alpha, beta, slowdown, fixed, wait, most = crowded_row(alone, crowded, 4)
    assert crowding == 4 and slowdown == pytest.approx(5) and (wait, most) == (pytest.approx(0.75), pytest.approx(2e-3))
    assert (alpha, beta, fixed) == (pytest.approx(1e-4, rel=1e-3), pytest.approx(4e9, rel=1e-3), pytest.approx(2e-4, rel=1e-3))
    crowded["kernel_add"] *= 1.5  # one chain's ratio off (a bandwidth measured high alone): the median keeps the others'
    assert crowded_row(alone, crowded, 4)[3] == pytest.approx(5)


def test_a_measured_crowding_replaces_the_share_of_the_cores():
    profile = Hardware(cores_per_server=2, kernel_latency=1e-6, collective_latency=2e-6, intra_server_latency=1e-6,
                       intra_server_bandwidth=1e9, crowded={4: [2e-5, 1e8, 5.0, 1e-5, 0.6, 1e-3]})
    four = profile.shared(8)  # measured: the row's own figures
    assert (four.intra_server_latency, four.intra_server_bandwidth) == (pytest.approx(2e-5), pytest.approx(1e8))
    assert (four.kernel_latency, four.collective_latency) == (pytest.approx(5e-6), pytest.approx(1e-5))
    assert four.device_flops == pytest.approx(profile.device_flops / 5) and four.collective_wait == pytest.approx(0.6)
    two = profile.shared(4)  # between 1 and the row, interpolated: a third of the way
    assert two.intra_server_latency == pytest.approx(1e-6 + (2e-5 - 1e-6) / 3) and two.collective_wait == pytest.approx(0.2)
    assert profile.shared(2) is profile


def test_a_collective_step_pays_the_collective_latency_and_a_step_its_loads():
    plan = tutorial_plan()  # one ReduceScatter of 3 messages; x, two weights and two biases loaded
    plain = predict(plan, Hardware(), ("forward",)).phases["forward"]
    host = predict(plan, Hardware(collective_latency=7e-6, kernel_latency=1e-6), ("forward",)).phases["forward"]
    assert host.communication_ns == plain.communication_ns + 7000
    assert host.compute_ns == plain.compute_ns + 1000 * len(plan.ops) + 1000 * 5


def test_a_crowded_collective_waits_its_share_of_the_compute_before_it():
    plan = tutorial_plan()  # 8 devices; the ReduceScatter reads dense1's product, after four ops
    profile = Hardware(cores_per_server=2, crowded={4: [8e-6, 450e9 / 4, 4.0, 0.0, 0.5, 1.0]})  # the share of the cores, and a wait
    shared, plain = profile.shared(8), predict(plan, Hardware(cores_per_server=2), ("forward",)).phases["forward"]
    from autostrat.search.prediction import compute_ns
    before, after = (sum(compute_ns(plan, name, shared) for name in names) for names in (list(plan.graph.ops)[:4], list(plan.graph.ops)[4:]))
    waited = predict(plan, profile, ("forward",)).phases["forward"]
    assert waited.compute_ns == plain.compute_ns and before > 0 and after > 0
    assert waited.communication_ns == plain.communication_ns + round(0.5 * before) + round(0.5 * after)  # and the step's end
    capped = Hardware(cores_per_server=2, crowded={4: [8e-6, 450e9 / 4, 4.0, 0.0, 0.5, 10e-9]})  # at most 10 ns a wait
    capped_waits = min(10, round(0.5 * before)) + min(10, round(0.5 * after))
    assert round(0.5 * before) > 10 and predict(plan, capped, ("forward",)).phases["forward"].communication_ns == plain.communication_ns + capped_waits


def test_a_shared_profile_is_not_shared_again():
    once = Hardware(cores_per_server=2).shared(8)
    assert once.cores_per_server == 0 and once.shared(8) == once
