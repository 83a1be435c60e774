"""How a spawned rank process speaks to its parent and leaves: it dies with the parent, sends
its messages over its pipe (from any thread: the main one and a watchdog's may both report), and
on a fatal error writes its last words and exits without unwinding (its process group may be
wedged in a collective). The launcher's pool (``launch.RankPool``) is the other end of the pipe.

Messages to the parent: ``("ready",)``, ``("ok", result)``, and ``("error", summary, traceback,
cause)`` where ``cause`` is the exception itself when it survives pickling, else None.

Stacks on request: SIGUSR1 makes a rank write every thread's stack to its own file
(``stacks_file``) in a folder the parent chose, never to the stderr the ranks share, so two
ranks' dumps never interleave; the parent decides whether anyone sees them.
"""

from __future__ import annotations

import ctypes
import faulthandler
import multiprocessing.connection as mpc
import os
import pickle
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable


def die_with_parent() -> None:
    """The kernel kills this process when its parent dies (Linux; elsewhere a no-op)."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        except OSError:
            pass


_STACK_FILES: list = []  # kept open: faulthandler writes to the descriptor from a signal handler


def stacks_file(stacks_dir: str, rank: int) -> str:
    """Where ``rank`` writes its stacks when asked."""
    return os.path.join(stacks_dir, f"rank{rank}.txt")


def register_stack_dump(stacks_dir: str, rank: int) -> None:
    """SIGUSR1 dumps every thread's stack into this rank's own file (module docstring); a
    fatal signal's dump still goes to stderr."""
    faulthandler.enable()
    f = open(stacks_file(stacks_dir, rank), "w")  # noqa: SIM115 - lives as long as the process
    _STACK_FILES.append(f)
    faulthandler.register(signal.SIGUSR1, file=f, all_threads=True)


def request_stacks(pids: list[int]) -> None:
    """Ask the ranks ``pids`` for their stacks, and give them half a second to write them."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGUSR1)
        except ProcessLookupError:
            pass
    time.sleep(0.5)


def send(conn: mpc.Connection, message: tuple, lock: threading.Lock | None = None) -> None:
    """One message to the parent; under ``lock`` when more than one thread may send."""
    if lock is None:
        conn.send(message)
        return
    with lock:  # the main thread and a watchdog thread may both report
        conn.send(message)


def exit_with(exc: BaseException) -> None:
    """Last words on stderr, then leave without unwinding (the group may be wedged)."""
    code = getattr(exc, "exit_code", 1)
    try:
        sys.stderr.write(f"fatal: {type(exc).__name__}: {exc}\n")
        sys.stderr.flush()
    finally:
        os._exit(code if isinstance(code, int) else 1)


def _portable(exc: BaseException) -> BaseException | None:
    """``exc`` itself when it survives pickling (the parent re-raises it as the cause)."""
    try:
        return pickle.loads(pickle.dumps(exc))
    except Exception:  # an exception that cannot travel still sends its text
        return None


def failure_message(exc: BaseException, stack: str | None = None) -> tuple:
    """The ``error`` message for ``exc``, with ``stack`` or else the traceback being handled."""
    text = traceback.format_exc() if stack is None else stack
    return ("error", f"{type(exc).__name__}: {exc}", text, _portable(exc))


def fatal_reporter(conn: mpc.Connection, lock: threading.Lock) -> Callable[[BaseException], None]:
    """How any thread of the rank reports a fatal error: send it, then ``exit_with`` it."""
    def report(exc: BaseException) -> None:
        try:
            send(conn, failure_message(exc, "".join(traceback.format_stack())), lock)
        finally:
            exit_with(exc)
    return report
