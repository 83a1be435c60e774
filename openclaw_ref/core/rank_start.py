"""How the launcher starts rank processes: forked from a server that imported torch once.

Why: a spawned rank is a fresh interpreter that imports torch (~1 s of a core here) before it
can join its group, and a pool is started by every ``launch()`` and CLI run and again after
every failure it reports (each fault case of a matrix). ``multiprocessing``'s ``forkserver``
pays the imports once per parent process: the server is itself a fresh interpreter (so it
forks with no threads, no process group, no CUDA context — what makes ``fork`` unsafe), it
imports ``PRELOAD``, and each rank is a fork of it.

Invariants a rank relies on, the same as under ``spawn``:
  - the rank runs in the parent's environment and writes to the parent's stdout and stderr
    *as of its start*: the server's are the parent's when the server started, so the
    parent's current ones travel with the rank (``StartEnvironment``) and replace the
    inherited ones before anything reads or writes them;
  - it dies with its parent: the server exits when the parent's end of its pipe closes, and
    each rank dies with the server (``PR_SET_PDEATHSIG``, set by the rank);
  - the modules in ``PRELOAD`` (and what they import) are as they were on disk when the
    server started, like the parent's own; a task's other modules are read when it arrives.
Elsewhere than Linux, and where ``forkserver`` is missing, ranks are spawned.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import sys
from multiprocessing import reduction

# What a rank imports before its task arrives, whatever the task: torch and the launcher's own
# rank side. A task's own modules (a test's, a user's model) are imported by the rank itself.
PRELOAD = ("torch", "torch.distributed", "torch.nn.parallel", "openclaw_ref.core.launch")
STREAMS = (1, 2)  # stdout, stderr


def rank_context() -> mp.context.BaseContext:
    """The multiprocessing context ranks start from (module docstring)."""
    if not sys.platform.startswith("linux") or "forkserver" not in mp.get_all_start_methods():
        return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(list(PRELOAD))  # read once, when the server starts
    return ctx


class StartEnvironment:
    """The parent's environment and standard streams when it started a rank, put in place first
    thing in the rank: what a spawned rank would have inherited. The streams travel as file
    descriptors (``multiprocessing.reduction.DupFd``, the way a ``Connection`` travels), so a
    rank's output lands where the parent's output goes now — a test's capture, a CLI's
    terminal — not where it went when the server started. A closed stream stays behind."""

    def __init__(self, variables: dict[str, str] | None = None,
                 streams: tuple[tuple[int, int], ...] = ()) -> None:
        self.variables = dict(os.environ) if variables is None else variables
        self.streams = streams  # (stream, the rank's copy of the parent's), once shipped

    def __reduce__(self) -> tuple:
        shipped = tuple((fd, reduction.DupFd(fd)) for fd in STREAMS if _is_open(fd))
        return _arrived, (self.variables, shipped)

    def apply(self) -> None:
        """In the rank, before anything reads the environment or writes output."""
        os.environ.clear()
        os.environ.update(self.variables)
        sys.stdout.flush()
        sys.stderr.flush()
        for target, fd in self.streams:
            os.dup2(fd, target)
            os.close(fd)
        self.streams = ()


def _arrived(variables: dict[str, str], shipped: tuple) -> StartEnvironment:
    return StartEnvironment(variables, tuple((target, fd.detach()) for target, fd in shipped))


def _is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True
