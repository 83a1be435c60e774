"""The run record of a run that stops: every rank writes what it knows before it can be killed.

Why every rank: under torchrun the agent SIGTERMs its other workers as soon as one exits non-zero,
so rank 0 — which writes the record of a finished run — may be the rank ended first. A rank
that raises, is SIGTERMed, or is ended by its watchdog writes *its part*,
``<out>.ranks/rank<R>.json`` (atomically: its losses and step times, its events, why it
stopped), and then merges every part there into ``<out>`` itself, atomically, under an
exclusive lock (``flock`` on ``<out>.ranks/.lock``). A rank writes its part before it merges,
so the last merge in lock order saw every part written before it began: ``<out>`` holds every
rank whose merge ran, and a part whose merge was cut short is still in its folder. On nodes of
their own the ranks write on their own disks: each node's ``<out>`` has the parts of its ranks.

A SIGTERM is handled on a thread of its own: the main thread may be blocked inside a collective,
where no Python signal handler runs, but the interpreter's C handler still writes the signal's
number to ``signal.set_wakeup_fd``'s pipe. That thread writes the part (with what the rank knew
then), merges, and exits 143 (128 + SIGTERM), as the signal would have. The record of a
finished run is rank 0's alone (``core/train.py``); the parts folder is then never made.
"""

from __future__ import annotations

import fcntl
import os
import signal
import threading
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from openclaw_ref.core.jsonio import read_json, write_json_atomic
from openclaw_ref.core.launch import RankContext

EXIT_SIGTERM = 128 + signal.SIGTERM
LOCK_WAIT_S = 10.0  # a SIGTERM waits this long for a write of the main thread in progress

Known = Callable[[], dict]  # what the rank knows now: its part's fields (losses, events, …)


def parts_dir(out: Path) -> Path:
    return out.with_name(out.name + ".ranks")


def part_path(out: Path, rank: int) -> Path:
    return parts_dir(out) / f"rank{rank}.json"


def merge_parts(head: dict, parts: list[dict]) -> dict:
    """The record of a stopped run from the parts of the ranks that wrote one: per step, each
    reporting rank's loss and time (None where a rank had not finished that step); the events
    of all, each (kind, step, ranks, bucket) once, the lowest rank's words kept."""
    parts = sorted(parts, key=lambda p: p["rank"])
    ranks = [p["rank"] for p in parts]
    longest = max((len(p["loss"]) for p in parts), default=0)

    def per_rank(field: str, i: int) -> list:
        return [p[field][i] if i < len(p[field]) else None for p in parts]

    events, seen = [], set()
    for part in parts:
        for event in part["events"]:
            key = (event["kind"], event["step"], tuple(event["ranks"]), event["bucket"])
            if key not in seen:
                seen.add(key)
                events.append(event)
    return {**head,
            "steps": [{"step": i, "rank_loss": per_rank("loss", i),
                       "rank_step_ms": per_rank("step_ms", i)} for i in range(longest)],
            "summary": {"stopped": True, "ranks_reporting": ranks,
                        "completed_steps": {str(p["rank"]): len(p["loss"]) for p in parts},
                        "stopped_by": {str(p["rank"]): p["reason"] for p in parts}},
            "events": events}


def _said(exc: BaseException) -> str:
    """``exc`` in one line, its class named once (a check's message begins with its class)."""
    text, kind = str(exc), type(exc).__name__
    return text if text.startswith(kind) else f"{kind}: {text}"


