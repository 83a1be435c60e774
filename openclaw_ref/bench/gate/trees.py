"""Two commits' hook libraries side by side in one process: each commit's ``openclaw_ref/sync``
(the library ``harden()`` lives in) extracted from git and importable under a name of its own.

Why: the gate compares BASE's ``harden()`` with HEAD's in ONE job, their steps interleaved with
stock DDP's, so the host's drift between minutes (±12 % per step here) hits both commits alike
and cancels in each step's pair. One process cannot import two packages both named
``openclaw_ref.sync``; the library imports only torch and itself (``tests/test_sync_
standalone.py``), by absolute ``openclaw_ref.sync.…`` names, so a copy whose every
``openclaw_ref.sync`` is renamed to ``<alias>`` is the same code under another name. Both
sides get the same treatment (HEAD is extracted from git too, never imported from the
checkout), so the renaming cannot favour either.
"""

from __future__ import annotations

import enum
import io
import re
import shutil
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path

from openclaw_ref.sync.errors import BadInput

SYNC_PATH = "openclaw_ref/sync"  # the library inside a commit's tree
SYNC_NAME = re.compile(r"\bopenclaw_ref\.sync\b")
GIT_TIMEOUT_S = 60


class Side(enum.Enum):
    """Which commit of the comparison; its value is the arm's name in the job."""

    BASE = "base"
    HEAD = "head"

    @property
    def alias(self) -> str:
        """The importable name of this side's copy of the library."""
        return f"openclaw_gate_{self.value}"


@dataclass(frozen=True)
class Tree:
    """One side's library: the commit it came from and where its aliased copy lies."""

    side: Side
    rev: str  # as the user named it
    sha: str  # the commit it resolved to
    root: str  # the directory to put on sys.path: it holds the package ``side.alias``

    @property
    def module(self) -> str:
        return self.side.alias


def git(repo: Path, *args: str, binary: bool = False) -> str | bytes:
    """``git -C repo args``; a failure is ``BadInput`` naming git's own words."""
    out = subprocess.run(["git", "-C", str(repo), *args], capture_output=True,
                         timeout=GIT_TIMEOUT_S, text=not binary)
    if out.returncode != 0:
        err = out.stderr if isinstance(out.stderr, str) else out.stderr.decode(errors="replace")
        raise BadInput(f"git {' '.join(args)}: {err.strip() or 'failed'}")
    return out.stdout


def resolve(repo: Path, rev: str) -> str:
    """The full SHA of commit ``rev`` (a branch, tag, SHA or ``HEAD~1``)."""
    return str(git(repo, "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}")).strip()


def aliased(source: str, alias: str) -> str:
    """``source`` with every ``openclaw_ref.sync`` (imports, strings, docstrings) renamed."""
    return SYNC_NAME.sub(alias, source)


def extract(repo: Path, side: Side, rev: str, dest: Path) -> Tree:
    """Commit ``rev``'s ``openclaw_ref/sync`` as package ``side.alias`` under ``dest/<side>``
    (replaced if there); ``BadInput`` when the commit has no such library."""
    sha = resolve(repo, rev)
    archive = git(repo, "archive", "--format=tar", sha, SYNC_PATH, binary=True)
    root = dest / side.value
    if root.exists():
        shutil.rmtree(root)
    package = root / side.alias
    with tarfile.open(fileobj=io.BytesIO(bytes(archive))) as tar:
        for member in tar.getmembers():
            if not member.isfile() or not member.name.startswith(SYNC_PATH + "/"):
                continue
            target = package / member.name[len(SYNC_PATH) + 1:]
            target.parent.mkdir(parents=True, exist_ok=True)
            data = tar.extractfile(member).read()  # type: ignore[union-attr]
            if target.suffix == ".py":
                data = aliased(data.decode(), side.alias).encode()
            target.write_bytes(data)
    if not (package / "hardening.py").is_file():
        raise BadInput(f"{rev} ({sha[:12]}) has no {SYNC_PATH}/hardening.py: no harden() to "
                       "compare")
    return Tree(side, rev, sha, str(root))
