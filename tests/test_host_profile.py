"""A calibrated machine's profile (issue #37): the fixed cost of a kernel, its passes over its
bytes per op type, ranks sharing a server's cores; the file fields and their errors; a run's step
time (the median after a warm-up); and the calibration's fit recovering known speeds."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from autostrat.cost import Hardware, OpCost
from autostrat.errors import ConfigError
from autostrat.frontend.hardware_file import read_hardware_file
from autostrat.models import tutorial_plan
from autostrat.runtime.job import step_seconds
from autostrat.search.prediction import predict

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
from calibration import ADD_ELEMENTS, MATMUL_SIZE, MESSAGE_SIZES, fit_profile  # noqa: E402

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
])
def test_a_bad_host_field_is_refused_with_the_file_named(tmp_path, extra, message):
    path = _written(tmp_path, SPEEDS + extra)
    with pytest.raises(ConfigError, match=re.escape(f"{path}: {message}")):
        read_hardware_file(path)


def test_a_step_time_is_the_median_after_the_warm_up():
    assert step_seconds([5.0, 1.0, 2.0, 30.0]) == 2.0  # the first (5.0) left out, an outlier (30) does not move it
    assert step_seconds([5.0]) == 5.0 and step_seconds([]) == 0.0


def test_the_calibration_fit_recovers_the_speeds_it_was_given():
    alpha, beta, latency, memory, flops = 5e-6, 2e10, 8e-6, 4e10, 1e11  # flops: the float32 rate
    measured = {f"ring_{size}": alpha + (size - 4 * (size == 4)) / beta for size in MESSAGE_SIZES}
    measured["ring_4"] = alpha
    measured["kernel_tiny"] = latency
    measured["kernel_add"] = latency + 12 * ADD_ELEMENTS / memory
    n = MATMUL_SIZE
    measured["kernel_matmul"] = latency + 12 * n * n / memory + 2 * n**3 / flops
    fields = fit_profile(measured)
    assert fields["intra_server_latency"] == alpha and fields["kernel_latency"] == latency
    assert fields["intra_server_bandwidth"] == pytest.approx(beta, rel=1e-9)
    assert fields["device_memory_bandwidth"] == pytest.approx(memory, rel=1e-9)
    assert fields["device_flops"] == pytest.approx(2 * flops, rel=1e-9)  # the model runs float32 at half of it


def test_a_shared_profile_is_not_shared_again():
    once = Hardware(cores_per_server=2).shared(8)
    assert once.cores_per_server == 0 and once.shared(8) == once
