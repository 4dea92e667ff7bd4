"""Files: what autostrat writes and where it may write (reading is `autostrat.reading`).

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
umask 022, 0640 under 027); ``private=True`` keeps a file to its owner (0600)."""

from __future__ import annotations

import errno
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
    A file's text is a str, bytes, or an iterable of str chunks, written as they come (the
    whole text is never held; a chunk that is not UTF-8 then fails its file midway, which is
    removed as any failed temporary is).

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


def _write_stream(where: str, data) -> None:
    """Write `data` to standard output ("") or through to an existing device or FIFO (opening a
    FIFO waits for its reader, as a shell's ``>`` does)."""
    if not where:
        if getattr(sys.stdout, "buffer", None) is None:  # started with standard output closed
            raise OSError(errno.EBADF, "standard output is closed")
        sys.stdout.flush()  # what was printed before comes first
        for piece in _pieces(data):
            sys.stdout.buffer.write(piece)
        sys.stdout.buffer.flush()
        return
    handle = os.open(where, _STREAM_FLAGS)
    try:
        for piece in _pieces(data):
            view = memoryview(piece)
            while view:
                view = view[os.write(handle, view):]
    finally:
        os.close(handle)


def _reason(error: OSError) -> str:
    """An OSError as its text and its errno name: "No space left on device (ENOSPC)"."""
    name = errno.errorcode.get(error.errno)
    return f"{error.strerror or error}" + (f" ({name})" if name else "")


def _encode(path, text):
    """`text` as bytes, or an iterable of text chunks as a generator of their bytes (a text
    too large to hold twice, such as a 16 384-device plan's JSON, is written as it is made)."""
    if isinstance(text, bytes):
        return text
    if isinstance(text, str):
        return _encoded(path, text)
    return (_encoded(path, chunk) for chunk in text)


def _encoded(path, text: str) -> bytes:
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as error:
        raise ConfigError(f"cannot write {path}: the text is not encodable as UTF-8 ({error.reason})") from None


def _pieces(data):
    """What `_encode` gave, as pieces of bytes to write one after the other."""
    return (data,) if isinstance(data, bytes) else data


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


def _write_temporary(path: Path, data, private: bool) -> Path:
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
                for piece in _pieces(data):
                    file.write(piece)
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
