"""YAML configs: every shipped config loads and traces; every error names file and key path."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from autostrat.errors import ConfigError
from autostrat.frontend import trace
from autostrat.frontend.config import apply_seeds, load_config
from autostrat.frontend.yaml_text import MAX_FLOW_DEPTH, flow_depth, parse_config_text

CONFIGS = sorted((Path(__file__).resolve().parent.parent / "configs").glob("*.yaml"))


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_shipped_configs_load_trace_and_seed(path):
    config = load_config(path)
    graph = apply_seeds(trace(config.net, *config.inputs, device_num=config.context.device_num), config.strategies, config.context.device_num)
    assert sum(op.is_seeded for op in graph.ops.values()) == len(config.strategies) > 0


def test_every_built_in_model_has_a_config():
    from autostrat import models

    names = {load_config(path).net.__class__.__name__ for path in CONFIGS}
    assert set(models.MODELS) <= names


def test_overrides_replace_context_keys():
    assert load_config(CONFIGS[0], device_num=64).context.device_num == 64


def test_hardware_keys_may_be_written_as_yaml_reads_them(tmp_path):
    # YAML 1.1 reads 989.4e12 as a string (its floats need a sign in the exponent): both count.
    path = write(tmp_path, GOOD + "cost_model: time\ndevice_flops: 989.4e12\ndevice_memory_bandwidth: 2.0e+12\n")
    context = load_config(path).context
    assert (context.cost_model, context.device_flops, context.device_memory_bandwidth) == ("time", 989.4e12, 2e12)


def write(tmp_path, text: str) -> Path:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    return path


GOOD = "device_num: 8\nmodel: {name: FFN}\ninputs:\n  - {shape: [64, 64]}\n"
CASES = {
    "not yaml": ("model: [1, 2\n", r"bad.yaml: not valid YAML at line 2, column 1"),
    "not a mapping": ("- 1\n- 2\n", r"bad.yaml: expected a mapping of keys \(parallel_mode, model, inputs, ...\), got list"),
    "unknown key": (GOOD + "devices: 8\n", r"bad.yaml: unknown key 'devices'; valid keys: auto_recompute, backward_regathers, bucket_bytes, coarsen, cost_model, dataset_strategy, device_flops, device_memory_bandwidth, device_num"),
    "bad context value": (GOOD.replace("device_num: 8", "device_num: eight"), r"bad.yaml: device_num must be a positive integer, got 'eight'"),
    "missing model": ("inputs: [{shape: [2]}]\n", r"bad.yaml: missing key 'model'"),
    "model not a mapping": (GOOD.replace("{name: FFN}", "FFN"), r"bad.yaml: model: expected a mapping with one of 'name', 'hf_config' \(and optional 'params'\), got 'FFN'"),
    "unknown model": (GOOD.replace("FFN", "FFNN"), r"bad.yaml: model.name: unknown model 'FFNN'; registered models: FFN, GPT, LLaMA, MLP, ResNet"),
    "unknown model key": (GOOD.replace("{name: FFN}", "{name: FFN, size: 3}"), r"bad.yaml: model.size: unknown key; a model has 'name' and 'params'"),
    "an import": (GOOD.replace("FFN", "nowhere.module:Net"), r"bad.yaml: model.name: 'nowhere.module:Net' is not a "
                  r"registered model; a config names a model, it never imports code: register your Cell with autostrat "
                  r"--import MODULE \(command line\) or register_model \(Python\); registered: FFN, GPT"),
    "bad params": (GOOD.replace("{name: FFN}", "{name: FFN, params: {width: 3}}"), r"bad.yaml: model.params: FFN rejects these arguments: .*width"),
    "inputs not a list": (GOOD.replace("inputs:\n  - {shape: [64, 64]}", "inputs: 3"), r"bad.yaml: inputs: expected a list of inputs"),
    "input without shape": (GOOD.replace("{shape: [64, 64]}", "{dims: [64, 64]}"), r"bad.yaml: inputs\[0\]: expected \{shape: \[...\], dtype: ...\}"),
    "bad dtype": (GOOD.replace("{shape: [64, 64]}", "{shape: [64, 64], dtype: floaty}"), r"bad.yaml: inputs\[0\]: expected a numpy dtype or its name"),
    "strategies not a mapping": (GOOD + "strategies: [1]\n", r"bad.yaml: strategies: expected a mapping from op name to strategy"),
    "duplicate top-level key": (GOOD + "device_num: 4\n", r"bad.yaml: key 'device_num' appears twice in one mapping, at line 1, column 1 and at line 5, column 1; give each key once"),
    "duplicate nested key": (GOOD.replace("{shape: [64, 64]}", "{shape: [64, 64], shape: [8, 8]}"), r"bad.yaml: key 'shape' appears twice in one mapping, at line 4, column 6 and at line 4, column 23"),
    "too deeply nested": ("model: " + "[" * 5000 + "\n", r"bad.yaml: not a usable config: values nested too deeply \(5000 levels of \[ or \{ by line 1; at most 100\)"),
    "nested deeper than yaml's stack": ("- " * 2000 + "1\n", r"bad.yaml: not a usable config: values nested too deeply$"),
    "dtype not numeric": (GOOD.replace("{shape: [64, 64]}", "{shape: [64, 64], dtype: object}"), r"bad.yaml: inputs\[0\]: expected a numeric dtype \(bool, integer, float or complex\), got 'object' \(object\)"),
    "dtype a mapping": (GOOD.replace("{shape: [64, 64]}", "{shape: [64, 64], dtype: {a: {b: 1}}}"), r"bad.yaml: inputs\[0\]: expected a numpy dtype or its name such as 'float32', got \{'a': \{'b': 1\}\}"),
    "too few inputs": (GOOD.replace("{name: FFN}", "{name: GPT}"), r"bad.yaml: inputs: GPT takes 2 input\(s\) \(ids, labels\), got 1"),
    "model size not an integer": (GOOD.replace("{name: FFN}", "{name: GPT, params: {batch: null}}"), r"bad.yaml: model.params: GPT: batch must be a positive integer, got None"),
    "heads do not divide hidden": (GOOD.replace("{name: FFN}", "{name: GPT, params: {heads: 3}}"), r"bad.yaml: model.params: GPT: hidden must be a multiple of heads, got hidden 64 and heads 3"),
    "time limit NaN": (GOOD + "refine_time_limit: .nan\n", r"bad.yaml: refine_time_limit must be a positive number of seconds, got nan"),
    "bandwidth not a number": (GOOD + "intra_server_bandwidth: 450GB/s\n", r"bad.yaml: intra_server_bandwidth must be a number such as 4.5e\+11, got '450GB/s'"),
    "strategy mapping form": (GOOD + "strategies:\n  relu: {out: [[1, 1]]}\n", r"bad.yaml: strategies.relu: expected \{in: \[\[...\]\], out: \[\[...\]\]\}"),
}


@pytest.mark.parametrize("case", CASES)
def test_config_errors(tmp_path, case):
    text, message = CASES[case]
    with pytest.raises(ConfigError, match=message):
        load_config(write(tmp_path, text))


def test_a_duplicate_strategy_key_is_refused_too(tmp_path):
    text = GOOD + "strategies:\n  relu: [[8, 1]]\n  dense1.matmul: [[2, 1], [1, 4]]\n  relu: [[1, 8]]\n"
    with pytest.raises(ConfigError, match=r"key 'relu' appears twice in one mapping, at line 6, column 3 and at line 8, column 3"):
        load_config(write(tmp_path, text))


def test_merged_keys_may_still_be_overridden(tmp_path):
    text = "device_num: 8\nmodel: {name: MLP, params: &p {layers: 2}}\ninputs: [{<<: {shape: [1, 1]}, shape: [64, 64]}]\n"
    assert load_config(write(tmp_path, text)).inputs[0].shape == (64, 64)


def test_a_config_that_is_not_utf8_names_the_byte(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_bytes(GOOD.encode() + b"# caf\xe9\n")
    with pytest.raises(ConfigError, match=r"bad.yaml: a config must be UTF-8 text; line 5, column 6 is byte 0xe9"):
        load_config(path)


def test_missing_file():
    with pytest.raises(ConfigError, match=r"cannot read config /nonexistent.yaml: No such file or directory"):
        load_config("/nonexistent.yaml")


def test_seed_for_an_unknown_op_suggests_names(tmp_path):
    config = load_config(write(tmp_path, GOOD))
    graph = trace(config.net, *config.inputs, device_num=8)
    with pytest.raises(ConfigError, match=r"strategies.dense1.matmull: the graph has no op named 'dense1.matmull'; did you mean dense1.matmul"):
        apply_seeds(graph, {"dense1.matmull": (((2, 1), (1, 4)), None)}, 8)


def test_invalid_seed_names_the_key_path(tmp_path):
    config = load_config(write(tmp_path, GOOD))
    graph = trace(config.net, *config.inputs, device_num=8)
    with pytest.raises(ConfigError, match=r"strategies.relu: the strategy uses 16 devices but device_num is 8"):
        apply_seeds(graph, {"relu": (((4, 4),), None)}, 8)


def test_an_optimizer_section_makes_a_training_config():
    config = load_config(Path(__file__).resolve().parent.parent / "configs" / "gpt_train.yaml")
    assert config.context.phase == "train" and type(config.optimizer).__name__ == "Adam"
    assert config.optimizer.learning_rate == 0.001
    assert load_config(Path(__file__).resolve().parent.parent / "configs" / "ffn.yaml").optimizer is None  # no optimizer section


@pytest.mark.parametrize("section,message", [
    ("{name: lamb}", r"optimizer: expected \{name: adam \| momentum \| sgd, <its settings>\}, got \{'name': 'lamb'\}"),
    ("[adam]", r"optimizer: expected \{name: adam"),
    ("{name: [adam]}", r"optimizer: expected \{name: adam \| momentum \| sgd, <its settings>\}, got \{'name': \['adam'\]\}"),
    ("{name: adam, lr: 1}", "optimizer: adam accepts learning_rate, beta1, beta2, eps; got lr"),
    ("{name: momentum, momentum: -1}", "optimizer: Momentum: momentum must be a finite non-negative number, got -1"),
])
def test_a_bad_optimizer_section_names_what_it_expected(tmp_path, section, message):
    path = write(tmp_path, f"parallel_mode: auto_parallel\ndevice_num: 8\nmodel: {{name: FFN}}\ninputs: [{{shape: [64, 64]}}]\noptimizer: {section}\n")
    with pytest.raises(ConfigError, match=message):
        load_config(path)


def test_flow_nesting_is_counted_outside_quotes_and_comments():
    quoted = "name: '[[[[', other: \"{{\\\"[[\"  # [[[[[[\n"
    assert flow_depth(quoted) == (0, 1)
    assert flow_depth("plain: a[b\n") == (1, 1)  # a plain scalar's bracket counts: an overestimate, harmless
    assert flow_depth("a: 1\nb: " + "[" * 100 + "]" * 100 + "\nc: {d: [1]}\n") == (100, 2)


def test_a_config_nested_at_the_limit_is_parsed_and_one_deeper_refused_without_parsing(tmp_path):
    deep = GOOD + "extra: " + "[" * MAX_FLOW_DEPTH + "1" + "]" * MAX_FLOW_DEPTH + "\n"
    assert parse_config_text(deep, "deep.yaml")["extra"] == _nested(MAX_FLOW_DEPTH)
    deeper = deep.replace("extra: ", "extra: [").rstrip("\n") + "]\n"
    with pytest.raises(ConfigError, match=rf"deeper.yaml: not a usable config: values nested too deeply \({MAX_FLOW_DEPTH + 1} levels"):
        parse_config_text(deeper, "deeper.yaml")


def _nested(depth: int):
    value = 1
    for _ in range(depth):
        value = [value]
    return value


_TRICKY = """\
base: &base {device_num: 8, mesh: [2, 4]}
merged: {<<: *base, device_num: 4}
numbers: [1e3, 1.5e-3, 0x10, 0o17, -0, .inf, -.Inf, .nan, 1_000, +7]
words: [yes, No, on, OFF, ~, null, 'quoted: [x]', "tab\\tand \\u00e9"]
when: 2026-11-27
block: |
  two
  lines
folded: >
  one
  line
nested:
  - {a: [1, [2, [3]]]}
  - - x
    - y
"""


@pytest.mark.parametrize("path", [*CONFIGS, None], ids=lambda p: p.name if p else "tricky")
def test_the_fast_yaml_parser_reads_what_the_pure_python_one_reads(path):
    # parse_config_text parses with libyaml (PyYAML's C loader); PyYAML's own pure-Python safe
    # loader, written apart from it, must read every shipped config and a text of YAML's corner
    # cases (anchors and merges, YAML 1.1 numbers and booleans, dates, block scalars) the same.
    text = path.read_text() if path else _TRICKY
    expected = yaml.load(text, Loader=yaml.SafeLoader)
    found = parse_config_text(text, "a.yaml")
    assert repr(found) == repr(expected)  # nan != nan: compare the written values
