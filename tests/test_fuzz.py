"""Fuzz the inputs a user hands autostrat: YAML configs, rank tables, strategy checkpoints,
parameter checkpoints and command lines. Whatever the input, autostrat either works or raises
an `AutostratError` (argparse: exit code 2) within a few seconds, and leaves no file or folder
behind in the folder it was pointed at.

The examples are derandomized (the same cases on every run); the number of cases run per target
is printed at the end of the module (``fuzz cases: ...``).
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import os
import signal
import tempfile
import zipfile
from collections import Counter
from pathlib import Path
from unittest import mock

import numpy as np
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autostrat.autodiff import Momentum, build_training
from autostrat.cli import main
from autostrat.errors import AutostratError
from autostrat.frontend import trace
from autostrat.frontend.config import apply_seeds, load_config
from autostrat.models import FFN
from autostrat.nn import Tensor
from autostrat.runtime.checkpoint import check_checkpoint, checkpoint_bytes, load_checkpoint
from autostrat.runtime.rank_table import load_rank_table
from autostrat.search import load_checkpoint_seeds

ROOT = Path(__file__).resolve().parent.parent
CONFIGS = {path.name: path.read_text() for path in sorted((ROOT / "configs").glob("*.yaml"))}
SECONDS = 20  # one case taking longer is a hang
# AUTOSTRAT_FUZZ_SCALE=10 runs ten times the cases (still derandomized): a deeper search by hand.
SCALE = float(os.environ.get("AUTOSTRAT_FUZZ_SCALE", "1"))
FUZZ = settings(derandomize=True, deadline=None, database=None, suppress_health_check=list(HealthCheck))


def fuzz(cases: int) -> settings:
    return settings(FUZZ, max_examples=max(1, int(cases * SCALE)))


CASES: Counter = Counter()  # calls per target, shrinking included


@pytest.fixture(scope="module", autouse=True)
def _report_cases(request):
    """Print how many cases each target ran, past pytest's output capture (also without -s)."""
    yield
    line = "fuzz cases: " + ", ".join(f"{target} {count}" for target, count in sorted(CASES.items()))
    capture = request.config.pluginmanager.getplugin("capturemanager")
    reporter = request.config.pluginmanager.getplugin("terminalreporter")
    with capture.global_and_fixture_disabled() if capture else contextlib.nullcontext():
        if reporter is not None:
            reporter.write_line("\n" + line)
        else:
            print(line)


@contextlib.contextmanager
def time_limit(seconds: int = SECONDS):
    """A TimeoutError (not an AutostratError, so the property fails) after `seconds`."""

    def expire(*_):
        raise TimeoutError(f"no answer within {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def listing(folder: Path) -> list[str]:
    return sorted(str(path.relative_to(folder)) for path in folder.rglob("*"))


def fails_cleanly(target: str, folder: Path, call) -> None:
    """Run `call`: it may succeed or raise an AutostratError; either way within SECONDS, and a
    failure leaves `folder` as it was."""
    CASES[target] += 1
    before = listing(folder)
    try:
        with time_limit():
            call()
    except AutostratError:
        assert listing(folder) == before, "a failure left files behind"


# --- values: odd scalars, nesting, huge and negative numbers -------------------------------

SCALARS = (
    st.none() | st.booleans() | st.integers(-10, 100) | st.integers() | st.floats()
    | st.sampled_from([0, -1, -8, 2**31, 2**63, 10**30, 0.5, 8.0, 1e308, "8", "", "float32", "int32", "floaty",
                       "FFN", "GPT", "Nope", "os:system", "16GB", "-1KB", "auto_parallel", "relu", "[8, 1]"])
    | st.text(max_size=12)
)
VALUES = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
                      max_leaves=8)


def deeply_nested(depth: int):
    value = 1
    for _ in range(depth):
        value = [value]
    return value


def _places(value, path=()):
    """Every (path) inside a YAML value: dict keys and list indexes."""
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, child in items:
        yield path + (key,)
        yield from _places(child, path + (key,))


