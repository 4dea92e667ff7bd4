"""Inputs that once gave a traceback or were silently accepted (issue #29, items 10 and 11):
each is now refused with one typed `AutostratError` line (exit 2, no file left) or behaves
as a MindSpore user expects. One test per distinct message, matched."""

from __future__ import annotations

import json
import math
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from autostrat import nn, ops, reset_auto_parallel_context, set_auto_parallel_context
from autostrat.autodiff import SGD, Adam, Momentum
from autostrat.cli import main
from autostrat.errors import CheckpointError, ConfigError
from autostrat.frontend import trace
from autostrat.frontend.config import load_config
from autostrat.frontend.registry import model_names, register_model
from autostrat.frontend.run import RunOptions, check_run_options
from autostrat.reading import read_bytes, read_json
from autostrat.models import FFN
from autostrat.runtime.checkpoint import check_checkpoint, checkpoint_bytes, load_checkpoint
from autostrat.runtime.run_folder import make_run_folder
from autostrat.search.mindspore_checkpoint import encode, read_mindspore_plan
from autostrat.train import Model
from tests.child_signals import sigint_default

ROOT = Path(__file__).resolve().parent.parent
FFN_YAML = "device_num: 8\nparallel_mode: auto_parallel\nmodel: {name: FFN}\ninputs: [{shape: [64, 64]}]\n"


def write(folder: Path, text: str, name: str = "config.yaml") -> Path:
    path = folder / name
    path.write_text(text)
    return path


def fails(argv: list[str], capsys) -> str:
    """Run the command: exit code 2 and one error line on stderr, which is returned."""
    assert main(argv) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("autostrat: error: "), lines
    return lines[0]


# --- item 10: tracebacks --------------------------------------------------------------------


@pytest.mark.parametrize("data,message", [
    # a nested message in wire type 0 (was a TypeError inside the decoder)
    (bytes([0x10, 0x05]),
     r"ParallelStrategyMap.parallel_strategy_item is a message field, but comes in protobuf wire type 0"),
    # a string in wire type 0 (was an AttributeError)
    (bytes([0x12, 0x02, 0x08, 0x05]), r"Item.node_name is a string field, but comes in protobuf wire type 0"),
    # a single number packed (length-delimited)
    (bytes([0x0A, 0x01, 0x01]), r"ParallelStrategyMap.current_stage is a uint field, but comes in protobuf wire type 2"),
])
def test_a_malformed_protobuf_strategy_checkpoint_is_a_config_error(tmp_path, data, message):
    path = tmp_path / "strategy.ckpt"
    path.write_bytes(data)
    with pytest.raises(ConfigError, match=rf"{path}: not a MindSpore strategy checkpoint \({message}\)"):
        read_mindspore_plan(path)


def test_a_json_strategy_checkpoint_with_a_syntax_error_is_reported_as_json(tmp_path):
    path = tmp_path / "strategy.json"
    path.write_text('{"parallel_strategy_item": {\n  "MatMul_dense1.weight": [1,, 2]}}')
    with pytest.raises(ConfigError, match=rf"{path}: not valid JSON at line 2, column 30: Expecting value"):
        read_mindspore_plan(path)


@pytest.mark.parametrize("reader", [read_mindspore_plan, lambda path: read_json(path, "strategy checkpoint")])
def test_a_deeply_nested_json_strategy_checkpoint_is_a_config_error(tmp_path, reader):
    path = tmp_path / "strategy.json"
    path.write_text('{"parallel_strategy_item": ' + "[" * 100_000)
    with pytest.raises(ConfigError, match=rf"{path}: not a valid strategy checkpoint: values nested too deeply"):
        reader(path)


def test_a_deeply_nested_strategy_checkpoint_fails_a_search_in_one_line(tmp_path, capsys):
    checkpoint = tmp_path / "strategy.json"
    checkpoint.write_text("[" * 100_000)
    config = write(tmp_path, FFN_YAML + f"strategy_ckpt_load_file: {checkpoint}\n")
    assert fails(["search", str(config)], capsys).endswith("not a valid strategy checkpoint: values nested too deeply")


def test_a_model_that_is_not_a_cell_is_never_registered():
    with pytest.raises(ConfigError, match=r"register_model: expected a Cell subclass, got <built-in function len>"):
        register_model(len)  # a function
    with pytest.raises(ConfigError, match=r"register_model: expected a Cell subclass, got <class 'dict'>"):
        register_model(dict)  # a class not deriving from Cell
    assert "len" not in model_names() and "dict" not in model_names()


