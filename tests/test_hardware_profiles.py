"""Hardware profiles (issue #33, item 3): the named profiles' cited numbers, the efficiency
factors where the model uses the rates, the ``hardware`` key from YAML, a file, the command line
and Python, and every error message."""

from __future__ import annotations

import json
import os
import re
from dataclasses import asdict, replace

import pytest

from autostrat.cli import main
from autostrat.cost import DEFAULT_PROFILE, PROFILES, Hardware, OpCost
from autostrat.errors import ConfigError
from autostrat.frontend.config import load_config
from autostrat.frontend.context import (ParallelContext, current_context, get_auto_parallel_context,
                                        reset_auto_parallel_context, set_auto_parallel_context)
from autostrat.frontend.run import plan_config
from autostrat.plan_source import source_config

A100, H100 = PROFILES["a100-80gb"], PROFILES["h100-sxm-80gb"]
SPEEDS = ("device_flops", "device_memory_bandwidth", "intra_server_bandwidth", "inter_server_bandwidth",
          "intra_server_latency", "inter_server_latency", "devices_per_server")
A100_FILE = "".join(f"{field}: {getattr(A100, field)!r}\n" for field in SPEEDS)


@pytest.fixture(autouse=True)
def _clean():
    yield
    reset_auto_parallel_context()


def test_each_profile_has_the_numbers_its_sources_give():
    # A100 SXM4 80GB datasheet: 312 TFLOP/s dense FP16/BF16, 2 039 GB/s HBM2e, NVLink 3 600 GB/s
    # both ways, 200 Gb/s HDR InfiniBand per GPU; H100 SXM5: 989.4, 3 350, 900 both ways, 400 Gb/s NDR.
    # Latencies: NCCL tuning.cc's ring LL128 step, 1.9 us over NVLink and 4.0 us over the network.
    expected = {"a100-80gb": (312e12, 2.039e12, 300e9, 25e9, 2e-6, 4e-6, 8),
                "h100-sxm-80gb": (989.4e12, 3.35e12, 450e9, 50e9, 2e-6, 4e-6, 8)}
    assert {name: tuple(getattr(profile, field) for field in SPEEDS) for name, profile in PROFILES.items()} == expected
    # Efficiencies: a100-80gb's matmul factor is benchmarks/published.py's fit (cost.hardware).
    efficiencies = {"a100-80gb": (0.7977, 1.0, 1.0), "h100-sxm-80gb": (1.0, 1.0, 1.0)}
    for name, profile in PROFILES.items():
        assert profile.name == name
        assert (profile.matmul_efficiency, profile.network_efficiency, profile.memory_efficiency) == efficiencies[name]
    # No attention rates shipped: A100 has none to cite; H100's published ones wait for a published
    # GEMM rate beside them (`cost.hardware`; test_attention_efficiency.py prices them from a file).
    for profile in (A100, H100):
        assert (profile.attention_efficiency, profile.attention_backward_efficiency) == (None, None)


@pytest.mark.parametrize("name, float32_ns", [("a100-80gb", 6_410_257), ("h100-sxm-80gb", 2_021_428)])
def test_float32_runs_at_each_profiles_dense_tf32_rate(name, float32_ns):
    # Both datasheets give dense TF32 as half the 16-bit rate (156 and 494.7 TFLOP/s), the rule
    # the model applies: 1 TFLOP of float32 work takes 1e9 / 156 = 6 410 256.4 ns on A100 and
    # 1e9 / 494.7 = 2 021 427.1 ns on H100, rounded up.
    cost, nominal = OpCost(flops_per_device=10**12, memory_bytes_per_device=0), replace(PROFILES[name], matmul_efficiency=1.0)
    assert nominal.compute_nanoseconds(cost, ("float32",)) == float32_ns
    assert nominal.compute_nanoseconds(cost, ("float16",)) == (float32_ns + 1) // 2


def test_the_default_profile_is_the_h100_server_of_before():
    assert DEFAULT_PROFILE == "h100-sxm-80gb" and replace(H100, name="") == Hardware()
    assert ParallelContext().hardware_profile() == H100


def _plan(path, device_num, **overrides):
    plan, _ = plan_config(load_config(path, cost_model="time", **overrides), device_num)
    return plan


