"""Fuzz the inputs a user hands autostrat: YAML configs (and a wrong node type at every key),
rank tables, strategy checkpoints (JSON and MindSpore's protobuf), parameter checkpoints,
plans, command lines, deep nesting in every JSON input, and special files (devices, a FIFO, a
folder) as inputs and outputs. Whatever the input, autostrat either works or raises an
`AutostratError` (argparse: exit code 2) within a few seconds, and leaves no file or folder
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
import shutil
import signal
import stat
import tempfile
import warnings
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
from autostrat.frontend.config import SECTIONS, apply_seeds, load_config
from autostrat.frontend.context import KEYS
from autostrat.frontend.run import plan_config
from autostrat.models import FFN
from autostrat.nn import Tensor
from autostrat.runtime.checkpoint import check_checkpoint, checkpoint_bytes, load_checkpoint
from autostrat.runtime.rank_table import load_rank_table
from autostrat.search import load_checkpoint_seeds
from autostrat.search.mindspore_checkpoint import read_mindspore_plan, resolve_names

ROOT = Path(__file__).resolve().parent.parent
CONFIGS = {path.name: path.read_text() for path in sorted((ROOT / "configs").glob("*.yaml"))}
PARSED = {name: yaml.safe_load(text) for name, text in CONFIGS.items()}  # parsed once: the cases copy them
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


def fails_cleanly_as_file(target: str, name: str, data: bytes, load) -> None:
    """`fails_cleanly` of `load` on a file `name` holding `data`, in a folder of its own."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / name
        path.write_bytes(data)
        fails_cleanly(target, Path(folder), lambda: load(path))


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
    name = draw(st.sampled_from(sorted(CONFIGS)))
    text = CONFIGS[name]
    kind = draw(st.sampled_from(["structure", "structure", "structure", "duplicate", "truncate", "bytes", "garbage", "nested"]))
    if kind == "structure":
        data = copy.deepcopy(PARSED[name])
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
    fails_cleanly_as_file("yaml config", "config.yaml", text, _load_and_seed)


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
    fails_cleanly_as_file("rank table", "rank_table.json", text, lambda path: load_rank_table(path, device_num))


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
    """Seed the FFN from a strategy checkpoint as `plan_for` does: MindSpore's (protobuf or
    JSON), else autostrat's own."""
    found = read_mindspore_plan(path)
    if found is None:
        apply_seeds(FFN_GRAPH, load_checkpoint_seeds(path), 8, where=str(path))
    else:
        seeds, layouts = found
        apply_seeds(FFN_GRAPH, resolve_names(FFN_GRAPH, seeds, str(path), layouts), 8, where=str(path))


@fuzz(1000)
@given(text=json_documents(STRATEGY_CHECKPOINT))
def test_fuzz_strategy_checkpoints(text):
    fails_cleanly_as_file("strategy checkpoint", "strategy.json", text, _seed_from_checkpoint)


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
    fails_cleanly_as_file("parameter checkpoint", "params.npz", data, _load_parameters)


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


# --- MindSpore's protobuf strategy checkpoints (.ckpt) ------------------------------------------

FIXTURES = ROOT / "tests" / "fixtures" / "mindspore"
PROTOBUF_CHECKPOINTS = [path.read_bytes() for path in sorted(FIXTURES.glob("*.ckpt"))]


def _varint_at(data: bytes, position: int) -> tuple[int, int] | None:
    value = shift = 0
    while position < len(data) and shift < 64:
        byte = data[position]
        value, position, shift = value | (byte & 0x7F) << shift, position + 1, shift + 7
        if not byte & 0x80:
            return value, position
    return None


def _fields(data: bytes, start: int = 0, end: int | None = None) -> list[tuple[int, int, int]]:
    """``(key offset, payload offset, payload end)`` of every protobuf field in ``data[start:end]``
    and, recursively, in the length-delimited payloads that parse as fields themselves."""
    end = len(data) if end is None else end
    found, position = [], start
    while position < end:
        key = _varint_at(data, position)
        if key is None or key[0] & 7 not in (0, 2):
            return found
        offset, (value, position) = position, key
        if value & 7 == 0:
            number = _varint_at(data, position)
            if number is None:
                return found
            found.append((offset, position, number[1]))
            position = number[1]
            continue
        length = _varint_at(data, position)
        if length is None or length[1] + length[0] > end:
            return found
        found.append((offset, length[1], length[1] + length[0]))
        found += _fields(data, length[1], length[1] + length[0])
        position = length[1] + length[0]
    return found