def _mutate(data, draw):
    """One structural change at a random place: drop, retype, nest deeply, add an unknown key."""
    places = list(_places(data))
    path = draw(st.sampled_from(places))
    parent = data
    for key in path[:-1]:
        parent = parent[key]
    kind = draw(st.sampled_from(["drop", "retype", "retype", "nest", "unknown"]))
    if kind == "drop":
        del parent[path[-1]]
    elif kind == "retype":
        parent[path[-1]] = draw(VALUES)
    elif kind == "nest":
        parent[path[-1]] = deeply_nested(draw(st.sampled_from([3, 50, 150])))
    elif isinstance(parent, dict):
        parent[draw(st.text(min_size=1, max_size=8))] = draw(VALUES)
    else:
        parent.append(draw(VALUES))


def _bound_depth(data) -> None:
    """Keep layer counts small: a model of 2**31 layers is a long trace, not a hang to find."""
    params = data.get("model", {}).get("params") if isinstance(data.get("model"), dict) else None
    for key in ("layers", "blocks"):
        if isinstance(params, dict) and isinstance(params.get(key), int) and params[key] > 8:
            params[key] = 8


@st.composite
def configs(draw) -> bytes:
    """A shipped config, changed structurally, or its text garbled."""
    text = CONFIGS[draw(st.sampled_from(sorted(CONFIGS)))]
    kind = draw(st.sampled_from(["structure", "structure", "structure", "duplicate", "truncate", "bytes", "garbage", "nested"]))
    if kind == "structure":
        data = yaml.safe_load(text)
        for _ in range(draw(st.integers(1, 3))):
            if list(_places(data)):
                _mutate(data, draw)
        _bound_depth(data)
        return yaml.safe_dump(data, allow_unicode=draw(st.booleans())).encode()
    if kind == "nested":  # deeper than PyYAML's recursive composer goes
        key = draw(st.sampled_from(["model", "inputs", "strategies", "device_num"]))
        return f"{key}: {'[' * draw(st.integers(100, 1500))}\n".encode()  # PyYAML recurses too deep from ~1000
    if kind == "duplicate":
        lines = [line for line in text.splitlines() if line and line[0].isalpha()]
        return (text + draw(st.sampled_from(lines)) + "\n").encode()
    if kind == "truncate":
        return text.encode()[: draw(st.integers(0, len(text)))]
    if kind == "bytes":
        data = bytearray(text.encode())
        data[draw(st.integers(0, len(data) - 1))] = draw(st.integers(0, 255))
        return bytes(data)
    return draw(st.binary(max_size=64) | st.text(max_size=64).map(str.encode))


def _load_and_seed(path: Path) -> None:
    config = load_config(path)
    graph = trace(config.net, *config.inputs, device_num=config.context.device_num)
    apply_seeds(graph, config.strategies, config.context.device_num)


@fuzz(600)
@given(text=configs())
def test_fuzz_yaml_configs(text):
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "config.yaml"
        path.write_bytes(text)
        fails_cleanly("yaml config", Path(folder), lambda: _load_and_seed(path))


# --- rank tables ----------------------------------------------------------------------------


def rank_table(servers: int = 2, devices: int = 4) -> dict:
    return {
        "version": "1.0", "server_count": str(servers), "status": "completed",
        "server_list": [
            {"server_id": f"10.0.0.{s + 1}", "host_nic_ip": "reserve", "device": [
                {"device_id": str(d), "device_ip": f"192.1.{s}.{d}", "rank_id": str(devices * s + d)} for d in range(devices)]}
            for s in range(servers)
        ],
    }


@st.composite
def json_documents(draw, base: dict) -> bytes:
    """`base` changed structurally, or its JSON text garbled."""
    kind = draw(st.sampled_from(["structure", "structure", "structure", "truncate", "bytes", "garbage", "nested"]))
    if kind == "structure":
        data = copy.deepcopy(base)
        for _ in range(draw(st.integers(1, 3))):
            if list(_places(data)):
                _mutate(data, draw)
        return json.dumps(data).encode()
    text = json.dumps(base).encode()
    if kind == "truncate":
        return text[: draw(st.integers(0, len(text)))]
    if kind == "bytes":
        data = bytearray(text)
        data[draw(st.integers(0, len(data) - 1))] = draw(st.integers(0, 255))
        return bytes(data)
    if kind == "nested":
        return b"[" * draw(st.integers(1, 100_000))
    return draw(st.binary(max_size=64))


