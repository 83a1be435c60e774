"""What a result was measured on: recorded beside every number we publish."""

from __future__ import annotations

import datetime
import os
import platform
import subprocess
from pathlib import Path

import torch
import torch.distributed as dist

from openclaw_ref.sync.target import nccl_version


def git_sha(cwd: Path | None = None) -> str:
    """The checkout's commit, with ``-dirty`` when tracked code has uncommitted changes.

    Looks in ``cwd`` (default: the working directory, where tox and users run the suite), then
    beside this file (an editable install); an installed wheel outside a checkout gives
    ``unknown``."""
    for where in ([cwd] if cwd else [Path.cwd(), Path(__file__).resolve().parent]):
        try:
            sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=where, capture_output=True,
                                 text=True, timeout=10).stdout.strip()
            if not sha:
                continue
            # results/ holds outputs, not code: rewriting it does not make a run "dirty"
            dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--",
                                    ".", ":(exclude,top)results"],
                                   cwd=where, capture_output=True, text=True,
                                   timeout=10).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            continue
        return sha + ("-dirty" if dirty else "")
    return "unknown"


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def nccl_version_text() -> str | None:
    """The NCCL version as recorded beside results (``"2.21.5"``); None without NCCL."""
    v = nccl_version()
    return None if v is None else ".".join(map(str, v))


def environment(backend: str | None = None, world_size: int | None = None) -> dict:
    """Versions, hardware and run shape; cheap enough to call once per run on rank 0."""
    gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] \
        if torch.cuda.is_available() else []
    return {
        "git_sha": git_sha(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "nccl": nccl_version_text(),
        "gloo_available": dist.is_gloo_available(),
        "backend": backend,
        "world_size": world_size,
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        "gpu_count": len(gpus),
        "gpu_models": sorted(set(gpus)),
        "hostname_hash": hex(abs(hash(platform.node())) % (1 << 32)),
    }