def _varint_bytes(value: int) -> bytes:
    out = bytearray()
    while True:
        out.append((value & 0x7F) | (0x80 if value > 0x7F else 0))
        value >>= 7
        if not value:
            return bytes(out)


@st.composite
def protobuf_checkpoints(draw) -> bytes:
    """One of MindSpore's own .ckpt files, truncated, with bits flipped, a field in another wire
    type, a payload replaced by garbage or by deeply nested fields, or bytes spliced in."""
    data = bytearray(draw(st.sampled_from(PROTOBUF_CHECKPOINTS)))
    fields = _fields(bytes(data))
    kind = draw(st.sampled_from(["truncate", "bits", "wire type", "garbage payload", "nested payload", "splice", "garbage"]))
    if kind == "truncate":
        return bytes(data[: draw(st.integers(0, len(data) - 1))])
    if kind == "bits":
        for _ in range(draw(st.integers(1, 8))):
            data[draw(st.integers(0, len(data) - 1))] ^= 1 << draw(st.integers(0, 7))
        return bytes(data)
    if kind == "wire type":  # a known field's key with another wire type (0..7)
        offset = draw(st.sampled_from(fields))[0]
        data[offset] = data[offset] & ~7 | draw(st.integers(0, 7))
        return bytes(data)
    if kind in ("garbage payload", "nested payload"):
        offset, start, end = draw(st.sampled_from(fields))
        payload = draw(st.binary(max_size=40)) if kind == "garbage payload" else _nested_fields(draw(st.sampled_from([10, 60, 400])))
        key = bytes(data[offset:start])
        if key and key[0] & 7 == 2:
            key = key[:1] + _varint_bytes(len(payload))
        return bytes(data[:offset]) + key + payload + bytes(data[end:])
    if kind == "splice":
        position = draw(st.integers(0, len(data)))
        return bytes(data[:position]) + draw(st.binary(min_size=1, max_size=16)) + bytes(data[position:])
    return draw(st.binary(max_size=64))


def _nested_fields(depth: int) -> bytes:
    """Field 2 (a message in every message of the schema that has one) nested `depth` deep."""
    payload = b"\x08\x02"
    for _ in range(depth):
        payload = bytes([2 << 3 | 2]) + _varint_bytes(len(payload)) + payload
    return payload


@fuzz(400)
@given(data=protobuf_checkpoints())
def test_fuzz_protobuf_strategy_checkpoints(data):
    fails_cleanly_as_file("protobuf strategy checkpoint", "strategy.ckpt", data, _seed_from_checkpoint)


# --- a wrong YAML node type at every key --------------------------------------------------------

NODE_TYPES = {"list": [1], "mapping": {"a": 1}, "number": 7, "string": "x", "null": None, "bool": True}


def _keys(value, path=()):
    """The path of every mapping key inside a YAML value, through lists."""
    if isinstance(value, dict):
        for key, child in value.items():
            yield path + (key,)
            yield from _keys(child, path + (key,))
    elif isinstance(value, list):
        for index, child in enumerate(value):
            yield from _keys(child, path + (index,))


def key_places() -> list[tuple[str, tuple]]:
    """``(config, key path)``: every key of the shipped configs (a path met in several configs,
    list indexes aside, once), then every context key and section the configs leave out, on
    ffn.yaml."""
    seen, places = set(), []
    for name in sorted(CONFIGS):
        for path in _keys(PARSED[name]):
            shape = tuple("[]" if isinstance(key, int) else key for key in path)
            if shape not in seen:
                seen.add(shape)
                places.append((name, path))
    places += [("ffn.yaml", (key,)) for key in sorted(set(KEYS) | set(SECTIONS)) if (key,) not in seen]
    return places


def _retyped(name: str, path: tuple, value) -> bytes:
    data = copy.deepcopy(PARSED[name])
    parent = data
    for key in path[:-1]:
        parent = parent[key]
    parent[path[-1]] = copy.deepcopy(value)
    return yaml.safe_dump(data).encode()


def _load_seed_and_plan(path: Path) -> None:
    """`_load_and_seed`, then for the tutorial FFN (quick to search) the whole plan: a context
    key is read by the search."""
    _load_and_seed(path)
    config = load_config(path)
    if type(config.net).__name__ == "FFN":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # ops no seed reaches: expected when the seeds were retyped away
            plan_config(config)


