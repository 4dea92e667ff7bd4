"""The job on disk (`runtime.job_file`): data only, an exact round trip, the same bytes every
time, and a job whose files changed after `save_job` is refused, by `load_job` and by the ranks
of a real MPI run before they compute anything."""

from __future__ import annotations

import ast
import dataclasses
import hashlib
import json
import os
import re
from pathlib import Path

import numpy as np
import pytest

from autostrat.errors import RuntimeBackendError
from autostrat.frontend.run import RunOptions, prepare_run
from autostrat.runtime import launcher
from autostrat.runtime.job import Job
from autostrat.runtime.job_file import ARRAY_SECTIONS, ARRAYS, JOB_FIELDS, JOB_FOLDER, JOB_JSON, load_job, save_job
from autostrat.runtime.job_schema import RECORDS, Record, encode
from autostrat.runtime.instructions import Load
from autostrat.runtime.rank import digest_argument

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def forward_job():
    return prepare_run(ROOT / "configs/ffn.yaml", RunOptions(steps=2))[0]


@pytest.fixture(scope="module")
def training_job():
    return prepare_run(ROOT / "configs/gpt_train.yaml", RunOptions(steps=2, device_num=4))[0]


def assert_same(saved, loaded, where: str = "job") -> None:
    """Equal field for field with the same types: tuples stay tuples, arrays keep dtype and
    shape (a scalar stays 0-d), dicts keep their order."""
    assert type(loaded) is type(saved), f"{where}: {type(saved).__name__} became {type(loaded).__name__}"
    if dataclasses.is_dataclass(saved):
        for field in dataclasses.fields(saved):
            assert_same(getattr(saved, field.name), getattr(loaded, field.name), f"{where}.{field.name}")
    elif isinstance(saved, dict):
        assert list(loaded) == list(saved), where
        for key in saved:
            assert_same(saved[key], loaded[key], f"{where}[{key!r}]")
    elif isinstance(saved, (tuple, list)):
        assert len(loaded) == len(saved), where
        for index, (a, b) in enumerate(zip(saved, loaded)):
            assert_same(a, b, f"{where}[{index}]")
    elif isinstance(saved, np.ndarray):
        assert (loaded.dtype, loaded.shape) == (saved.dtype, saved.shape), where
        assert np.array_equal(loaded, saved), where
    else:
        assert loaded == saved, where


@pytest.mark.parametrize("which", ["forward_job", "training_job"])
def test_a_saved_job_loads_back_exactly(tmp_path, request, which):
    job = request.getfixturevalue(which)
    assert_same(job, load_job(tmp_path, save_job(job, tmp_path)))


def test_the_training_job_keeps_its_scalar_state_0_d(tmp_path, training_job):
    loaded = load_job(tmp_path, save_job(training_job, tmp_path))
    scalars = [name for name, array in training_job.final.items() if array.ndim == 0]
    assert scalars and all(loaded.final[name].shape == () for name in scalars)
    assert loaded.training and len(loaded.batches) == 2


def test_the_same_job_gives_the_same_bytes(tmp_path, forward_job):
    first, second = tmp_path / "a", tmp_path / "b"
    assert save_job(forward_job, first) == save_job(forward_job, second)
    for name in (ARRAYS, JOB_JSON):
        assert (first / JOB_FOLDER / name).read_bytes() == (second / JOB_FOLDER / name).read_bytes()
    assert save_job(forward_job, first) == hashlib.sha256((first / JOB_FOLDER / JOB_JSON).read_bytes()).hexdigest()


def test_the_job_is_json_and_an_npz_without_pickle(tmp_path, forward_job):
    save_job(forward_job, tmp_path)
    document = json.loads((tmp_path / JOB_FOLDER / JOB_JSON).read_text())
    assert (document["format"], document["version"]) == ("autostrat job", 7)
    assert {ins["type"] for ins in document["programs"][0]["instructions"]} == {"Communicate", "Compute", "Load"}
    with np.load(tmp_path / JOB_FOLDER / ARRAYS, allow_pickle=False) as archive:
        assert "values/dense1.weight" in archive.files and "batches/1/x" in archive.files


@pytest.fixture()
def saved(tmp_path, forward_job):
    """A saved job: (run dir, digest, job folder)."""
    return tmp_path, save_job(forward_job, tmp_path), tmp_path / JOB_FOLDER


