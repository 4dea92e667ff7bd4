"""Files autostrat writes are never half-written: write a temporary file, then rename it."""

from __future__ import annotations

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
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        with os.fdopen(handle, "wb" if isinstance(text, bytes) else "w") as file:
            file.write(text)
        os.replace(temporary, path)
    except OSError as error:
        raise ConfigError(f"cannot write {path}: {error.strerror or error}") from None