@pytest.mark.parametrize("node_type", sorted(NODE_TYPES))
def test_fuzz_yaml_node_types_at_every_key(node_type, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a string where a file name goes (strategy_ckpt_save_file) is written here
    folder = tmp_path / "case"
    for name, path in key_places():
        folder.mkdir()
        config = folder / "config.yaml"
        config.write_bytes(_retyped(name, path, NODE_TYPES[node_type]))
        fails_cleanly("yaml node type", folder, lambda: _load_seed_and_plan(config))
        shutil.rmtree(folder)


# --- deep nesting in every JSON input ------------------------------------------------------------

NEST = "\u0000nest\u0000"  # where the nesting goes in a document's JSON text


@pytest.fixture(scope="module")
def plan_text(tmp_path_factory) -> str:
    """A plan JSON as ``autostrat search --out`` writes it, recording its config by absolute path."""
    path = tmp_path_factory.mktemp("plan") / "plan.json"
    assert main(["search", str(ROOT / "configs" / "ffn.yaml"), "--out", str(path)]) == 0
    return path.read_text()


def json_inputs(plan: dict) -> dict:
    """Every JSON document a user hands autostrat, valid, by what reads it."""
    return {"strategy checkpoint": STRATEGY_CHECKPOINT, "rank table": rank_table(1, 8),
            "MindSpore strategy checkpoint": json.loads((FIXTURES / "ffn_fwd_strategy.json").read_text()),
            "plan (diff)": plan, "plan (report)": plan, "plan (explain)": plan}


def _nesting(depth: int, opener: str, closed: bool) -> str:
    inner = '{"a": ' * depth + "1" + "}" * depth if opener == "{" else "[" * depth + "1" + "]" * depth
    return inner if closed else inner[: depth * len('{"a": ' if opener == "{" else "[")]


@st.composite
def nested_documents(draw, documents: dict) -> tuple[str, bytes]:
    """A JSON input whose value at one place (or whole) is nested `depth` deep, closed or not."""
    target = draw(st.sampled_from(sorted(documents)))
    data = copy.deepcopy(documents[target])
    places = [()] + list(_places(data))
    path = draw(st.sampled_from(places))
    nesting = _nesting(draw(st.sampled_from([50, 900, 5000, 100_000])), draw(st.sampled_from("[{")), draw(st.booleans()))
    if not path:
        return target, nesting.encode()
    parent = data
    for key in path[:-1]:
        parent = parent[key]
    parent[path[-1]] = NEST
    return target, json.dumps(data).replace(json.dumps(NEST), nesting).encode()


def _read_json_input(target: str, path: Path, folder: Path, plan: Path) -> None:
    if "strategy checkpoint" in target:
        _seed_from_checkpoint(path)
    elif target == "rank table":
        load_rank_table(path, 8)
    else:
        argv = {"plan (diff)": ["diff", str(path), str(plan)], "plan (explain)": ["explain", str(path), "relu"],
                "plan (report)": ["report", str(path), "-o", str(folder / "report.html")]}[target]
        code = _main(argv)
        if code:
            raise _Failed(code)


@fuzz(200)
@given(data=st.data())
def test_fuzz_deep_nesting_in_every_json_input(data, plan_text, capsys):
    target, text = data.draw(nested_documents(json_inputs(json.loads(plan_text))))
    with tempfile.TemporaryDirectory() as folder:
        folder = Path(folder)
        (folder / "plan.json").write_text(plan_text)
        path = folder / "input.json"
        path.write_bytes(text)
        fails_cleanly(f"nested JSON: {target}", folder, lambda: _read_json_input(target, path, folder, folder / "plan.json"))
        capsys.readouterr()


# --- special files as inputs and outputs --------------------------------------------------------

SPECIAL_INPUTS = ("/dev/zero", "/dev/null", "/dev/urandom", "FIFO", "FOLDER", "LINK")


def _special_input(name: str, folder: Path) -> str:
    """A special file: a device, a FIFO no one writes to (opening it to read would block), a
    folder, or a symbolic link to /dev/zero."""
    if name == "FIFO":
        os.mkfifo(folder / "fifo")
        return str(folder / "fifo")
    if name == "FOLDER":
        (folder / "folder").mkdir()
        return str(folder / "folder")
    if name == "LINK":
        (folder / "link").symlink_to("/dev/zero")
        return str(folder / "link")
    return name


def _input_argv(role: str, special: str, folder: Path, plan: Path) -> list[str]:
    """The command line that reads `special` as the input `role`."""
    ffn = str(ROOT / "configs" / "ffn.yaml")
    if role == "strategy checkpoint":
        config = folder / "seeded.yaml"
        config.write_text(CONFIGS["ffn.yaml"] + f"strategy_ckpt_load_file: {special}\n")
        return ["search", str(config)]
    return {"config (search)": ["search", special], "config (run)": ["run", special, "--backend", "local"],
            "rank table": ["run", ffn, "--rank-table", special], "plan (diff)": ["diff", str(plan), special],
            "plan (report)": ["report", special, "-o", str(folder / "report.html")],
            "plan (explain)": ["explain", special, "relu"]}[role]


INPUT_ROLES = ("config (run)", "config (search)", "parameter checkpoint", "plan (diff)", "plan (explain)", "plan (report)",
               "rank table", "strategy checkpoint")


@pytest.mark.parametrize("role", INPUT_ROLES)
def test_fuzz_special_files_as_inputs_are_refused(role, plan_text, tmp_path, capsys):
    for special in SPECIAL_INPUTS:
        folder = tmp_path / special.strip("/").replace("/", "_")
        folder.mkdir()
        (folder / "plan.json").write_text(plan_text)
        path = _special_input(special, folder)
        argv = None if role == "parameter checkpoint" else _input_argv(role, path, folder, folder / "plan.json")
        before = listing(folder)
        CASES["special input"] += 1
        with time_limit():
            if argv is None:
                with pytest.raises(AutostratError, match="not a regular file"):
                    load_checkpoint(path)
            else:
                with mock.patch("autostrat.frontend.run.launch", _no_launch):
                    assert _main(argv) == 2
                assert "not a regular file" in capsys.readouterr().err
        assert listing(folder) == before


def _device(folder: Path, name: str, minor: int) -> Path:
    """A character device node like /dev/null (minor 3) or /dev/full (7), made in `folder`: the
    machine's own are never a test's target (a write that replaced one would break the machine)."""
    path = folder / name
    os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, minor))
    return path