def test_an_integer_strategy_key_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match=r"strategies.5: expected an op name \(text\) as the key, got int 5"):
        load_config(write(tmp_path, FFN_YAML + "strategies: {5: [[2, 1], [1, 4]]}\n"))


def test_a_recompute_number_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match=r"recompute: expected a list of cell paths such as \[blocks.0, blocks.1\], or auto, got 5"):
        load_config(write(tmp_path, FFN_YAML + "recompute: 5\n"))


@pytest.mark.parametrize("special,kind", [("/dev/zero", "a character device"), ("/dev/null", "a character device"),
                                          ("FIFO", r"a FIFO \(named pipe\)"), ("FOLDER", "a folder")])
def test_a_special_file_as_a_config_is_refused_before_it_is_read(tmp_path, capsys, special, kind):
    if special == "FIFO":
        special = tmp_path / "fifo"
        os.mkfifo(special)  # no writer: opening it to read would block
    elif special == "FOLDER":
        special = tmp_path
    message = fails(["search", str(special)], capsys)
    assert message == f"autostrat: error: cannot read config {special}: {kind.replace(chr(92), '')}, not a regular file"


def test_an_input_larger_than_the_cap_is_refused(tmp_path):
    path = write(tmp_path, FFN_YAML)
    with pytest.raises(ConfigError, match=rf"cannot read config {path}: more than the 16 bytes such an input may have"):
        read_bytes(path, "config", limit=16)
    assert read_bytes(path, "config", limit=None) == FFN_YAML.encode()


def test_run_where_runs_cannot_be_made_says_so_and_suggests_run_dir(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").write_text("")  # a file where the folder would go
    with pytest.raises(ConfigError, match=rf"cannot make a run folder under {tmp_path / 'runs'}: File exists; give one with --run-dir"):
        make_run_folder()

    def read_only(*_, **__):
        raise PermissionError(13, "Permission denied")

    (tmp_path / "runs").unlink()
    monkeypatch.setattr(Path, "mkdir", read_only)  # root may write anywhere: a read-only folder as a user sees it
    message = fails(["run", str(ROOT / "configs" / "ffn.yaml"), "--steps", "1"], capsys)
    assert message.endswith("cannot make a run folder under " + str(tmp_path / "runs") + ": Permission denied; give one with --run-dir")
    assert list(tmp_path.iterdir()) == []


class Loop(nn.Cell):
    def __init__(self):
        super().__init__()
        self.relu = ops.ReLU()

    def construct(self, x):
        return self(self.relu(x))


def test_a_recursive_construct_is_a_config_error_naming_it():
    with pytest.raises(ConfigError, match=r"Loop.construct calls itself without end while Loop is traced \(recursion deeper "
                                          r"than Python allows\); a construct must end"):
        trace(Loop(), nn.Tensor(shape=(4, 4)))


def _imported(process: subprocess.Popen, module: str) -> None:
    """Wait until the command has imported `module` (``-X importtime`` reports each module as it
    is done): a moment inside its imports, found without timing."""
    for line in process.stderr:
        if line.split("|")[-1].strip() == module:
            return
    raise AssertionError(f"the command ended before importing {module}")


# Moments while the command's modules import, first to last: its first own module, numpy,
# the IR, the redistribution planner.
@pytest.mark.parametrize("module", ["autostrat.errors", "numpy", "autostrat.ir", "autostrat.redistribution"])
def test_ctrl_c_while_the_command_imports_exits_130_in_one_line(module):
    process = subprocess.Popen([sys.executable, "-X", "importtime", "-m", "autostrat", "search", "configs/ffn.yaml"],
                               cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env=dict(os.environ, PYTHONPATH=str(ROOT)), preexec_fn=sigint_default)
    _imported(process, module)
    process.send_signal(signal.SIGINT)
    out, err = process.communicate(timeout=60)
    errors = [line for line in err.splitlines() if not line.startswith("import time:")]
    assert "Traceback" not in err and out == ""
    assert process.returncode == 130 and errors == ["", "autostrat: interrupted, nothing written"], (process.returncode, err[-2000:])


# Ctrl-C while an import makes a dataclass: Python 3.11 raises it from the field's __set_name__
# wrapped in a RuntimeError (the test above failed so once, at the numpy moment, in a full suite run).
class _Interrupting:
    def __set_name__(self, owner, name):
        raise KeyboardInterrupt


_CLASS_MADE_DURING_CTRL_C = """
import autostrat.cli
from tests.test_input_errors import _Interrupting
autostrat.cli.main = lambda: type("Made", (), {"field": _Interrupting()})
from autostrat.entry import command
command()
"""


def test_ctrl_c_inside_a_class_being_made_exits_130_in_one_line():
    done = subprocess.run([sys.executable, "-c", _CLASS_MADE_DURING_CTRL_C], cwd=ROOT, capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)), timeout=60)
    assert (done.returncode, done.stdout, done.stderr) == (130, "", "\nautostrat: interrupted, nothing written\n")


