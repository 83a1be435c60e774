"""The calibration's scratch commits, each one real commit on top of the calibrated one:
a comment-only change (identical code), or a busy-wait planted in ``harden()``'s per-step path.

Where the busy-wait goes: ``StepGuard._settle``, right after its early return when no step is
pending — the step guard's verdict, run once per step after DDP's finalize, when no collective
is in flight to hide it behind. Not at the top of ``_settle``: torch's global optimizer-step
pre-hook calls every guard's ``_settle`` inside every arm's ``opt.step()``, so a wait there
would slow stock DDP's steps too and cancel in the pairs.

The commits are made with git's plumbing (no checkout, no worktree touched), with a fixed
author and date so the same parent and change give the same SHA on a resumed run, and each is
held by a ref under ``refs/heads/gate-calibrate/`` that ``remove_refs`` deletes afterwards
(the caller's own refs, by name).
"""

from __future__ import annotations

import ast
import enum
import os
import subprocess
import tempfile
from collections.abc import Iterable
from pathlib import Path

from openclaw_ref.sync.errors import BadInput

PLANT_PATH = "openclaw_ref/sync/ddp/step_guard.py"
PLANT_CLASS, PLANT_METHOD = "StepGuard", "_settle"
REF_PREFIX = "refs/heads/gate-calibrate/"
COMMENT = "# gate calibration: a comment-only change, the code is identical\n"
FIXED_ENV = {"GIT_AUTHOR_NAME": "gate-calibrate", "GIT_AUTHOR_EMAIL": "gate@calibrate.invalid",
             "GIT_COMMITTER_NAME": "gate-calibrate",
             "GIT_COMMITTER_EMAIL": "gate@calibrate.invalid",
             "GIT_AUTHOR_DATE": "2000-01-01T00:00:00Z",
             "GIT_COMMITTER_DATE": "2000-01-01T00:00:00Z"}


class Change(enum.Enum):
    """What a scratch commit changes."""

    COMMENT = "comment"  # one comment line appended: the library's code is identical
    BUSY_WAIT = "busy-wait"  # a fixed number of µs of spinning per step in the guard


def run_git(repo: Path, *args: str, stdin: str | None = None,
            env: dict[str, str] | None = None, strip: bool = True) -> str:
    """``git -C repo args`` (stdout, stripped unless told); a failure is ``BadInput``."""
    out = subprocess.run(["git", "-C", str(repo), *args], input=stdin, capture_output=True,
                         text=True, timeout=60, env={**os.environ, **(env or {})})
    if out.returncode != 0:
        raise BadInput(f"git {' '.join(args)}: {out.stderr.strip() or 'failed'}")
    return out.stdout.strip() if strip else out.stdout


def with_comment(source: str) -> str:
    """``source`` with ``COMMENT`` appended (no line of code moves)."""
    return source + ("" if source.endswith("\n") else "\n") + COMMENT


def with_busy_wait(source: str, microseconds: int) -> str:
    """``source`` (``PLANT_PATH``) with a ``microseconds`` spin inserted in ``StepGuard._settle``
    after its early return (module docstring); ``BadInput`` if that place is not found."""
    tree = ast.parse(source)
    if not any(isinstance(n, ast.Import) and any(a.name == "time" and a.asname is None
                                                  for a in n.names) for n in tree.body):
        raise BadInput(f"{PLANT_PATH} no longer imports time: update plant.with_busy_wait")
    method = next((f for c in tree.body if isinstance(c, ast.ClassDef) and c.name == PLANT_CLASS
                   for f in c.body if isinstance(f, ast.FunctionDef)
                   and f.name == PLANT_METHOD), None)
    early = None if method is None else next(
        (i for i, s in enumerate(method.body) if isinstance(s, ast.If)
         and "_pending" in ast.unparse(s.test) and isinstance(s.body[0], ast.Return)), None)
    if method is None or early is None or early + 1 >= len(method.body):
        raise BadInput(f"{PLANT_CLASS}.{PLANT_METHOD} in {PLANT_PATH} has no early return on "
                       "'nothing pending' to plant after: update plant.with_busy_wait")
    at = method.body[early + 1]
    pad = " " * at.col_offset
    spin = [f"{pad}_until = time.perf_counter() + {microseconds} * 1e-6  # planted: gate "
            "calibration\n", f"{pad}while time.perf_counter() < _until:\n", f"{pad}    pass\n"]
    lines = source.splitlines(keepends=True)
    return "".join(lines[:at.lineno - 1] + spin + lines[at.lineno - 1:])


def changed_source(source: str, change: Change, microseconds: int = 0) -> str:
    if change is Change.COMMENT:
        return with_comment(source)
    return with_busy_wait(source, microseconds)


def scratch_commit(repo: Path, parent: str, change: Change, name: str,
                   microseconds: int = 0) -> str:
    """A commit on ``parent`` changing ``PLANT_PATH`` only, held by ``REF_PREFIX + name``; its
    SHA (the same for the same parent and change)."""
    parent = run_git(repo, "rev-parse", "--verify", f"{parent}^{{commit}}")
    mode = run_git(repo, "ls-tree", parent, PLANT_PATH).split(" ", 1)[0]
    if not mode:
        raise BadInput(f"{parent[:12]} has no {PLANT_PATH}")
    source = run_git(repo, "show", f"{parent}:{PLANT_PATH}", strip=False)
    blob = run_git(repo, "hash-object", "-w", "--stdin",
                   stdin=changed_source(source, change, microseconds))
    with tempfile.TemporaryDirectory(prefix="gate-index-") as tmp:
        index = {"GIT_INDEX_FILE": str(Path(tmp) / "index")}
        run_git(repo, "read-tree", parent, env=index)
        run_git(repo, "update-index", "--cacheinfo", f"{mode},{blob},{PLANT_PATH}", env=index)
        tree = run_git(repo, "write-tree", env=index)
    what = "a comment only" if change is Change.COMMENT else f"a {microseconds} µs busy-wait"
    sha = run_git(repo, "commit-tree", tree, "-p", parent, "-m",
                  f"gate calibration (scratch, removed afterwards): {what} in {PLANT_PATH}",
                  env=FIXED_ENV)
    run_git(repo, "update-ref", REF_PREFIX + name, sha)
    return sha


def remove_refs(repo: Path, names: Iterable[str]) -> list[str]:
    """Delete the refs ``REF_PREFIX + name`` that exist (their commits become unreachable, for
    git gc to prune) — only these: another calibration or test may hold refs of its own; the
    refs deleted."""
    held = set(run_git(repo, "for-each-ref", "--format=%(refname)", REF_PREFIX).splitlines())
    gone = [REF_PREFIX + n for n in dict.fromkeys(names) if REF_PREFIX + n in held]
    for ref in gone:
        run_git(repo, "update-ref", "-d", ref)
    return gone