class StopRecord:
    """One rank's share of a stopped run's record (module docstring). ``head()``: the record's
    ``config`` and ``environment``; ``known()``: this rank's ``loss``, ``step_ms`` and
    ``events`` (as JSON) at the moment of the write."""

    def __init__(self, out: str | os.PathLike, rank: int, head: Callable[[], dict],
                 known: Known, cause: Callable[[], BaseException | None] = lambda: None) -> None:
        self.out, self.rank, self.head, self.known = Path(out), rank, head, known
        self.cause = cause  # a peer's failure this rank knows of: what a SIGTERM then says
        self._lock = threading.Lock()
        self.written: str | None = None  # the reason of the part written, once written

    def stopped(self, reason: BaseException | str) -> None:
        """Write this rank's part, then merge every part into the record; once per run (a
        later call — a SIGTERM after the error was written — changes nothing). A disk that
        refuses the write is a warning: the error that stopped the run stands."""
        text = reason if isinstance(reason, str) else _said(reason)
        if not self._lock.acquire(timeout=LOCK_WAIT_S):
            return
        try:
            if self.written is None:
                self._write(reason, text)
        except OSError as exc:
            warnings.warn(f"openclaw: rank {self.rank} could not write its part of the run "
                          f"record {self.out} ({exc})", RuntimeWarning, stacklevel=2)
        finally:
            self._lock.release()

    def _write(self, reason: BaseException | str, text: str) -> None:
        known = self.known()
        event = getattr(reason, "event", None)  # the error's own event (a check, a timeout)
        events = list(known["events"]) + ([event().to_json()] if callable(event) else [])
        write_json_atomic(part_path(self.out, self.rank),
                          {"rank": self.rank, "reason": text.splitlines()[0][:400],
                           "loss": list(known["loss"]), "step_ms": list(known["step_ms"]),
                           "events": events})
        self.written = text
        self._merge()

    def _merge(self) -> None:
        folder = parts_dir(self.out)
        with open(folder / ".lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            parts = []
            for path in sorted(folder.glob("rank*.json")):
                try:
                    parts.append(read_json(path))
                except (OSError, ValueError):
                    continue  # atomic writes: only a foreign file reads badly
            write_json_atomic(self.out, merge_parts(self.head(), parts))

    def wrap_fatal(self, fatal: Callable[[BaseException], None] | None
                   ) -> Callable[[BaseException], None]:
        """A fatal reporter (``RankContext.fatal``) that writes this rank's part first: the
        watchdog ends the process from its own thread without unwinding the main one."""
        def report(exc: BaseException) -> None:
            try:
                self.stopped(exc)
            finally:
                if fatal is not None:
                    fatal(exc)
        return report

    @contextmanager
    def armed(self, ctx: RankContext) -> Iterator[None]:
        """While inside, a SIGTERM (``on_sigterm``) or the watchdog's fatal end (``ctx.fatal``)
        writes this rank's part first."""
        fatal = ctx.fatal
        ctx.fatal = self.wrap_fatal(fatal)
        try:
            with self.on_sigterm():
                yield
        finally:
            ctx.fatal = fatal

    @contextmanager
    def on_sigterm(self) -> Iterator[None]:
        """While inside, a SIGTERM writes this rank's part before the process ends (module
        docstring). Outside the main thread (where no handler can be set) it does nothing."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        read_end, write_end = os.pipe()
        os.set_blocking(write_end, False)
        previous = signal.signal(signal.SIGTERM, lambda signum, frame: None)
        previous_fd = signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)
        thread = threading.Thread(target=self._await_sigterm, args=(read_end,),
                                  name="openclaw-sigterm", daemon=True)
        thread.start()
        try:
            yield
        finally:
            signal.set_wakeup_fd(previous_fd)
            signal.signal(signal.SIGTERM, previous)
            os.close(write_end)  # the thread reads end-of-file and leaves
            thread.join(timeout=LOCK_WAIT_S)

    def _cause(self) -> BaseException | None:
        try:
            return self.cause()
        except Exception:  # noqa: BLE001 - the record is written whatever the strategy says
            return None

    def _await_sigterm(self, read_end: int) -> None:
        try:
            while True:
                got = os.read(read_end, 64)
                if not got:
                    return
                if signal.SIGTERM in got:
                    break
        finally:
            os.close(read_end)
        try:
            self.stopped(self._cause() or "SIGTERM: ended from outside (torchrun's agent ends "
                         "a job's other workers when one fails)")
        finally:
            os._exit(EXIT_SIGTERM)
