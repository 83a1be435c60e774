"""Atomic writes: a reader sees the old file or the new one, never half of either."""

from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any


def _default_mode() -> int:
    """What ``open()`` would give a new file (0o666 less the umask): ``mkstemp`` makes 0o600,
    which would leave published results unreadable to everyone else."""
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


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
