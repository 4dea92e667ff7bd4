"""A job on disk as data, never pickle: `save_job` writes it, `load_job` checks and reads it.

``RUN_DIR/job/`` holds exactly two files, so that whoever can write to a shared run directory
can at worst make a job fail, never run code on the ranks' hosts:

- ``arrays.npz``: every array of the job (initial values, batches, expected outputs, final
  state), written by `checkpoint.checkpoint_bytes` (sorted names, fixed zip timestamps, no
  pickle) and read with ``allow_pickle=False``, under the keys ``values/NAME``,
  ``batches/STEP/NAME``, ``expected/STEP/NAME`` and ``final/NAME``.
- ``job.json`` (schema version 2): ``format``, ``version``, ``files`` (the SHA-256 of
  ``arrays.npz``), ``arrays`` (per section the names in order: ``values``, ``batches`` and
  ``expected`` one list per step, ``final`` or null), and the job's other fields: ``name``,
  ``device_num``, ``plan_table``, ``plan_bytes``, ``predicted_peak``, ``single_seconds``, ``stall_timeout``,
  ``fault``, ``programs``, and the reference's ``reference`` (library), ``pooled``,
  ``gradient_worst`` and ``gradient_error`` (`job.Job`). A record (a program, an instruction, a slice context, a fault) is
  an object ``{"type": NAME, FIELD: VALUE...}``; tuples are lists. Records are rebuilt only
  from `job_schema.RECORDS`, the allow-list of types with the form of every field, so nothing in the file
  names code, and every value is checked before a constructor sees it.

The job's digest is the SHA-256 of ``job.json``, which holds that of ``arrays.npz``: one value,
given to every rank on its command line by the launcher, covers both files. The same job gives
the same bytes, hence the same digest.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os
import re
import zipfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from autostrat.errors import RuntimeBackendError
from autostrat.io import write_atomically
from autostrat.runtime.checkpoint import checkpoint_bytes
from autostrat.runtime.job import Job
from autostrat.runtime.job_schema import NAMES, Fixed, Many, Nullable, OneOf, Record, decode, encode

FORMAT = "autostrat job"
VERSION = 7  # 2: the predicted peak memory per device; 3: pipeline stage programs; 4: their chunks (schedules); 5: collective
# algorithms; 6: gradient synchronisation in buckets (SyncStart, SyncWait); 7: fused buckets (FusedAllReduce)
JOB_FOLDER = "job"
JOB_JSON = "job.json"
ARRAYS = "arrays.npz"
JOB_FILES = (ARRAYS, JOB_JSON)
_DIGEST = re.compile(r"[0-9a-f]{64}")


ARRAY_SECTIONS = {"values": NAMES, "batches": Many(NAMES), "expected": Many(NAMES), "final": Nullable(NAMES)}
JOB_FIELDS = {
    "name": str, "device_num": int, "programs": Many(Record(("Program", "StageProgram"))), "plan_table": str, "plan_bytes": int,
    "predicted_peak": int, "single_seconds": float, "stall_timeout": float, "fault": Nullable(Record(("Fault",))),
    "predicted_peaks": Many(int), "reference": str, "pooled": Many(str), "gradient_worst": str, "gradient_error": float,
    "tolerance": float,
}
_HEADER = {"format": OneOf((FORMAT,)), "version": int, "files": Fixed((str, str)), "arrays": None}


def save_job(job: Job, run_dir) -> str:
    """Write `job` to ``run_dir/job/`` and return its digest (what `load_job` requires).

    Example:
        >>> import tempfile
        >>> from autostrat.frontend.run import RunOptions, prepare_run
        >>> job, _, _ = prepare_run("configs/ffn.yaml", RunOptions(steps=1))
        >>> run_dir = tempfile.mkdtemp()
        >>> digest = save_job(job, run_dir)
        >>> len(digest), load_job(run_dir, digest).programs == job.programs
        (64, True)
    """
    fields = {field.name for field in dataclasses.fields(Job)}
    assert fields == set(JOB_FIELDS) | set(ARRAY_SECTIONS), f"the job schema is out of date: {sorted(fields)}"
    arrays = checkpoint_bytes(_flat_arrays(job))
    document = {"format": FORMAT, "version": VERSION, "files": [ARRAYS, _sha256(arrays)], "arrays": _array_names(job)}
    document |= {field: encode(getattr(job, field), form, field) for field, form in JOB_FIELDS.items()}
    text = (json.dumps(document, sort_keys=True, separators=(",", ":")) + "\n").encode()  # compact: the C encoder (indent takes the Python one, 7x slower)
    folder = Path(run_dir) / JOB_FOLDER
    write_atomically(folder / ARRAYS, arrays, private=True)
    write_atomically(folder / JOB_JSON, text, private=True)
    return _sha256(text)


def load_job(run_dir, digest: str, rank: int | None = None) -> Job:
    """The job `save_job` wrote to ``run_dir/job/``, after checking its files against `digest`
    (a missing, extra, changed or malformed file is a `RuntimeBackendError` naming it). Given a
    `rank`, only that rank's program is decoded now, the others when first read (`Programs`).

    Example: see `save_job`.
    """
    folder = Path(run_dir) / JOB_FOLDER
    where = str(folder / JOB_JSON)
    if not isinstance(digest, str) or not _DIGEST.fullmatch(digest):
        raise RuntimeBackendError(f"job {folder}: expected its digest as 64 lowercase hex digits (SHA-256), got {digest!r}")
    _check_listing(folder)
    text = _verified(folder / JOB_JSON, digest, "the digest the launcher gave")
    document = _parse(folder / JOB_JSON, text)
    data = _verified(folder / ARRAYS, document["files"][1], f"the digest in {JOB_JSON}")
    sections = {key: decode(document["arrays"][key], form, f"{where}: arrays.{key}")
                for key, form in ARRAY_SECTIONS.items()}
    arrays = _read_arrays(folder / ARRAYS, data, _array_keys(sections, where))
    fields = {field: decode(document[field], form, f"{where}: {field}") for field, form in JOB_FIELDS.items()
              if field != "programs"}
    programs = Programs(document["programs"], f"{where}: programs")
    for index in range(len(programs)) if rank is None else range(rank, min(rank + 1, len(programs))):
        programs[index]  # decoded and checked before the job starts
    fields["programs"] = tuple(programs) if rank is None else programs

    def section(prefix: str, names) -> dict:
        return {name: arrays[f"{prefix}/{name}"] for name in names}

    return Job(**fields, values=section("values", sections["values"]),
               batches=tuple(section(f"batches/{i}", names) for i, names in enumerate(sections["batches"])),
               expected=tuple(section(f"expected/{i}", names) for i, names in enumerate(sections["expected"])),
               final=None if sections["final"] is None else section("final", sections["final"]))


class Programs(Sequence):
    """A job's programs, each decoded (and checked, as `decode` checks) when first read: a rank
    runs its own program, and only rank 0 reads the others (for the report), so 8 ranks decode
    15 programs instead of 64 (a 2-layer GPT's training step: ~1 s of each rank's start-up).

    Example:
        >>> from autostrat.runtime.instructions import Load, Program
        >>> program = Program(0, 1, (), (Load("x", ((0, 4),)),), ("x",), ())
        >>> programs = Programs([encode(program, JOB_FIELDS["programs"].item, "program")], "job")
        >>> len(programs), programs[0].instructions, programs == (program,)
        (1, (Load(tensor='x', ranges=((0, 4),), dtype='', of='', via=''),), True)
    """

    def __init__(self, data, where: str):
        if not isinstance(data, list):
            raise RuntimeBackendError(f"{where}: expected a list of Program or StageProgram records, got {json.dumps(data)[:80]}")
        self._data, self._where, self._decoded = data, where, {}

    def __len__(self) -> int:
        return len(self._data)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return tuple(self[i] for i in range(len(self))[index])
        index = range(len(self))[index]  # an IndexError past the end, as a tuple's
        if index not in self._decoded:
            self._decoded[index] = decode(self._data[index], JOB_FIELDS["programs"].item, f"{self._where}[{index}]")
        return self._decoded[index]

    def __eq__(self, other) -> bool:
        return isinstance(other, Sequence) and tuple(self) == tuple(other)

    __hash__ = None


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _sections(job: Job) -> dict:
    """The job's arrays by their key prefix in the npz (``values``, ``batches/0``...), in the
    order of `ARRAY_SECTIONS`."""
    parts = {"values": job.values}
    parts |= {f"batches/{i}": batch for i, batch in enumerate(job.batches)}
    parts |= {f"expected/{i}": outputs for i, outputs in enumerate(job.expected)}
    return parts | ({} if job.final is None else {"final": job.final})


def _flat_arrays(job: Job) -> dict:
    flat = {}
    for section, arrays in _sections(job).items():
        for name, array in arrays.items():
            if not isinstance(name, str) or not isinstance(array, np.ndarray):
                raise RuntimeBackendError(f"cannot store the job: {section} {name!r}: expected a named numpy array, "
                                          f"got {type(array).__name__}")
            flat[f"{section}/{name}"] = array
    return flat


def _array_names(job: Job) -> dict:
    return {"values": list(job.values), "batches": [list(b) for b in job.batches],
            "expected": [list(e) for e in job.expected], "final": None if job.final is None else list(job.final)}


def _array_keys(sections: dict, where: str) -> list[str]:
    """Every key the npz must hold; a name listed twice in one section is malformed."""
    lists = {"values": sections["values"], "final": sections["final"] or ()}
    lists |= {f"batches/{i}": names for i, names in enumerate(sections["batches"])}
    lists |= {f"expected/{i}": names for i, names in enumerate(sections["expected"])}
    keys = []
    for section, names in lists.items():
        if len(set(names)) != len(names):
            raise RuntimeBackendError(f"{where}: arrays.{section}: expected distinct names, got {list(names)}")
        keys += [f"{section}/{name}" for name in names]
    return keys


def _check_listing(folder: Path) -> None:
    try:
        present = sorted(os.listdir(folder))
    except OSError as error:
        raise RuntimeBackendError(f"cannot read the job folder {folder}: {error.strerror or error}") from None
    missing = [name for name in JOB_FILES if name not in present]
    extra = [name for name in present if name not in JOB_FILES]
    if missing or extra:
        raise RuntimeBackendError(f"job folder {folder}: expected exactly the files {', '.join(JOB_FILES)}; "
                                  + "; ".join([f"missing {', '.join(missing)}"] * bool(missing)
                                              + [f"unexpected {', '.join(extra)}"] * bool(extra)))


def _verified(path: Path, digest: str, source: str) -> bytes:
    """The bytes of `path`, after checking their SHA-256 against `digest` (named by `source`)."""
    try:
        data = path.read_bytes()
    except OSError as error:
        raise RuntimeBackendError(f"cannot read the job file {path}: {error.strerror or error}") from None
    if _sha256(data) != digest:
        raise RuntimeBackendError(f"job file {path}: expected SHA-256 {digest} ({source}), got {_sha256(data)}; "
                                  "the file changed after the job was saved")
    return data


def _parse(path: Path, text: bytes) -> dict:
    try:
        document = json.loads(text)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise RuntimeBackendError(f"job file {path}: not valid JSON: {error}") from None
    except RecursionError:
        raise RuntimeBackendError(f"job file {path}: not a job file: values nested too deeply") from None
    if not isinstance(document, dict) or set(document) != set(_HEADER) | set(JOB_FIELDS):
        got = sorted(document) if isinstance(document, dict) else type(document).__name__
        raise RuntimeBackendError(f"job file {path}: expected the keys {sorted(set(_HEADER) | set(JOB_FIELDS))}, got {got}")
    decode(document["format"], _HEADER["format"], f"{path}: format")
    if type(document["version"]) is not int or document["version"] != VERSION:
        raise RuntimeBackendError(f"job file {path}: expected format version {VERSION}, got {document['version']!r}")
    name, _ = decode(document["files"], _HEADER["files"], f"{path}: files")
    if name != ARRAYS:
        raise RuntimeBackendError(f"job file {path}: files: expected the digest of {ARRAYS}, got one of {name!r}")
    if not isinstance(document["arrays"], dict) or set(document["arrays"]) != set(ARRAY_SECTIONS):
        raise RuntimeBackendError(f"job file {path}: arrays: expected an object with the keys {sorted(ARRAY_SECTIONS)}")
    return document


def _read_arrays(path: Path, data: bytes, keys: list[str]) -> dict[str, np.ndarray]:
    if not zipfile.is_zipfile(io.BytesIO(data)):  # np.load would also take a .npy or a pickle
        raise RuntimeBackendError(f"job file {path}: expected a numpy .npz archive")
    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as archive:
            members = archive.files
            missing, extra = sorted(set(keys) - set(members)), sorted(set(members) - set(keys))
            if missing or extra:
                raise RuntimeBackendError(f"job file {path}: expected the arrays {JOB_JSON} lists; missing {missing}, "
                                          f"unexpected {extra}")
            arrays = {key: archive[key] for key in keys}
    except (ValueError, EOFError, OSError, zipfile.BadZipFile) as error:
        raise RuntimeBackendError(f"job file {path}: not a readable .npz of numeric arrays: {error}") from None
    wrong = [key for key, array in arrays.items() if not isinstance(array, np.ndarray)]
    if wrong:
        raise RuntimeBackendError(f"job file {path}: expected .npy arrays, got other members {wrong}")
    return arrays
