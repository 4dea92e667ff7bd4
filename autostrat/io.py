"""Files: what autostrat writes, where it may write, and how it reads.

Every file autostrat writes (plans, strategy checkpoints, IR dumps, reports and their charts,
parameter checkpoints, a run's files) goes through `write_files_atomically`, one policy:

- a regular file is never half-written: a temporary in the target's real folder, then a rename;
  a symlink is written through to its target (atomically there: the link stays a link);
- an existing target that is no regular file (a device such as /dev/null, a FIFO) is written
  through, never replaced, and its write errors are errors (/dev/full: ENOSPC);
- an `OutputPath` with ``stdout`` is standard output (the command line's ``-``);
- several files are all or nothing: every temporary is written, then the streams, then the
  renames; a failure leaves no temporary and no folder the call created;
- an output that is an input or another output is refused before any work (`check_outputs`);
- a path read from a config file stays inside the config's folder (`OutputPath.config`): a config
  is data, and data does not choose what to overwrite. A path from the command line or a Python
  call may be anywhere.

What autostrat writes for the user to keep and share (plans, strategy checkpoints, IR dumps,
parameter checkpoints, reports) gets the mode the user's umask gives any new file (0644 under
umask 022, 0640 under 027); ``private=True`` keeps a file to its owner (0600).

A JSON file autostrat cannot read is a `ConfigError` naming the file and the place."""

from __future__ import annotations

import errno
import json
import os
import secrets
import stat
import sys
from dataclasses import dataclass
from pathlib import Path

from autostrat.errors import ConfigError

_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0)
_STREAM_FLAGS = os.O_WRONLY | getattr(os, "O_NOCTTY", 0)  # no O_CREAT: it exists; no O_TRUNC: written through


@dataclass(frozen=True)
class OutputPath:
    """A file an output goes to, with how the user named it: `role` (``--out``,
    ``strategy_ckpt_save_file``) names it in messages; `config` is the config file the path was
    read from ("" for the command line or a Python call), whose folder it must stay in;
    `stdout` makes it standard output.

    Example:
        >>> str(OutputPath("-", "--out", stdout=True)), OutputPath("s.json", "strategy_ckpt_save_file", "c.yaml").described
        ('standard output', 'strategy_ckpt_save_file s.json (in c.yaml)')
        >>> OutputPath("configs/s.json", "strategy_ckpt_save_file", "configs/ffn.yaml").written("strategy checkpoint")
        'strategy checkpoint written to configs/s.json (strategy_ckpt_save_file in configs/ffn.yaml)'
    """

    path: str
    role: str = ""
    config: str = ""
    stdout: bool = False

    def __str__(self) -> str:
        return "standard output" if self.stdout else self.path

    @property
    def described(self) -> str:
        """The role and the path, for messages (and the config that gave the path)."""
        return f"{self.role or 'the output'} {self}" + (f" (in {self.config})" if self.config else "")

    def written(self, what: str) -> str:
        """The line saying `what` was written here (and which config key chose the place)."""
        return f"{what} written to {self}" + (f" ({self.role} in {self.config})" if self.config else "")

    def check(self) -> None:
        """A `ConfigError` if the path came from a config and leads out of the config's folder
        (symlinks followed, so a linked folder leading out is out).

        Example:
            >>> OutputPath("configs/../s.json", "strategy_ckpt_save_file", "configs/ffn.yaml").check()
            Traceback (most recent call last):
            ...
            autostrat.errors.ConfigError: configs/ffn.yaml: strategy_ckpt_save_file configs/../s.json is outside the config's folder ...
        """
        if not self.config or self.stdout:
            return
        folder = os.path.realpath(os.path.dirname(self.config) or ".")
        real = os.path.realpath(self.path)
        if real != folder and os.path.commonpath([folder, real]) == folder:
            return
        really = "" if os.path.normpath(os.path.abspath(self.path)) == real else f" (really {real})"
        raise ConfigError(f"{self.config}: {self.role} {self.path}{really} is outside the config's folder {folder}: "
                          f"a config writes only inside its own folder; give a path elsewhere on the command line "
                          f"or from Python")