OUTPUT_OPTIONS = (("search", "--out"), ("search", "--dump-ir"), ("search", "--report"), ("search", "--png"),
                  ("report", "-o"), ("report", "--png"))
def _output_argv(command: str, option: str, target: Path, folder: Path) -> list[str]:
    argv = [command, str(ROOT / "configs" / "ffn.yaml") if command == "search" else str(folder / "plan.json")]
    if command == "report" and option == "--png":
        argv += ["-o", str(folder / "report.html")]
    elif command == "search" and option == "--png":
        argv += ["--report", str(folder / "report.html")]
    return [*argv, option, str(target)]


@pytest.mark.parametrize("command,option", OUTPUT_OPTIONS)
def test_fuzz_a_folder_as_an_output(command, option, plan_text, tmp_path, capsys):
    """A folder where an output file goes (or a folder of outputs already there): the command
    works or fails in one line (exit 0 or 2), and the folder is left as it was."""
    (tmp_path / "plan.json").write_text(plan_text)
    (tmp_path / "folder").mkdir()
    (tmp_path / "folder" / "kept").write_text("")
    CASES["special output"] += 1
    with time_limit():
        code = _main(_output_argv(command, option, tmp_path / "folder", tmp_path))
    assert code in (0, 2) and "Traceback" not in capsys.readouterr().err
    assert (tmp_path / "folder").is_dir() and (tmp_path / "folder" / "kept").exists()


@pytest.mark.parametrize("minor", [3, 7], ids=["null", "full"])
@pytest.mark.parametrize("command,option", OUTPUT_OPTIONS)
def test_fuzz_a_device_as_an_output(command, option, minor, plan_text, tmp_path, capsys):
    """A null or a full device as an output: the command works or fails in one line (exit 0 or
    2), and the device stays a device."""
    (tmp_path / "plan.json").write_text(plan_text)
    device = _device(tmp_path, "device", minor)
    CASES["special output"] += 1
    with time_limit():
        code = _main(_output_argv(command, option, device, tmp_path))
    assert code in (0, 2) and "Traceback" not in capsys.readouterr().err
    assert stat.S_ISCHR(os.lstat(device).st_mode), f"{command} {option}: the device was replaced by a file"
