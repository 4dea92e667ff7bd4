"""Protobuf's wire format, the writing half: varints and fields, for MindSpore's two protobuf
files (the strategy checkpoint, `search.mindspore_checkpoint`; the parameter checkpoint,
`runtime.mindspore_ckpt`). Hand-written, so the search's import path needs no protobuf package.

Example:
    >>> varint(300).hex(), field(1, b"ab").hex(), number_field(2, -1).hex()
    ('ac02', '0a026162', '10ffffffffffffffffff01')
"""

from __future__ import annotations


def varint(value: int) -> bytes:
    """`value` as a base-128 varint; a negative int32 or int64 as its 64-bit two's complement
    (ten bytes), as protobuf writes it."""
    value &= (1 << 64) - 1
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def field(number: int, payload: bytes) -> bytes:
    """A length-delimited field (wire type 2): a string, bytes, a message or a packed list."""
    return varint(number << 3 | 2) + varint(len(payload)) + payload


def number_field(number: int, value: int) -> bytes:
    """A varint field (wire type 0): an integer, a bool or an enum."""
    return varint(number << 3) + varint(value)