@fuzz(1000)
@given(text=json_documents(rank_table()), device_num=st.none() | st.integers(-2, 16))
def test_fuzz_rank_tables(text, device_num):
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "rank_table.json"
        path.write_bytes(text)
        fails_cleanly("rank table", Path(folder), lambda: load_rank_table(path, device_num))


# --- strategy checkpoints (strategy_ckpt_load_file) -----------------------------------------

FFN_GRAPH = trace(FFN(), Tensor(shape=(64, 64)), device_num=8)
STRATEGY_CHECKPOINT = {
    "device_num": 8,
    "parallel_strategy_item": [
        {"node_name": "dense1.matmul", "parallel_strategys": {"stage": 0, "parallel_strategy": [{"dim": [2, 1]}, {"dim": [1, 4]}]}},
        {"node_name": "relu", "parallel_strategys": {"stage": 0, "parallel_strategy": [{"dim": [2, 4]}],
                                                     "out_strategy": [{"dim": [2, 4]}]}},
    ],
    "parallel_layout_item": [],
}


def _seed_from_checkpoint(path: Path) -> None:
    apply_seeds(FFN_GRAPH, load_checkpoint_seeds(path), 8, where=str(path))


@fuzz(1000)
@given(text=json_documents(STRATEGY_CHECKPOINT))
def test_fuzz_strategy_checkpoints(text):
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "strategy.json"
        path.write_bytes(text)
        fails_cleanly("strategy checkpoint", Path(folder), lambda: _seed_from_checkpoint(path))


# --- parameter checkpoints (.npz) -----------------------------------------------------------

TRAINING_GRAPH = build_training(trace(FFN(), Tensor(shape=(64, 64))), Momentum())
NPZ_NAMES = ["dense1.weight", "moments.dense1.weight", "dense2.bias", "x", "", "a/b", "../up", "w.npy"]
ARRAYS = st.builds(
    lambda shape, dtype: np.zeros(shape, dtype),
    st.lists(st.integers(0, 65), max_size=3).map(tuple),
    st.sampled_from(["float32", "float64", "int32", "bool", "complex64", "<U3", "V4"]),
)


@st.composite
def npz_files(draw) -> bytes:
    """A valid .npz of odd arrays, or one whose bytes or members are garbled."""
    arrays = draw(st.dictionaries(st.sampled_from(NPZ_NAMES) | st.text(max_size=6), ARRAYS, max_size=4))
    data = checkpoint_bytes(arrays)
    kind = draw(st.sampled_from(["as is", "truncate", "bytes", "member", "garbage"]))
    if kind == "truncate":
        return data[: draw(st.integers(0, len(data)))]
    if kind == "bytes" and data:
        changed = bytearray(data)
        for _ in range(draw(st.integers(1, 8))):
            changed[draw(st.integers(0, len(changed) - 1))] = draw(st.integers(0, 255))
        return bytes(changed)
    if kind == "member":
        return _zip({draw(st.sampled_from(NPZ_NAMES)) + ".npy": draw(st.binary(max_size=200))})
    if kind == "garbage":
        return draw(st.binary(max_size=200))
    return data


def _zip(members: dict) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return buffer.getvalue()


def _load_parameters(path: Path) -> None:
    check_checkpoint(TRAINING_GRAPH, load_checkpoint(path), str(path))


@fuzz(800)
@given(data=npz_files())
def test_fuzz_parameter_checkpoints(data):
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "params.npz"
        path.write_bytes(data)
        fails_cleanly("parameter checkpoint", Path(folder), lambda: _load_parameters(path))


# --- command lines ----------------------------------------------------------------------------