def test_the_command_line_reports_ctrl_c_inside_a_class_being_made_as_ctrl_c(monkeypatch, capsys):
    monkeypatch.setattr("autostrat.cli._import_models", lambda args: type("Made", (), {"field": _Interrupting()}))
    assert main(["candidates", "--device-num", "2"]) == 130
    assert capsys.readouterr().err == "\nautostrat: interrupted, nothing written\n"


# --- item 11: silent acceptances ------------------------------------------------------------


@pytest.mark.parametrize("value", [".nan", ".inf", "-.inf"])
def test_a_nan_or_infinite_learning_rate_is_a_config_error(tmp_path, value):
    path = write(tmp_path, FFN_YAML + f"optimizer: {{name: sgd, learning_rate: {value}}}\n")
    with pytest.raises(ConfigError, match=r"optimizer: SGD: learning_rate must be a finite non-negative number, got (nan|inf|-inf)"):
        load_config(path)


@pytest.mark.parametrize("make", [lambda v: SGD(v), lambda v: Momentum(0.1, v), lambda v: Adam(0.1, eps=v)])
def test_optimisers_refuse_nan_and_infinite_settings(make):
    for value in (math.nan, math.inf):
        with pytest.raises(ConfigError, match=r"must be a finite non-negative number, got (nan|inf)"):
            make(value)


def _training_graph():
    from autostrat.autodiff import build_training

    return build_training(trace(FFN(), nn.Tensor(shape=(64, 64))), Momentum())


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_a_parameter_checkpoint_with_nan_or_inf_is_a_checkpoint_error(tmp_path, bad):
    graph = _training_graph()
    arrays = {name: np.zeros(tensor.shape, tensor.dtype) for name, tensor in graph.tensors.items()
              if name in dict(graph.updates)}
    arrays["dense2.bias"][3] = bad
    path = tmp_path / "params.npz"
    path.write_bytes(checkpoint_bytes(arrays))
    nan, inf = (1, 0) if np.isnan(bad) else (0, 1)
    with pytest.raises(CheckpointError, match=rf"{path}: dense2.bias holds {nan} NaN and {inf} infinite values \(of 64\); "
                                              r"a parameter must be finite"):
        load_checkpoint(path)
    with pytest.raises(CheckpointError, match=r"initial: dense2.bias holds"):
        check_checkpoint(graph, arrays, "initial")


def test_an_empty_npz_is_a_checkpoint_error(tmp_path):
    path = tmp_path / "params.npz"
    path.write_bytes(checkpoint_bytes({}))
    with pytest.raises(CheckpointError, match=rf"{path}: a parameter checkpoint with no arrays; expected the parameters"):
        load_checkpoint(path)


def test_a_special_file_as_a_parameter_checkpoint_is_a_checkpoint_error():
    with pytest.raises(CheckpointError, match=r"cannot read parameter checkpoint /dev/zero: a character device, not a regular file"):
        load_checkpoint("/dev/zero")


@pytest.fixture
def _context():
    set_auto_parallel_context(parallel_mode="auto_parallel", device_num=8)
    yield
    reset_auto_parallel_context()


@pytest.mark.usefixtures("_context")
@pytest.mark.parametrize("label", [64, -1])
def test_labels_outside_the_classes_are_refused_naming_the_input(label):
    net = FFN()
    loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    model = Model(net, loss, nn.Momentum(net.trainable_params(), 0.01, 0.9))
    labels = np.arange(64, dtype=np.int32) % 64
    labels[5] = label
    data = [(np.ones((64, 64), np.float32), labels)]
    with pytest.raises(ConfigError, match=rf"dataset element 0: input label holds {label}, but \S*one_hot \(OneHot\) "
                                          r"reads it as an index in \[0, 64\)"):
        model.train(1, data)


@pytest.mark.parametrize("dtype", ["int32", "float16"])
def test_inputs_of_another_dtype_than_the_weights_are_refused(tmp_path, dtype):
    path = write(tmp_path, FFN_YAML.replace("[{shape: [64, 64]}]", f"[{{shape: [64, 64], dtype: {dtype}}}]"))
    config = load_config(path)
    with pytest.raises(ConfigError, match=rf"dense1.matmul: MatMul takes inputs of one dtype, got x {dtype} and dense1.weight "
                                          r"float32; cast one with ops.Cast"):
        trace(config.net, *config.inputs)