def as_output(path) -> OutputPath:
    """`path` as an `OutputPath` (a plain path: named by a Python call, may be anywhere)."""
    return path if isinstance(path, OutputPath) else OutputPath(os.fspath(path))


def check_outputs(outputs, inputs: dict | None = None) -> None:
    """Refuse outputs that would clobber: one that is an input (`inputs`: role -> path, such as
    ``{"the config": "c.yaml"}``), that is another output, or that needs another output's file
    as its folder; and a config's path outside its folder (`OutputPath.check`). The same file
    is the same inode, or the same real path for files not there yet.

    Example:
        >>> check_outputs([OutputPath("p.json", "--out"), OutputPath("p.json", "--report")])
        Traceback (most recent call last):
        ...
        autostrat.errors.ConfigError: --out p.json and --report p.json are the same file; give each output its own path
    """
    outputs = [as_output(output) for output in outputs]
    for index, output in enumerate(outputs):
        output.check()
        for role, path in (inputs or {}).items():
            if not output.stdout and _identity(output.path) == _identity(path):
                raise ConfigError(f"{output.described} is {role} {path}: an output never replaces an input; "
                                  f"give the output another path")
        for other in outputs[index + 1:]:
            _check_pair(output, other)


def _check_pair(first: OutputPath, second: OutputPath) -> None:
    if first.stdout and second.stdout:
        raise ConfigError(f"{first.role} and {second.role} both write to standard output (-); give one of them a file")
    if first.stdout or second.stdout:
        return
    if _identity(first.path) == _identity(second.path):
        raise ConfigError(f"{first.described} and {second.described} are the same file; "
                          f"give each output its own path")
    for outer, inner in ((first, second), (second, first)):
        outer_real, inner_real = os.path.realpath(outer.path), os.path.realpath(inner.path)
        if os.path.commonpath([outer_real, inner_real]) == outer_real:
            raise ConfigError(f"{inner.described} would be inside {outer.described}, which is a file; "
                              f"give each output its own path")


def _identity(path) -> tuple:
    """What makes two paths one file: the inode of an existing one, else its real path."""
    try:
        found = os.stat(path)
    except OSError:
        return ("path", os.path.realpath(path))
    return ("inode", found.st_dev, found.st_ino)


def write_atomically(path, text: str | bytes, private: bool = False) -> None:
    """Write `text` (str as UTF-8, or bytes) to `path` (a path or an `OutputPath`) as the module
    docstring says: through a temporary file and a rename, through a symlink to its target,
    through to a device or FIFO; missing folders are created. On failure nothing is left: no
    temporary, no folder this call created. A new file follows the umask unless `private` (0600).

    Example:
        >>> import tempfile, pathlib
        >>> target = pathlib.Path(tempfile.mkdtemp()) / "plan.json"
        >>> write_atomically(target, "{}\\n"); target.read_text()
        '{}\\n'
    """
    write_files_atomically({path: text}, private)


def write_files_atomically(files: dict, private: bool = False) -> list[Path]:
    """Write several files (keys: paths or `OutputPath`s) all or nothing, after `check_outputs`:
    every temporary is written, then the devices, FIFOs and standard output, then the renames; a
    failure removes the temporaries, the targets that did not exist before and the folders this
    call created (a target that existed may already hold its new text). Returns the paths.

    Example:
        >>> import tempfile, pathlib
        >>> folder = pathlib.Path(tempfile.mkdtemp()) / "ir"
        >>> [p.name for p in write_files_atomically({folder / "a.ir": "a\\n", folder / "b.ir": "b\\n"})]
        ['a.ir', 'b.ir']
    """
    outputs = {as_output(path): _encode(path, text) for path, text in files.items()}
    check_outputs(outputs)
    targets: dict[OutputPath, tuple[str, str]] = {}  # output -> (how it is written, where)
    created: list[Path] = []  # folders made here, outermost first
    temporaries: dict[OutputPath, Path] = {}
    renamed: list[str] = []  # targets that did not exist before their rename
    current = None
    try:
        for current in outputs:
            targets[current] = _target(current)
            if targets[current][0] == "file":
                created += _make_folders(Path(targets[current][1]).parent)
        for current, (kind, where) in targets.items():
            if kind == "file":
                temporaries[current] = _write_temporary(Path(where), outputs[current], private)
        for current, (kind, where) in targets.items():
            if kind != "file":
                _write_stream(where, outputs[current])
        for current, temporary in temporaries.items():
            where = targets[current][1]
            existed = os.path.lexists(where)
            os.replace(temporary, where)
            if not existed:
                renamed.append(where)
    except BaseException as error:
        _remove([t for t in temporaries.values() if os.path.lexists(t)] + renamed, created)
        if isinstance(error, OSError):
            raise ConfigError(f"cannot write {current}: {_reason(error)}") from None
        raise
    return [Path(output.path) for output in outputs]