def _change_json(folder: Path, change) -> str:
    """Apply `change` to the job's JSON document and return the new file's digest."""
    document = json.loads((folder / JOB_JSON).read_text())
    change(document)
    text = json.dumps(document).encode()
    (folder / JOB_JSON).write_bytes(text)
    return hashlib.sha256(text).hexdigest()


def test_a_changed_byte_of_the_arrays_is_refused(saved):
    run_dir, digest, folder = saved
    data = bytearray((folder / ARRAYS).read_bytes())
    data[len(data) // 2] ^= 1
    (folder / ARRAYS).write_bytes(bytes(data))
    with pytest.raises(RuntimeBackendError, match=rf"job file .*{ARRAYS}: expected SHA-256 [0-9a-f]{{64}} \(the digest in job.json\), got"):
        load_job(run_dir, digest)


def test_a_changed_value_of_the_json_is_refused(saved):
    run_dir, digest, folder = saved
    (folder / JOB_JSON).write_text((folder / JOB_JSON).read_text().replace('"plan_bytes":', '"plan_bytes":1', 1))
    with pytest.raises(RuntimeBackendError, match=rf"job file .*{JOB_JSON}: expected SHA-256 {digest} \(the digest the launcher gave\)"):
        load_job(run_dir, digest)


def test_a_replaced_arrays_file_is_refused(saved, tmp_path_factory, training_job):
    run_dir, digest, folder = saved
    other = tmp_path_factory.mktemp("other")
    save_job(training_job, other)
    (folder / ARRAYS).write_bytes((other / JOB_FOLDER / ARRAYS).read_bytes())
    with pytest.raises(RuntimeBackendError, match=rf"job file .*{ARRAYS}: expected SHA-256"):
        load_job(run_dir, digest)


@pytest.mark.parametrize("change,message", [
    (lambda folder: (folder / "evil.py").write_text("import os"), r"expected exactly the files arrays.npz, job.json; unexpected evil.py"),
    (lambda folder: (folder / ARRAYS).unlink(), r"expected exactly the files arrays.npz, job.json; missing arrays.npz"),
], ids=["extra", "missing"])
def test_the_job_folder_holds_exactly_the_job_files(saved, change, message):
    run_dir, digest, folder = saved
    change(folder)
    with pytest.raises(RuntimeBackendError, match=rf"job folder .*{JOB_FOLDER}: {message}"):
        load_job(run_dir, digest)


@pytest.mark.parametrize("digest", [None, "", "ABC", "0" * 63])
def test_the_digest_is_required(saved, digest):
    with pytest.raises(RuntimeBackendError, match=r"expected its digest as 64 lowercase hex digits \(SHA-256\), got"):
        load_job(saved[0], digest)


def _instruction(kind: str):
    def change(document):
        instructions = document["programs"][0]["instructions"]
        next(ins for ins in instructions if ins["type"] == kind).update(CHANGES[kind])
    return change


CHANGES = {
    "Communicate": {"kind": "Exec"},
    "Load": {"type": "os.system"},
    "Compute": {"inputs": "x"},
}
MALFORMED = [
    (_instruction("Communicate"), r"programs\[0\]\.instructions\[\d+\]\.kind: expected one of \['AllGather', .*, got \"Exec\""),
    (_instruction("Load"), r"programs\[0\]\.instructions\[\d+\]: expected a Communicate or Compute or Load or RingCompute or SyncStart or SyncWait record, got "),
    (_instruction("Compute"), r"programs\[0\]\.instructions\[\d+\]\.inputs: expected a list of a string, got \"x\""),
    (lambda d: d.update(version=2), r"expected format version 7, got 2"),
    (lambda d: d["programs"][0].update(extra=1), r"programs\[0\]: expected the fields \[.*\] of Program, got \[.*'extra'"),
    (lambda d: d["arrays"]["values"].append("ghost"), rf"{ARRAYS}: expected the arrays job.json lists; missing \['values/ghost'\]"),
    (lambda d: d.update(fault={"type": "Fault", "rank": 1, "kind": "rm", "at": 0}), r"fault.kind: expected one of"),
]


@pytest.mark.parametrize("change,message", MALFORMED, ids=["kind", "type", "field", "version", "extra", "array", "fault"])
def test_a_malformed_job_with_its_own_digest_is_refused(saved, change, message):
    run_dir, _, folder = saved
    with pytest.raises(RuntimeBackendError, match=message):
        load_job(run_dir, _change_json(folder, change))


def test_a_rank_decodes_its_own_program_at_load_and_the_others_when_read(saved, forward_job):
    run_dir, _, folder = saved
    digest = _change_json(folder, lambda d: d["programs"][5].update(extra=1))
    job = load_job(run_dir, digest, rank=3)  # rank 5's program is malformed, rank 3's is not
    assert job.programs[3] == forward_job.programs[3] and len(job.programs) == 8
    with pytest.raises(RuntimeBackendError, match=r"programs\[5\]: expected the fields \[.*\] of Program, got \[.*'extra'"):
        job.programs[5]
    with pytest.raises(RuntimeBackendError, match=r"programs\[5\]: expected the fields"):
        load_job(run_dir, digest, rank=5)
    with pytest.raises(RuntimeBackendError, match=r"programs\[5\]: expected the fields"):
        load_job(run_dir, digest)


def test_only_plain_values_are_stored():
    with pytest.raises(RuntimeBackendError, match=r"cannot store the job: ins.ranges\[0\]\[1\]: expected an integer, got np.int64\(4\)"):
        encode(Load("x", ((0, np.int64(4)),)), Record(("Load",)), "ins")


def test_the_schema_covers_every_field_of_its_records():
    for name, (cls, fields) in RECORDS.items():
        assert cls.__name__ == name
        assert [field.name for field in dataclasses.fields(cls)] == list(fields), name
    assert {field.name for field in dataclasses.fields(Job)} == set(JOB_FIELDS) | set(ARRAY_SECTIONS)


def test_no_pickle_in_the_package():
    # Nothing in autostrat may import a module that runs code while reading a file.
    banned = {"pickle", "cPickle", "_pickle", "dill", "cloudpickle", "marshal", "shelve", "joblib"}
    for path in (ROOT / "autostrat").rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            assert not {name.split(".")[0] for name in names} & banned, f"{path}: imports {names}"
    runtime = "".join(path.read_text() for path in (ROOT / "autostrat" / "runtime").rglob("*.py"))
    assert not re.search(r"\bpickle\.|allow_pickle=True", runtime)


def test_the_rank_needs_the_digest_argument():
    with pytest.raises(RuntimeBackendError, match=r"expected the arguments RUN_DIR --digest HEX \(the job's digest\), got runs/x"):
        digest_argument(["runs/x"])


def test_launching_the_job_runner_needs_the_digest(tmp_path):
    with pytest.raises(RuntimeBackendError, match=r"launch: expected the job's digest \(the value save_job returned\), got none"):
        launcher.launch(tmp_path, 2)


def test_the_digest_goes_on_every_rank_command_line(tmp_path):
    command = launcher.mpiexec_command(tmp_path / "mpiexec", 8, tmp_path, digest="ab" * 32)
    assert command[-4:] == ["autostrat.runtime.rank", str(tmp_path), "--digest", "ab" * 32]


def test_mpi_ranks_refuse_a_changed_job(saved):
    run_dir, digest, folder = saved
    (folder / JOB_JSON).write_text((folder / JOB_JSON).read_text().replace('"stall_timeout":', '"stall_timeout":1', 1))
    result = launcher.launch(run_dir, 8, timeout=60, digest=digest)
    assert result.returncode != 0
    assert re.search(rf"job failed: rank \d+: RuntimeBackendError: job file .*{JOB_JSON}: expected SHA-256 {digest}", result.message)
    assert not (run_dir / "report.txt").exists()
    logs = [(run_dir / f"rank_{rank}" / "log").read_text() for rank in range(8) if (run_dir / f"rank_{rank}" / "log").exists()]
    assert logs and not any(" step(s), sent " in log for log in logs)


def test_the_job_files_are_the_owners_only(tmp_path, forward_job):
    # The job holds the model's values; whoever shares the run directory need not read them.
    previous = os.umask(0o022)
    try:
        save_job(forward_job, tmp_path)
    finally:
        os.umask(previous)
    modes = {path.name: path.stat().st_mode & 0o777 for path in (tmp_path / JOB_FOLDER).iterdir()}
    assert modes == {ARRAYS: 0o600, JOB_JSON: 0o600}