# gpt_train searched for time on 8 devices (one server: 16 took 7 s a search, 55 s the test); the
# pipeline config's 16 devices cross servers, so the inter-server rate is scaled there.
@pytest.mark.parametrize("path, device_num", [("configs/gpt_train.yaml", 8), ("configs/gpt_pipeline.yaml", 16)])
def test_efficiency_factors_scale_the_rates_they_name(path, device_num):
    # A factor f on a rate is the rate times f, everywhere the model reads it (ops, collectives,
    # stage-to-stage sends); 1.0 is the nominal peak, so a plan predicted with every factor at
    # 1.0 is the plan of before, to the nanosecond.
    half = {"matmul_efficiency": {"device_flops": H100.device_flops / 2},
            "memory_efficiency": {"device_memory_bandwidth": H100.device_memory_bandwidth / 2},
            "network_efficiency": {"intra_server_bandwidth": H100.intra_server_bandwidth / 2,
                                   "inter_server_bandwidth": H100.inter_server_bandwidth / 2}}
    nominal = _plan(path, device_num).prediction.to_dict()
    assert _plan(path, device_num, hardware=replace(H100, matmul_efficiency=1.0, network_efficiency=1.0,
                                                    memory_efficiency=1.0)).prediction.to_dict() == nominal
    for factor, rates in half.items():
        scaled = _plan(path, device_num, hardware=replace(H100, **{factor: 0.5})).prediction
        assert scaled.to_dict() == _plan(path, device_num, hardware=replace(H100, **rates)).prediction.to_dict()
        assert scaled.step_time_ns > nominal["step_time_ns"], factor


def test_a_plan_is_slower_on_a100_than_on_h100():
    h100, a100 = _plan("configs/gpt_train.yaml", 8), _plan("configs/gpt_train.yaml", 8, hardware="a100-80gb")
    assert a100.prediction.step_time_ns > h100.prediction.step_time_ns
    assert a100.prediction.compute_ns > h100.prediction.compute_ns
    assert (a100.hardware.name, h100.hardware.name) == ("a100-80gb", "h100-sxm-80gb")
    assert a100.to_dict()["hardware"] == asdict(A100)


def _config(folder, extra: str = "", name: str = "cfg.yaml"):
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text("parallel_mode: auto_parallel\ndevice_num: 8\ncost_model: time\nmodel: {name: FFN}\n"
                    "inputs: [{shape: [64, 64]}]\nstrategies: {dense1.matmul: [[2, 1], [1, 4]]}\n" + extra)
    return path


def test_the_hardware_key_from_yaml_names_a_profile(tmp_path):
    assert load_config(_config(tmp_path, "hardware: a100-80gb\n")).context.hardware_profile() == A100
    assert load_config(_config(tmp_path)).context.hardware_profile() == H100


def test_the_hardware_key_reads_a_file_relative_to_the_config(tmp_path, monkeypatch):
    _config(tmp_path / "cfgs", "hardware: hw/a100.yaml\n")
    (tmp_path / "cfgs" / "hw").mkdir()
    (tmp_path / "cfgs" / "hw" / "a100.yaml").write_text(A100_FILE + "matmul_efficiency: 0.5\n")
    monkeypatch.chdir(tmp_path)
    profile = load_config("cfgs/cfg.yaml").context.hardware_profile()
    assert profile == replace(A100, matmul_efficiency=0.5, name="a100.yaml")


def test_numbers_in_a_profile_file_may_be_yaml_strings(tmp_path):
    # YAML reads 312e12 (no dot) and 2.039e12 (no exponent sign) as strings; both are numbers here.
    path = tmp_path / "hw.yaml"
    path.write_text(A100_FILE.replace("312000000000000.0", "312e12").replace("2039000000000.0", "2.039e12"))
    assert ParallelContext(hardware=str(path)).hardware_profile() == replace(A100, name="hw.yaml", matmul_efficiency=1.0)


def test_hardware_keys_beside_a_profile_override_its_fields(tmp_path):
    config = load_config(_config(tmp_path, "devices_per_server: 4\nhardware: a100-80gb\ninter_server_bandwidth: 1e10\n"))
    profile = config.context.hardware_profile()
    assert profile == replace(A100, devices_per_server=4, inter_server_bandwidth=1e10,
                              name="a100-80gb (inter_server_bandwidth, devices_per_server overridden)")
    plan, _ = plan_config(config)
    assert plan.to_dict()["hardware"]["name"] == profile.name


def test_the_hardware_key_from_python():
    set_auto_parallel_context(hardware="a100-80gb")
    assert current_context().search_options().hardware == A100
    assert get_auto_parallel_context("hardware") == A100 and get_auto_parallel_context("device_flops") == 312e12
    set_auto_parallel_context(device_flops=1e14)
    assert get_auto_parallel_context("device_flops") == 1e14
    assert current_context().search_options().hardware == replace(A100, device_flops=1e14,
                                                                   name="a100-80gb (device_flops overridden)")
    set_auto_parallel_context(hardware=replace(H100, network_efficiency=0.8))
    assert current_context().hardware_profile().network_efficiency == 0.8


