"""MindSpore's parameter checkpoint file (``.ckpt``): the protobuf message ``Checkpoint`` of
MindSpore's ``checkpoint.proto`` (proto2), as `ModelCheckpoint` and ``save_checkpoint`` write it:

    message Checkpoint { message Value { required string tag = 1; required TensorProto tensor = 2; }
                         repeated Value value = 1; }
    message TensorProto { repeated int64 dims = 1; required string tensor_type = 2;
                          required bytes tensor_content = 3; }

one ``Value`` per parameter: its name, its shape, MindSpore's dtype name (``Float32``) and its
bytes in C order, little-endian. Encoded here by hand (varint keys and lengths, proto2's unpacked
repeated ``dims``): no protobuf package is needed to write it.
"""

from __future__ import annotations

import numpy as np

from autostrat.errors import CheckpointError
from autostrat.io import write_atomically
from autostrat.protobuf import field, number_field

# numpy dtype -> MindSpore's name of it in a checkpoint (``str(mindspore.float32)``).
MINDSPORE_TYPES = {"bool": "Bool", "float16": "Float16", "float32": "Float32", "float64": "Float64", "int8": "Int8",
                   "int16": "Int16", "int32": "Int32", "int64": "Int64", "uint8": "UInt8", "uint16": "UInt16",
                   "uint32": "UInt32", "uint64": "UInt64"}


def encode_checkpoint(parameters: dict) -> bytes:
    """The ``Checkpoint`` message of `parameters` (name -> array), in the given order.

    Example:
        >>> encode_checkpoint({"w": np.array([1.0], np.float32)}).hex(" ")  # value{tag "w", tensor{dims 1, "Float32", 1.0}}
        '0a 16 0a 01 77 12 11 08 01 12 07 46 6c 6f 61 74 33 32 1a 04 00 00 80 3f'
    """
    out = bytearray()
    for name, value in parameters.items():
        array = np.asarray(value)
        if array.dtype.name not in MINDSPORE_TYPES:
            raise CheckpointError(f"{name}: a MindSpore checkpoint holds {', '.join(sorted(MINDSPORE_TYPES))} arrays, got {array.dtype}")
        dims = b"".join(number_field(1, size) for size in array.shape)
        content = np.ascontiguousarray(array, array.dtype.newbyteorder("<")).tobytes()
        tensor = dims + field(2, MINDSPORE_TYPES[array.dtype.name].encode()) + field(3, content)
        out += field(1, field(1, name.encode()) + field(2, tensor))
    return bytes(out)


def save_mindspore_checkpoint(parameters: dict, path) -> None:
    """Write `parameters` to `path` as a MindSpore ``.ckpt`` (atomically: never half a file)."""
    write_atomically(path, encode_checkpoint(parameters))
