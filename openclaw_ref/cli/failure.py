"""The one place that words the CLI's failure: its first line, and what may follow it.

Invariants:
  * one first line, ``openclaw-bench: <what>``. A consistency check (exit 3) or a hang/deadline
    (exit 4) is worded by the error itself (``ConsistencyError``/``SyncTimeout`` render their
    own message: the check, the step, the ranks *it blames*; so does ``JobFailed``, a rank
    that ended because a peer failed: that peer, its error, the ranks it blames) — never
    "rank N failed", where N is only the rank whose report reached the launcher first
    (``triage``: every rank raises the same consistency error). Anything else (exit 1) names
    the failed rank, as the launcher decided (``triage``);
  * tracebacks and the stack dumps of a deadline only with ``--verbose`` (dumps one rank after
    the other, never interleaved); without it the folder of the dumps is printed instead;
  * under torchrun one rank prints: the first to claim the line in the job's store (every rank
    that fails tries; the others stay silent), or rank 0 where the store cannot be reached.
"""

from __future__ import annotations

import datetime
import os
import sys
from pathlib import Path
from typing import TextIO

from openclaw_ref.core.errors import LaunchTimeout, RankFailed, exit_code_for
from openclaw_ref.sync.errors import (
    BadInput,
    ConsistencyError,
    JobFailed,
    OpenClawError,
    SyncTimeout,
)

PROG = "openclaw-bench"
LINE_KEY = "openclaw/cli/failure-line"  # the store counter torchrun ranks claim the line with
CLAIM_TIMEOUT_S = 5.0


def blamed(exc: OpenClawError) -> OpenClawError:
    """The error that words the failure: a rank's consistency error or timeout itself (it names
    the ranks at fault), else ``exc``."""
    cause = exc.cause if isinstance(exc, RankFailed) else None
    return cause if isinstance(cause, ConsistencyError | SyncTimeout | JobFailed) else exc


def failure_line(exc: OpenClawError) -> str:
    """The first line of a failed command (module docstring)."""
    if isinstance(exc, BadInput):
        return f"{PROG}: error: {exc}"
    return f"{PROG}: {blamed(exc)}"


def details(exc: OpenClawError, verbose: bool) -> str:
    """What follows the first line: the traceback and stack dumps with ``verbose``, else where
    the dumps are (nothing when there are none)."""
    stacks = exc.stacks_dir if isinstance(exc, LaunchTimeout) else None
    if not verbose:
        return f"{PROG}: stacks of the unfinished ranks: {stacks}\n" if stacks else ""
    parts = [exc.traceback_text] if isinstance(exc, RankFailed) and exc.traceback_text else []
    for path in sorted(Path(stacks).glob("rank*.txt")) if stacks else ():
        parts.append(f"--- {path.stem} stacks ---\n{path.read_text(errors='replace')}")
    return "".join(p if p.endswith("\n") else p + "\n" for p in parts)


def claims_the_line() -> bool:
    """Does this process print the failure? Always, unless it is one rank of a torchrun job:
    then the first of the job's ranks to ask (module docstring)."""
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        return True
    try:
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            raise RuntimeError("no process group")
        store = dist.distributed_c10d._get_default_store()
        store.set_timeout(datetime.timedelta(seconds=CLAIM_TIMEOUT_S))
        return store.add(LINE_KEY, 1) == 1
    except Exception:  # no store to agree through: rank 0 speaks
        return os.environ["RANK"] == "0"


def report_failure(exc: OpenClawError, *, verbose: bool, err: TextIO | None = None) -> int:
    """Write the failure (module docstring) and return its exit code."""
    err = err if err is not None else sys.stderr
    if claims_the_line():
        err.write(failure_line(exc) + "\n" + details(exc, verbose))
    return exit_code_for(exc)
