"""Files autostrat reads: configs, rank tables, plans and checkpoints are data, read whole only
when they are regular files of a sane size, decoded as UTF-8 and parsed as JSON with errors that
name the file and the place (a `ConfigError`), never a traceback.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

from autostrat.errors import ConfigError


def read_json(path, what: str):
    """The JSON value in `path`; an unreadable file or bad JSON is a `ConfigError` naming `what`,
    the file, and the line and column.

    Example:
        >>> import tempfile, pathlib
        >>> target = pathlib.Path(tempfile.mkdtemp()) / "table.json"
        >>> _ = target.write_text('{"version": "1.0"}')
        >>> read_json(target, "rank table")
        {'version': '1.0'}
    """
    return parse_json(read_text(path, what), path, what)


def parse_json(text: str | bytes, path, what: str):
    """The JSON value in `text`, read from `path`; bad JSON is a `ConfigError` naming `what`, the
    file, and the line and column (bytes are decoded as UTF-8 first, as `read_text` does).

    Example:
        >>> parse_json("[[[1]]]", "plan.json", "plan")
        [[[1]]]
        >>> parse_json("[" * 100000, "plan.json", "plan")
        Traceback (most recent call last):
        ...
        autostrat.errors.ConfigError: plan.json: not a valid plan: values nested too deeply
    """
    if isinstance(text, bytes):
        text = _decode(text, Path(path), what)
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise ConfigError(f"{path}: not valid JSON at line {error.lineno}, column {error.colno}: {error.msg}") from None
    except ValueError as error:  # an integer of more digits than Python converts
        raise ConfigError(f"{path}: not a valid {what}: {error}") from None
    except RecursionError:
        raise ConfigError(f"{path}: not a valid {what}: values nested too deeply") from None


# Inputs are configs, tables, plans and checkpoints: far below this. A larger file is a mistake
# (a wrong path), and reading it whole would take the machine's memory first.
MAX_INPUT_BYTES = 1 << 30


def read_bytes(path, what: str, limit: int | None = MAX_INPUT_BYTES) -> bytes:
    """The bytes of `path`, or a `ConfigError` naming `what` and why it cannot be read. Only a
    regular file of at most `limit` bytes (None: any size) is read: a device (/dev/zero never ends), a FIFO
    (it blocks until a writer comes) or a folder is refused before anything is read.

    Example:
        >>> read_bytes("/dev/zero", "config")
        Traceback (most recent call last):
        ...
        autostrat.errors.ConfigError: cannot read config /dev/zero: a character device, not a regular file
    """
    try:
        _check_regular(os.stat(path), path, what, limit)  # before opening: opening some devices does something
        # non-blocking, so that a FIFO put in its place since does not block the open either
        handle = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0))
        with os.fdopen(handle, "rb") as file:
            _check_regular(os.fstat(file.fileno()), path, what, limit)
            data = file.read() if limit is None else file.read(limit + 1)  # a file grown since the check is refused too
    except OSError as error:
        raise ConfigError(f"cannot read {what} {path}: {error.strerror or error}") from None
    _check_size(len(data), path, what, limit)
    return data


def _check_regular(status: os.stat_result, path, what: str, limit: int | None) -> None:
    kind = _special_kind(status.st_mode)
    if kind:
        raise ConfigError(f"cannot read {what} {path}: {kind}, not a regular file")
    _check_size(status.st_size, path, what, limit)


def _check_size(size: int, path, what: str, limit: int | None) -> None:
    if limit is not None and size > limit:
        raise ConfigError(f"cannot read {what} {path}: more than the {limit} bytes such an input may have")


def _special_kind(mode: int) -> str:
    """What a file of this `os.stat` mode is, when it is not a regular file; else ""."""
    for test, kind in ((stat.S_ISDIR, "a folder"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return kind
    return "" if stat.S_ISREG(mode) else "not a regular file"


def read_text(path, what: str) -> str:
    """The UTF-8 text of `path` (a byte-order mark is skipped); an unreadable file or other bytes
    are a `ConfigError` naming `what`, the file and the place of the first bad byte.

    Example:
        >>> import tempfile, pathlib
        >>> target = pathlib.Path(tempfile.mkdtemp()) / "bad.yaml"
        >>> _ = target.write_bytes(b"name: caf\\xe9")
        >>> read_text(target, "config")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        autostrat.errors.ConfigError: .../bad.yaml: a config must be UTF-8 text; line 1, column 10 is byte 0xe9
    """
    path = Path(path)
    return _decode(read_bytes(path, what), path, what)


def _decode(data: bytes, path: Path, what: str) -> str:
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        line = data.count(b"\n", 0, error.start) + 1
        column = error.start - data.rfind(b"\n", 0, error.start)
        raise ConfigError(f"{path}: a {what} must be UTF-8 text; line {line}, column {column} is byte 0x{data[error.start]:02x}") from None