def test_float_token_ids_are_refused_by_the_gather(tmp_path, capsys):
    text = (ROOT / "configs" / "gpt.yaml").read_text().replace("{shape: [8, 16], dtype: int32}", "{shape: [8, 16], dtype: float32}")
    message = fails(["search", str(write(tmp_path, text))], capsys)
    assert message.endswith("embedding.gather: Gather reads input 1 (ids) as indices, which must be integers, got float32")


def test_a_fault_beyond_the_program_is_refused_before_the_run(tmp_path, capsys):
    message = fails(["run", str(ROOT / "configs" / "ffn.yaml"), "--inject-fault", "3:kill:999999", "--run-dir", str(tmp_path / "run")], capsys)
    assert message.startswith("autostrat: error: a fault at instruction 999999 of rank 3 never fires: its program has ")
    assert message.endswith(" instructions (0 to 12)") and not (tmp_path / "run").exists()


@pytest.mark.parametrize("option,value", [("--run-dir", "RUN"), ("--rank-table", "TABLE"), ("--inject-fault", "1:kill")])
def test_local_backend_refuses_options_that_mean_nothing_for_threads(tmp_path, capsys, option, value):
    value = {"RUN": str(tmp_path / "run"), "TABLE": str(tmp_path / "table.json")}.get(value, value)
    message = fails(["run", str(ROOT / "configs" / "ffn.yaml"), "--backend", "local", option, value], capsys)
    assert message == (f"autostrat: error: run option {option} means nothing with --backend local (its ranks are threads of "
                       "this process: they write no run folder, start on no other host and are not made to fail); drop it, "
                       "or use --backend mpi")
    assert list(tmp_path.iterdir()) == []


def test_a_config_device_num_above_the_local_cap_is_refused_for_runs(tmp_path, capsys):
    path = write(tmp_path, FFN_YAML.replace("device_num: 8", "device_num: 300"))
    message = fails(["run", str(path), "--backend", "local"], capsys)
    assert message == ("autostrat: error: a run on this machine starts at most 256 ranks (threads or MPI processes), got "
                       "device_num 300; give a rank table to spread more over hosts, or plan them with autostrat search")
    assert main(["search", str(path)]) == 0  # a search may still plan for them
    check_run_options(RunOptions(device_num=8, backend="local"))


@pytest.fixture(scope="module")
def plan_json(tmp_path_factory) -> dict:
    path = tmp_path_factory.mktemp("plan") / "plan.json"
    assert main(["search", str(ROOT / "configs" / "ffn.yaml"), "--out", str(path)]) == 0
    return json.loads(path.read_text())


@pytest.mark.parametrize("key,value,message", [
    ("graph", [1], "graph: expected text"),
    ("device_num", "8", "device_num: expected an integer"),
    ("ops", [[1]], r"ops: expected a list of ops with a name and strategy tuples \(and, if any, out_strategy tuples, "
                   r"an in_layout list, an at_rest list and ring bytes\)"),
    ("redistributions", [{"consumer": [1], "bytes": 1}], "redistributions: expected a list of objects with a consumer and bytes"),
    ("writebacks", {"a": 1}, "writebacks: expected a list of objects with a parameter and bytes"),
    ("predicted", {"phases": {"forward": {"bytes": [1]}}}, "predicted.phases: expected phases of numbers"),
])
def test_diff_names_the_part_of_a_plan_that_is_not_a_plan(tmp_path, capsys, plan_json, key, value, message):
    good, bad = tmp_path / "good.json", tmp_path / "bad.json"
    good.write_text(json.dumps(plan_json))
    bad.write_text(json.dumps(plan_json | {key: value}))
    line = fails(["diff", str(good), str(bad)], capsys)
    assert re.fullmatch(rf"autostrat: error: plan B: {message}, as autostrat search --out writes it", line), line


def test_a_member_that_is_no_array_is_a_checkpoint_error(tmp_path):
    import io
    import zipfile

    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("dense1.weight.npy", b"")  # numpy would hand these bytes back as the "array"
    path = tmp_path / "params.npz"
    path.write_bytes(buffer.getvalue())
    with pytest.raises(CheckpointError, match=rf"{path}: member 'dense1.weight' is not a numpy array \(.npy\); a parameter "
                                              r"checkpoint holds only arrays"):
        load_checkpoint(path)
