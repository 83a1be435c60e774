"""Atomic writes: a reader sees the old file or the new one, never half of either, and after the
call returns both the data and the rename are on disk (the file and its directory are fsynced);
and the one check that an output path can be written, run before any work (bad input, exit 2) so
a long run never fails at its final write.

A new file gets the mode ``open()`` would give it (0o666 less the umask): the temporary file is
created with ``os.open(..., 0o666)`` so the kernel applies the umask. The process umask is never
read or changed here (``os.umask`` can only be read by setting it, a race with other threads)."""

from __future__ import annotations

import json
import math
import os
import secrets
import tempfile
from pathlib import Path
from typing import Any

from openclaw_ref.sync.errors import BadInput

_NEW_FILE_MODE = 0o666  # the kernel subtracts the umask, as for open()


def _create_temp_beside(path: Path) -> tuple[int, Path]:
    """A new, empty, exclusively created file in ``path``'s directory: (fd, its path)."""
    while True:
        tmp = path.parent / f".{path.name}.{secrets.token_hex(6)}.tmp"
        try:
            return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, _NEW_FILE_MODE), tmp
        except FileExistsError:
            continue


def _fsync_directory(directory: Path) -> None:
    """Make a rename inside ``directory`` durable (POSIX: the entry lives in the directory)."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _nearest_existing(path: Path) -> Path:
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _check_can_create_in(flag: str, path: Path, anchor: Path) -> None:
    """BadInput unless ``anchor`` (the nearest existing ancestor of ``path``) is a directory in
    which this process can create a file (tried, not guessed: root passes ``os.access``)."""
    if not anchor.is_dir():
        raise BadInput(f"{flag} {path}: {anchor} is not a directory")
    try:
        fd, probe = tempfile.mkstemp(dir=anchor, prefix=".openclaw-write-probe.")
    except OSError as exc:
        raise BadInput(f"{flag} {path}: cannot write in {anchor} ({exc.strerror})") from None
    os.close(fd)
    os.unlink(probe)


def check_output_file(path: str | os.PathLike, flag: str) -> Path:
    """``path`` if a file can be written there (it may not exist yet, nor its parents); else
    ``BadInput`` in one line naming ``flag`` and what is wrong."""
    path = Path(path)
    if path.is_dir():
        raise BadInput(f"{flag} {path}: is a directory; give a file name")
    _check_can_create_in(flag, path, _nearest_existing(path.parent))
    return path


def check_output_dir(path: str | os.PathLike, flag: str) -> Path:
    """``path`` if it is, or can be made, a directory that files can be written in; else
    ``BadInput`` in one line naming ``flag`` and what is wrong."""
    path = Path(path)
    _check_can_create_in(flag, path, _nearest_existing(path))
    return path


def write_bytes_atomic(path: str | os.PathLike, data: bytes) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = _create_temp_beside(path)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_directory(path.parent)
    return path


def write_text_atomic(path: str | os.PathLike, text: str) -> Path:
    return write_bytes_atomic(path, text.encode("utf-8"))


def round_floats(obj: Any, digits: int) -> Any:
    """``obj`` with every finite float rounded to ``digits`` significant digits (containers
    copied; NaN/inf and everything else as is)."""
    if isinstance(obj, float):
        return float(f"{obj:.{digits}g}") if math.isfinite(obj) else obj
    if isinstance(obj, dict):
        return {k: round_floats(v, digits) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [round_floats(v, digits) for v in obj]
    return obj


def write_json_atomic(path: str | os.PathLike, obj: Any, *, compact: bool = False,
                      float_digits: int | None = None) -> Path:
    """Sorted keys; indented for reading, or ``compact`` (no whitespace) for committed data.
    ``float_digits`` rounds floats to that many significant digits first."""
    if float_digits is not None:
        obj = round_floats(obj, float_digits)
    text = (json.dumps(obj, sort_keys=True, separators=(",", ":")) if compact
            else json.dumps(obj, indent=1, sort_keys=True))
    return write_text_atomic(path, text + "\n")


def read_json(path: str | os.PathLike) -> Any:
    return json.loads(Path(path).read_text(encoding="utf-8"))
