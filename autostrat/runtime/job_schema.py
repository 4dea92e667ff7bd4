"""The job file's records as data (`runtime.job_file`): the form of every field of every type a
job may hold (`RECORDS`: an allow-list, so nothing in a file names code), and `encode` /
`decode` between values and JSON data, every part checked against its form before a
constructor sees it (a value of another form is a `RuntimeBackendError` saying where).
"""

from __future__ import annotations

import dataclasses
import functools
import json
from dataclasses import dataclass

from autostrat.errors import RuntimeBackendError
from autostrat.layout import SliceContext
from autostrat.runtime.job import FAULTS, Fault
from autostrat.runtime.instructions import PHASES, Communicate, Compute, Load, Program, Recv, RingCompute, Send
from autostrat.runtime.stage_program import SCHEDULES, ChunkProgram, StageProgram
from autostrat.runtime.stream import FusedAllReduce, SyncStart, SyncWait

KINDS = ("AllGather", "AllReduce", "AllToAll", "PartialCreate", "ReduceScatter", "Sendrecv", "Slice")


@dataclass(frozen=True)
class Many:
    """A tuple of any length, every item of form `item`."""

    item: object


@dataclass(frozen=True)
class Fixed:
    """A tuple of exactly these forms, in order."""

    items: tuple


@dataclass(frozen=True)
class OneOf:
    """A string among `choices`."""

    choices: tuple


@dataclass(frozen=True)
class Nullable:
    """None or a value of form `item`."""

    item: object


@dataclass(frozen=True)
class Record:
    """A record of one of the `RECORDS` types named in `names`."""

    names: tuple


ATTRIBUTE = "attribute"  # an op attribute: None, a bool, number or string, or a tuple of those
RANGES = Many(Fixed((int, int)))
SHAPES = Many(Many(int))
NAMES = Many(str)
NAME_PAIRS = Many(Fixed((str, str)))

_STAGE_RECORDS = ("Communicate", "Compute", "Load", "Recv", "Send")
RECORDS = {
    "Communicate": (Communicate, {
        "kind": OneOf(KINDS), "source": str, "target": str, "group": Many(int), "dims": Many(int),
        "chunks": Many(int), "reduce_op": str, "peers": Fixed((int, int)), "predicted": int, "edge": str,
        "phase": OneOf(PHASES), "algorithm": str}),
    "Compute": (Compute, {
        "op": str, "op_type": str, "inputs": NAMES, "outputs": NAMES, "attrs": Many(Fixed((str, ATTRIBUTE))),
        "context": Record(("SliceContext",)), "dtypes": NAMES, "main": NAMES}),
    "RingCompute": (RingCompute, {
        "op": str, "op_type": str, "inputs": NAMES, "outputs": NAMES, "attrs": Many(Fixed((str, ATTRIBUTE))),
        "context": Record(("SliceContext",)), "dtypes": NAMES, "main": NAMES, "group": Many(int), "wire_dtype": str,
        "predicted": int, "edge": str, "phase": OneOf(PHASES)}),
    "Fault": (Fault, {"rank": int, "kind": OneOf(FAULTS), "at": int}),
    "FusedAllReduce": (FusedAllReduce, {"steps": Many(Record(("Communicate",))), "algorithm": str, "predicted": int}),
    "SyncStart": (SyncStart, {"steps": Many(Record(("Communicate", "FusedAllReduce")))}),
    "SyncWait": (SyncWait, {"steps": Many(Record(("Communicate", "FusedAllReduce")))}),
    "Load": (Load, {"tensor": str, "ranges": RANGES, "dtype": str, "of": str, "via": str}),
    "Recv": (Recv, {"key": str, "source": int, "tag": int, "shape": Many(int), "dtype": str}),
    "Send": (Send, {"key": str, "dest": int, "tag": int, "predicted": int, "edge": str, "phase": OneOf(PHASES)}),
    "ChunkProgram": (ChunkProgram, {
        "stage": int, "forward": Many(Record(_STAGE_RECORDS)), "backward": Many(Record(_STAGE_RECORDS)),
        "weight": Many(Record(_STAGE_RECORDS)), "accumulated": NAMES, "passed": NAMES}),
    "StageProgram": (StageProgram, {
        "rank": int, "device_num": int, "stage": int, "stages": int, "micro_batches": int, "schedule": OneOf(SCHEDULES),
        "partitions": Many(Many(Many(int))), "loads": Many(Record(("Load",))), "chunks": Many(Record(("ChunkProgram",))),
        "update": Many(Record(_STAGE_RECORDS)), "inputs": NAMES, "outputs": NAME_PAIRS, "updates": NAME_PAIRS}),
    "Program": (Program, {
        "rank": int, "device_num": int, "partitions": Many(Many(Many(int))),
        "instructions": Many(Record(("Communicate", "Compute", "Load", "RingCompute", "SyncStart", "SyncWait"))), "inputs": NAMES,
        "outputs": NAME_PAIRS,
        "updates": NAME_PAIRS, "loss_scale": float}),
    "SliceContext": (SliceContext, {
        "input_ranges": Many(RANGES), "input_shapes": SHAPES, "output_ranges": Many(RANGES),
        "output_shapes": SHAPES}),
}


