"""Files: autostrat never half-writes one (a temporary file, then a rename), and a JSON file it
cannot read is a `ConfigError` naming the file and the place."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from autostrat.errors import ConfigError


def write_atomically(path, text: str | bytes) -> None:
    """Write `text` (str, or bytes for a binary file) to `path` through a temporary file in the
    same folder and a rename.

    Example:
        >>> import tempfile, pathlib
        >>> target = pathlib.Path(tempfile.mkdtemp()) / "plan.json"
        >>> write_atomically(target, "{}\\n"); target.read_text()
        '{}\\n'
    """
    path = Path(path)
    temporary = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        with os.fdopen(handle, "wb" if isinstance(text, bytes) else "w") as file:
            file.write(text)
        os.replace(temporary, path)
    except OSError as error:
        if temporary is not None and os.path.exists(temporary):  # a failed write leaves nothing behind
            os.remove(temporary)
        raise ConfigError(f"cannot write {path}: {error.strerror or error}") from None


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
    path = Path(path)
    try:
        return json.loads(path.read_text())
    except OSError as error:
        raise ConfigError(f"cannot read {what} {path}: {error.strerror or error}") from None
    except json.JSONDecodeError as error:
        raise ConfigError(f"{path}: not valid JSON at line {error.lineno}, column {error.colno}: {error.msg}") from None
