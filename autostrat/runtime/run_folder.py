"""The run folder of an MPI job: its owner's alone, and every file in it new.

Whoever can write to a run folder can plant a ``rank_0/log`` symlink (rank 0 would append to
the file it names) or a ``rank_3/pid`` holding another process's id (the launcher would kill
it). So the launcher makes the folder itself, mode 0700 (`make_run_folder`); a folder given
with ``--run-dir`` must not exist yet, or be empty, owned by the user and writable by no one
else (`check_run_folder`). Files in it are created, never reused: `create_file` and `open_new`
fail on a name that exists, and never follow a symlink, nor does `read_record`, with which the
launcher reads what the ranks recorded (`rank_pids`, `exit_status`).
"""

from __future__ import annotations

import os
import secrets
import socket
import stat
import tempfile
import time
from pathlib import Path

from autostrat.errors import ConfigError, RuntimeBackendError

RUNS = Path("runs")  # where a run folder goes when none is given
_NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)


def make_run_folder(path=None) -> Path:
    """A new run folder (mode 0700): `path`, created, or an empty folder there that
    `check_run_folder` accepts; without `path`, a new one under ``runs/``.

    Example:
        >>> folder = Path(tempfile.mkdtemp()) / "run"
        >>> oct(make_run_folder(folder).stat().st_mode & 0o777)
        '0o700'
    """
    if path is None:
        try:
            RUNS.mkdir(exist_ok=True)
            return Path(tempfile.mkdtemp(prefix=time.strftime("%Y%m%d-%H%M%S-"), dir=RUNS))  # 0700, new
        except OSError as error:
            raise ConfigError(f"cannot make a run folder under {RUNS.resolve()}: {error.strerror or error}; "
                              f"give one with --run-dir") from None
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.mkdir(mode=0o700)
        return path
    except FileExistsError:
        pass
    except OSError as error:
        raise ConfigError(f"run folder {path}: cannot create it: {error.strerror or error}") from None
    check_run_folder(path)
    if any(os.scandir(path)):
        raise ConfigError(f"run folder {path}: expected a new or empty folder, got one holding "
                          f"{', '.join(sorted(os.listdir(path))[:5])}; give a new --run-dir")
    return path


def check_run_folder(path) -> None:
    """A `ConfigError` unless `path` is a folder (not a symlink) owned by this user that no one
    else can write to.

    Example:
        >>> shared = Path(tempfile.mkdtemp()); shared.chmod(0o777)
        >>> check_run_folder(shared)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        autostrat.errors.ConfigError: run folder ...: expected a folder only you can write to, got mode 0o777 (writable by its group and others)
    """
    try:
        status = os.lstat(path)
    except OSError as error:
        raise ConfigError(f"run folder {path}: cannot read it: {error.strerror or error}") from None
    mode = status.st_mode
    if not stat.S_ISDIR(mode):
        raise ConfigError(f"run folder {path}: expected a folder, got {'a symlink' if stat.S_ISLNK(mode) else 'a file'}")
    if status.st_uid != os.geteuid():
        raise ConfigError(f"run folder {path}: expected a folder owned by you (uid {os.geteuid()}), got owner uid "
                          f"{status.st_uid}, mode {oct(mode & 0o777)}")
    if mode & 0o022:
        raise ConfigError(f"run folder {path}: expected a folder only you can write to, got mode {oct(mode & 0o777)} "
                          f"(writable by its {'group and others' if mode & 0o022 == 0o022 else 'group' if mode & 0o020 else 'others'})")


def create_file(path, data: str | bytes) -> None:
    """Write a new file `path` (0600) holding `data`, whole or not at all: written under a
    temporary name, then linked to `path`, which fails if the name exists; never follows a
    symlink. An `OSError` is a `RuntimeBackendError` naming the file.

    Example:
        >>> target = Path(tempfile.mkdtemp()) / "pid"
        >>> create_file(target, "42\\n"); create_file(target, "43\\n")
        Traceback (most recent call last):
        autostrat.errors.RuntimeBackendError: cannot write ...pid: File exists
    """
    path = Path(path)
    data = data.encode() if isinstance(data, str) else data
    temporary = path.parent / f".{path.name}.{secrets.token_hex(4)}.tmp"
    try:
        handle = os.open(temporary, _NEW, 0o600)
        try:
            with os.fdopen(handle, "wb") as file:
                file.write(data)
            os.link(temporary, path, follow_symlinks=False)  # whole, and only if the name is free
        finally:
            os.unlink(temporary)
    except OSError as error:
        raise RuntimeBackendError(f"cannot write {path}: {error.strerror or error}") from None


def open_new(path, append: bool = True) -> int:
    """A descriptor of a new file `path` (0600) opened for writing, that fails if `path`
    exists (a symlink included)."""
    return os.open(path, _NEW | (os.O_APPEND if append else 0), 0o600)


def read_record(path, limit: int = -1) -> str | None:
    """The text of a file the ranks wrote (a pid, an exit status, a log; its first `limit`
    bytes when given), None when it cannot be read; a symlink is never followed."""
    try:
        handle = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return None
    with os.fdopen(handle, "rb") as file:
        return file.read(limit).decode(errors="replace")


def exit_status(run_dir: Path, rank: int) -> int | None:
    """The status a rank recorded when it ended on its own terms (``rank_<i>/exit``), or None."""
    try:
        return int(read_record(run_dir / f"rank_{rank}" / "exit") or "")
    except ValueError:
        return None


def rank_pids(run_dir: Path, device_num: int, anywhere: bool = False) -> dict[int, int]:
    """The process id each rank recorded (``rank_<i>/pid``), of the ranks on this machine only
    (``rank_<i>/host``; the run directory is shared across hosts), or on any host (`anywhere`)."""
    pids, here = {}, socket.gethostname()
    for rank in range(device_num):
        folder = run_dir / f"rank_{rank}"
        try:
            pid = int(read_record(folder / "pid") or "")
        except ValueError:
            continue
        host = (read_record(folder / "host") or here).strip()
        if anywhere or host == here:
            pids[rank] = pid
    return pids