NUMBERS = st.sampled_from(["0", "-1", "1", "3", "4", "8", "16", "1e3", "2.5", "x", "", "99999999999999999999", "nan", "inf"])
# Steps: few, so that a long run is no hang.
SMALL_NUMBERS = st.sampled_from(["-1", "0", "1", "2", "2.5", "x", "nan"])
OPTION_VALUES = {
    "search": {"--device-num": NUMBERS, "--refine": st.sampled_from(["cpsat", "x"]), "--time-limit": NUMBERS,
               "--max-device-memory": st.sampled_from(["16GB", "1KB", "-1", "x", "0"]), "--phase": st.sampled_from(["train", "x"]),
               "--coarsen": st.sampled_from(["none", "exact", "layers", "x"]), "--out": st.sampled_from(["OUT", "FOLDER", "FILE/plan.json"]),
               "--dump-ir": st.sampled_from(["IR", "FILE", "FILE/ir", "FOLDER"])},
    "run": {"--device-num": NUMBERS, "--backend": st.sampled_from(["local", "mpi", "x"]), "--steps": SMALL_NUMBERS,
            "--seed": st.sampled_from(["0", "7", "-1", "x", "2.5"]), "--timeout": NUMBERS, "--stall-timeout": NUMBERS, "--phase": st.sampled_from(["train", "x"]),
            "--rank-table": st.just("TABLE")},
    "candidates": {"--device-num": NUMBERS, "--repeated": st.just(None)},
}


@st.composite
def command_lines(draw) -> list[str]:
    """`autostrat search|run|candidates` with odd options; outputs point into the temp folder."""
    command = draw(st.sampled_from(sorted(OPTION_VALUES)))
    argv = [command]
    if command != "candidates" and draw(st.integers(0, 9)):
        argv.append(draw(st.sampled_from(["configs/ffn.yaml", "configs/mlp.yaml", "CONFIG", "missing.yaml"])))
    for option in draw(st.lists(st.sampled_from(sorted(OPTION_VALUES[command])), max_size=4)):
        value = draw(OPTION_VALUES[command][option])
        argv += [option] if value is None else [option, value]
    if draw(st.integers(0, 19)) == 0:
        argv.append(draw(st.sampled_from(["--bogus", "extra", "-h"])))
    return argv


def _run_main(argv: list[str], folder: Path) -> None:
    places = {"OUT": folder / "out" / "plan.json", "IR": folder / "ir", "TABLE": folder / "table.json",
              "CONFIG": folder / "config.yaml", "missing.yaml": folder / "missing.yaml", "FOLDER": folder / "folder",
              "FILE": folder / "file", "FILE/ir": folder / "file" / "ir", "FILE/plan.json": folder / "file" / "plan.json"}
    argv = [str(places.get(arg, arg)) if arg not in ("configs/ffn.yaml", "configs/mlp.yaml") else str(ROOT / arg) for arg in argv]
    if argv[0] == "run":  # never launch MPI from the fuzz: every --backend is local
        argv = [*argv, "--backend", "local"]
        argv = ["local" if i and argv[i - 1] == "--backend" and a == "mpi" else a for i, a in enumerate(argv)]
    with mock.patch("autostrat.frontend.run.launch", _no_launch):
        code = _main(argv)
    if code != 0:
        raise _Failed(code)


def _no_launch(*_, **__):
    raise AssertionError("the fuzz must not launch MPI")


class _Failed(AutostratError):
    """The command exited with a non-zero code (2: bad input, 4: the run's check failed)."""


def _main(argv: list[str]) -> int:
    try:
        return main(argv)
    except SystemExit as exit_:
        assert exit_.code in (0, 2), f"argparse exited with {exit_.code}"
        return exit_.code


@fuzz(400)
@given(argv=command_lines())
def test_fuzz_command_lines(argv, capsys):
    with tempfile.TemporaryDirectory() as folder:
        folder = Path(folder)
        (folder / "config.yaml").write_text(CONFIGS["ffn.yaml"])
        (folder / "folder").mkdir()
        (folder / "file").write_text("")
        (folder / "table.json").write_text(json.dumps(rank_table(1, 8)))
        fails_cleanly("command line", folder, lambda: _run_main(argv, folder))
        capsys.readouterr()