def _target(output: OutputPath) -> tuple[str, str]:
    """How `output` is written: ("stdout", ""); ("stream", path) for an existing file that is no
    regular file (a device, a FIFO: written through); ("file", real path) for a regular file,
    new or replaced, at the end of any symlinks (a dangling link's target is created)."""
    if output.stdout:
        return "stdout", ""
    try:
        found = os.stat(output.path)
    except FileNotFoundError:
        return "file", os.path.realpath(output.path)
    if stat.S_ISDIR(found.st_mode):
        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), output.path)
    return ("file", os.path.realpath(output.path)) if stat.S_ISREG(found.st_mode) else ("stream", output.path)


def _write_stream(where: str, data: bytes) -> None:
    """Write `data` to standard output ("") or through to an existing device or FIFO (opening a
    FIFO waits for its reader, as a shell's ``>`` does)."""
    if not where:
        if getattr(sys.stdout, "buffer", None) is None:  # started with standard output closed
            raise OSError(errno.EBADF, "standard output is closed")
        sys.stdout.flush()  # what was printed before comes first
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()
        return
    handle = os.open(where, _STREAM_FLAGS)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(handle, view):]
    finally:
        os.close(handle)


def _reason(error: OSError) -> str:
    """An OSError as its text and its errno name: "No space left on device (ENOSPC)"."""
    name = errno.errorcode.get(error.errno)
    return f"{error.strerror or error}" + (f" ({name})" if name else "")


def _encode(path, text: str | bytes) -> bytes:
    if isinstance(text, bytes):
        return text
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as error:
        raise ConfigError(f"cannot write {path}: the text is not encodable as UTF-8 ({error.reason})") from None


def _make_folders(folder: Path) -> list[Path]:
    """Create `folder` and its missing parents; returns the ones created, outermost first."""
    missing = []
    while not os.path.lexists(folder) and folder != folder.parent:
        missing.append(folder)
        folder = folder.parent
    created = []
    try:
        for path in reversed(missing):
            try:
                path.mkdir()  # 0777 less the umask, like any folder the user makes
            except FileExistsError:
                if not path.is_dir():
                    raise
                continue  # made meanwhile by someone else: not ours to remove
            created.append(path)
    except BaseException:
        _remove([], created)
        raise
    return created


def _write_temporary(path: Path, data: bytes, private: bool) -> Path:
    """A new file next to `path` holding `data`. It is created with mode 0666 (or 0600 when
    private) and the kernel applies the umask. Reading the umask ourselves would need
    os.umask(), which sets it too, for the whole process: another thread creating a file
    meanwhile would get the wrong mode. (tempfile.mkstemp always gives 0600.)"""
    for _ in range(100):
        temporary = path.parent / f".{path.name}.{secrets.token_hex(4)}.tmp"
        try:
            handle = os.open(temporary, _FLAGS, 0o600 if private else 0o666)
        except FileExistsError:
            continue
        try:
            with os.fdopen(handle, "wb") as file:
                file.write(data)
        except BaseException:
            os.remove(temporary)
            raise
        return temporary
    raise FileExistsError(errno.EEXIST, "no unused temporary file name", str(path.parent))


def _remove(files, folders) -> None:
    """Best-effort clean-up after a failed write: `files`, then `folders` innermost first."""
    for path in files:
        try:
            os.remove(path)
        except OSError:
            pass
    for folder in reversed(folders):
        try:
            os.rmdir(folder)  # only ever empty: it held nothing before this call
        except OSError:
            pass


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
