"""Helpers the test modules share: a short training run and its record on a rank, the smallest
benchmark settings, the CLI run as a user runs it, and a collected test as the conformance
plugin sees it.

Imported as ``tests.helpers`` (the repository root is on ``sys.path``: pytest puts the root
``conftest.py``'s directory there, and pool workers inherit the path). Rank functions live in a
module every worker can import, so ``RankPool.run`` can ship them.
"""

from __future__ import annotations

import ast
import builtins
import dataclasses
import os
import socket
import subprocess
import sys
from collections.abc import Mapping
from datetime import timedelta
from pathlib import Path

import torch.distributed as dist

from openclaw_ref.arms.config import ArmConfig
from openclaw_ref.bench.settings import BenchSettings
from openclaw_ref.core.launch import loopback_listener
from openclaw_ref.core.train import TrainConfig, train_model
from openclaw_ref.sync.base import SyncConfig

ROOT = Path(__file__).resolve().parents[1]
TINY_BENCH = BenchSettings(preset="tiny", steps=3, global_batch=8, raw_iters=2, rounds=1,
                           max_world=2)  # a benchmark job in seconds: tiny preset, <= 2 ranks


def record_of(ctx, cfg: TrainConfig) -> dict | None:
    """A rank task: train ``cfg``; the run record on rank 0, None elsewhere."""
    return train_model(ctx, cfg).record


def train_cfg(world_size: int, sync: SyncConfig | None = None, **kw) -> TrainConfig:
    """A quiet 10-step run of the tiny preset on global batch 16, no evaluation until the end;
    ``kw`` overrides any field."""
    base = TrainConfig(world_size=world_size, steps=10, global_batch=16, progress=False,
                       eval_every=0, sync=sync or ArmConfig())
    return dataclasses.replace(base, **kw)


def run_cli(*args: str, timeout: float = 180, launcher: tuple[str, ...] | None = None,
            env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess:
    """``python -m openclaw_ref ARGS`` (or ``launcher`` + ARGS) from the repository root, output
    captured; ``env`` replaces this process's environment (unbuffered output either way)."""
    cmd = list(launcher or (sys.executable, "-m", "openclaw_ref")) + list(args)
    full_env = dict(os.environ if env is None else env, PYTHONUNBUFFERED="1")
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT,
                          env=full_env)


def free_port() -> int:
    """A loopback port nothing listens on now (the OS's pick), for a launcher's rendezvous."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def exception_classes_of(path: Path) -> set[str]:
    """Every class defined in the module at ``path`` that derives, directly or through
    another class of the module, from a built-in exception (read from the source: nothing
    imported)."""
    bases = {node.name: [b.id for b in node.bases if isinstance(b, ast.Name)]
             for node in ast.parse(path.read_text()).body if isinstance(node, ast.ClassDef)}

    def is_exception(name: str) -> bool:
        return any(_builtin_exception(b) or (b in bases and is_exception(b))
                   for b in bases.get(name, []))

    return {name for name in bases if is_exception(name)}


def _builtin_exception(name: str) -> bool:
    value = getattr(builtins, name, None)
    return isinstance(value, type) and issubclass(value, BaseException)


def partial_run(base: Mapping, sections: tuple[str, ...], git_sha: str) -> dict:
    """What ``run_compare`` returns for a partial ``compare --sections`` run at ``base``'s
    settings and hardware on commit ``git_sha``: ``base``'s figures of ``sections`` (a rerun
    that measured the same), its own environment and run metadata."""
    import copy

    meta = base["meta"]
    env = {**meta["environment"], "git_sha": git_sha, "date": "2026-12-03T00:00:00+00:00"}
    config = {**meta["compare_config"], "sections": list(sections)}
    return {"schema_version": base["schema_version"], "doctor": copy.deepcopy(base["doctor"]),
            "meta": {"environment": env, "compare_config": config,
                     "placements": copy.deepcopy(meta.get("placements", [])),
                     "sections_run": [{"name": s, "seconds": 1.5} for s in sections],
                     "sections_skipped": {}, "wall_s": 2.0},
            **{s: copy.deepcopy(base[s]) for s in sections}}


def loopback_store(timeout_s: float = 10.0) -> dist.TCPStore:
    """A one-process ``TCPStore`` server listening on 127.0.0.1 only, as the launcher's is:
    torch's own would listen on every interface, and outlive its test in this process."""
    listener = loopback_listener("127.0.0.1")
    return dist.TCPStore("127.0.0.1", listener.getsockname()[1], 1, True,
                         timeout=timedelta(seconds=timeout_s), wait_for_workers=False,
                         master_listen_fd=listener.detach())


class MarkedItem:
    """A collected test as the conformance plugin reads it: its markers, and the markers (a
    skip) the plugin adds to it."""

    def __init__(self, *markers: str) -> None:
        self.markers, self.added = set(markers), []

    def get_closest_marker(self, name):
        return object() if name in self.markers else None

    def add_marker(self, marker):
        self.added.append(marker)