def test_the_hardware_option_on_the_command_line(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = _config(tmp_path)
    assert main(["search", str(config), "--hardware", "a100-80gb", "--out", "plan.json"]) == 0
    assert "cost model: time; hardware: a100-80gb: 312 TFLOP/s (16-bit), memory 2039 GB/s" in capsys.readouterr().out
    assert json.loads((tmp_path / "plan.json").read_text())["hardware"]["name"] == "a100-80gb"


def test_a_plan_searched_with_a_profile_file_reports_without_it(tmp_path, capsys, monkeypatch):
    # The plan's JSON embeds a profile read from a file, as it embeds the config: `report`
    # plans again from the JSON alone, even once the file is gone.
    monkeypatch.chdir(tmp_path)
    config = _config(tmp_path)
    (tmp_path / "hw.yaml").write_text(A100_FILE + "network_efficiency: 0.7\n")
    assert main(["search", str(config), "--hardware", "hw.yaml", "--out", "plan.json"]) == 0
    out = capsys.readouterr().out
    assert "hardware: hw.yaml: 312 TFLOP/s" in out and "; network_efficiency 0.7" in out
    os.remove("hw.yaml")
    assert main(["report", "plan.json", "-o", "r.html"]) == 0
    assert (tmp_path / "r.html").exists()


def test_a_malformed_embedded_profile_is_refused(tmp_path):
    source = {"config": "x.yaml", "config_text": _config(tmp_path).read_text(), "options": {},
              "hardware": asdict(A100) | {"device_flops": -1.0}}
    with pytest.raises(ConfigError, match=re.escape("plan.json: source.hardware: device_flops must be a finite "
                                                    "number > 0 (FLOP/s), got -1.0")):
        source_config(source, "plan.json", tmp_path)
    source["hardware"] = {"device_flops": 1e12}
    with pytest.raises(ConfigError, match=re.escape("plan.json: source.hardware: expected a mapping of "
                                                    "device_flops, device_memory, device_memory_bandwidth")):
        source_config(source, "plan.json", tmp_path)


@pytest.mark.parametrize("text, message", [
    (A100_FILE + "tflops: 5\n", "unknown field 'tflops' = 5; a hardware profile has device_flops, "
                                "device_memory_bandwidth, intra_server_bandwidth"),
    (A100_FILE.replace("devices_per_server: 8\n", ""), "missing field 'devices_per_server'; a hardware profile gives "
                                                       "device_flops"),
    (A100_FILE + "name: big\n", "unknown field 'name' = 'big'"),
    (A100_FILE.replace("312000000000000.0", "fast"), "device_flops must be a number such as 9.894e+14, got 'fast'"),
    (A100_FILE.replace("devices_per_server: 8", "devices_per_server: [8]"),
     "devices_per_server must be a positive integer, got [8]"),
    (A100_FILE.replace("25000000000.0", "0"), "inter_server_bandwidth must be a finite number > 0 (bytes/s), got 0"),
    (A100_FILE.replace("2e-06", "-2e-06", 1), "intra_server_latency must be a finite number >= 0 (seconds), got -2e-06"),
    (A100_FILE + "memory_efficiency: 0\n", "memory_efficiency must be a number in (0, 1] (a fraction of the nominal "
                                           "peak), got 0"),
    (A100_FILE + "matmul_efficiency: 1.5\n", "matmul_efficiency must be a number in (0, 1]"),
    (A100_FILE + "network_efficiency: yes\n", "network_efficiency must be a number in (0, 1] (a fraction of the "
                                              "nominal peak), got True"),
    ("- 1\n", "expected a mapping of keys (device_flops, device_memory_bandwidth, intra_server_bandwidth, "
              "inter_server_bandwidth, intra_server_latency, inter_server_latency, devices_per_server), got list"),
])
def test_a_bad_profile_file_is_refused_naming_file_field_and_value(tmp_path, text, message):
    (tmp_path / "hw.yaml").write_text(text)
    config = _config(tmp_path, "hardware: hw.yaml\n")
    with pytest.raises(ConfigError, match=re.escape(f"{config}: {tmp_path / 'hw.yaml'}: {message}")):
        load_config(config)


@pytest.mark.parametrize("value, message", [
    ("b200", "hardware must be one of a100-80gb, h100-sxm-80gb or a .yaml file of a profile's fields, got 'b200'"),
    (3, "hardware must be one of a100-80gb, h100-sxm-80gb or a .yaml file of a profile's fields, got 3"),
    ("/nonexistent.invalid/hw.yaml", "cannot read hardware profile /nonexistent.invalid/hw.yaml: No such file or directory"),
])
def test_a_bad_hardware_value_is_refused(value, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        set_auto_parallel_context(hardware=value)


def test_a_profile_name_must_be_a_string():
    with pytest.raises(ConfigError, match=re.escape("a hardware profile's name must be a string, got 3")):
        Hardware(name=3)
