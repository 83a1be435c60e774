"""Atomic writes: a reader sees the old file or the new one, never half of either; and the one
check that an output path can be written, run before any work (bad input, exit 2) so a long run
never fails at its final write."""

from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any

from openclaw_ref.sync.errors import BadInput


def _default_mode() -> int:
    """What ``open()`` would give a new file (0o666 less the umask): ``mkstemp`` makes 0o600,
    which would leave published results unreadable to everyone else."""
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


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
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, _default_mode())
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
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