def _describe(form) -> str:
    if form in (int, float, str):
        return {int: "an integer", float: "a number", str: "a string"}[form]
    if isinstance(form, Many):
        return f"a list of {_describe(form.item)}"
    if isinstance(form, Fixed):
        return f"a list of {len(form.items)} ({', '.join(_describe(item) for item in form.items)})"
    if isinstance(form, OneOf):
        return f"one of {list(form.choices)}"
    if isinstance(form, Nullable):
        return f"null or {_describe(form.item)}"
    if isinstance(form, Record):
        return f"a {' or '.join(form.names)} record"
    return "null, a boolean, number or string, or a list of those"


@functools.cache
def _fields_of(name: str) -> tuple[type, dict]:
    cls, fields = RECORDS[name]
    declared = [field.name for field in dataclasses.fields(cls)]
    assert sorted(declared) == sorted(fields), f"the job schema of {name} is out of date: {declared}"
    return cls, fields


def encode(value, form, where: str):
    """`value` as JSON data of form `form`; a value of another form is a `RuntimeBackendError`.

    Example:
        >>> encode(Load("x", ((0, 4), (0, 8))), Record(("Load",)), "instruction")
        {'type': 'Load', 'tensor': 'x', 'ranges': [[0, 4], [0, 8]], 'dtype': '', 'of': '', 'via': ''}
    """
    if form is ATTRIBUTE and isinstance(value, tuple):
        return [encode(item, ATTRIBUTE, f"{where}[{i}]") for i, item in enumerate(value)]
    name = type(value).__name__
    if isinstance(form, Record) and name in form.names and RECORDS[name][0] is type(value):
        cls, fields = _fields_of(name)
        return {"type": cls.__name__} | {key: encode(getattr(value, key), f, f"{where}.{key}") for key, f in fields.items()}
    if isinstance(form, (Many, Fixed)) and isinstance(value, tuple) and (isinstance(form, Many) or len(value) == len(form.items)):
        forms = [form.item] * len(value) if isinstance(form, Many) else form.items
        return [encode(item, f, f"{where}[{i}]") for i, (item, f) in enumerate(zip(value, forms))]
    if isinstance(form, Nullable):
        return None if value is None else encode(value, form.item, where)
    if _scalar_fits(value, form):
        return float(value) if form is float else value
    raise RuntimeBackendError(f"cannot store the job: {where}: expected {_describe(form)}, got {value!r}")


def decode(data, form, where: str):
    """The value of form `form` that `encode` wrote as `data`, every part checked.

    Example:
        >>> decode({"type": "Load", "tensor": "x", "ranges": [[0, 4]], "dtype": "", "of": "", "via": ""}, Record(("Load",)), "instruction")
        Load(tensor='x', ranges=((0, 4),), dtype='', of='', via='')
    """
    if form is ATTRIBUTE and isinstance(data, list):
        return tuple(decode(item, ATTRIBUTE, f"{where}[{i}]") for i, item in enumerate(data))
    if isinstance(form, Record) and isinstance(data, dict) and data.get("type") in form.names:
        cls, fields = _fields_of(data["type"])
        if set(data) != {"type"} | set(fields):
            raise RuntimeBackendError(f"{where}: expected the fields {sorted(fields)} of {cls.__name__}, "
                                      f"got {sorted(set(data) - {'type'})}")
        values = {key: decode(data[key], f, f"{where}.{key}") for key, f in fields.items()}
        try:
            return cls(**values)
        except (TypeError, ValueError) as error:
            raise RuntimeBackendError(f"{where}: not a valid {cls.__name__}: {error}") from None
    if isinstance(form, (Many, Fixed)) and isinstance(data, list) and (isinstance(form, Many) or len(data) == len(form.items)):
        forms = [form.item] * len(data) if isinstance(form, Many) else form.items
        return tuple(decode(item, f, f"{where}[{i}]") for i, (item, f) in enumerate(zip(data, forms)))
    if isinstance(form, Nullable):
        return None if data is None else decode(data, form.item, where)
    if _scalar_fits(data, form) and (form is not float or isinstance(data, float)):
        return data
    raise RuntimeBackendError(f"{where}: expected {_describe(form)}, got {json.dumps(data)[:80]}")


def _scalar_fits(value, form) -> bool:
    if form is ATTRIBUTE:
        return value is None or type(value) in (bool, int, float, str)
    if isinstance(form, OneOf):
        return isinstance(value, str) and value in form.choices
    if form is float:
        return type(value) in (int, float)
    return form in (int, str) and type(value) is form
