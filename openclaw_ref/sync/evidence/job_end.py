"""A failed job ends on every rank: the note a failing rank leaves in the store, and the rule by
which each other rank's watchdog then ends its own process within its deadline — never an
orphan that only an outside kill ends.

Why the ranks need it: a rank whose peer failed is often in no collective that would fail with
it — it sleeps, saves, evaluates, or waits in a user's code — and torchrun's agent stops only the
workers of its own node. When the failed rank's agent hosted the store, the store goes too, and
the survivor's watchdog can no longer read anything at all.

Two facts end a rank (``JobEnd.verdict``; the watchdog acts on it under ``RAISE`` and ``EXIT``,
``REPORT`` only records):
  * a peer's *failure note* under ``<namespace>/failed``: its global rank, the error's class,
    exit code and step, the ranks it blames, and its first line — one ``|``-separated string
    (nothing is unpickled), the first writer's kept (``compare_set``). Seen, it ends this rank
    after ``grace_s``: a rank raising the same error itself (every rank raises a check at the
    same step) leaves through its own error, its record written, before that;
  * the store's host gone: the store has failed with nothing but connection errors
    (``DistNetworkError``) for ``deadline_s``. A slow or flaky store raises other errors (a
    timeout) and only blinds the watchdog.
A rank that read a peer's note but is ended from outside during its grace (torchrun's
agent, once the writer's node is gone) records the peer's failure all the same (``known``);
a writer ended from outside while it waits (below) records its own.
So that it has read it: a rank knowing the job failed (it read the note, or failed itself)
says so under ``<namespace>/failed/knows/<rank>``, and a writer about to end its process waits
for every peer's word (``await_peers``, at most ``wait_s``) first — an agent ends the others
only once the writer has exited, so a peer whose watchdog still ticks reads the note before.
A dead or blind peer costs the failing rank ``wait_s`` once. A writer whose process goes on (a
rank of a reused pool, which runs the next task) never waits: its peers would start that task
without it.
The note lives in the watchdog's namespace (one per construction), so a note left by an
earlier task on a reused rank pool is never read as this one's. Cost: one store ``check`` per
tick, on the watchdog's thread.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta

import torch.distributed as dist

from openclaw_ref.sync.errors import EXIT_FAILURE, JobFailed

SEP = "|"
VERSION = "1"
MESSAGE_CHARS = 240
GONE = getattr(dist, "DistNetworkError", ConnectionError)  # torch < 2.2: no such class


def exit_fatal(exc: BaseException) -> None:
    """How a fatal diagnosis ends the process outside the launcher (a user's own torchrun
    script): its words on stderr, then ``os._exit`` with the error's exit code."""
    sys.stderr.write(f"openclaw watchdog: {exc}\n")
    sys.stderr.flush()
    os._exit(getattr(exc, "exit_code", 1))


def failure_key(namespace: str) -> str:
    return f"{namespace}/failed"


def knows_key(namespace: str, rank: int) -> str:
    """Where ``rank`` (global) says it knows the job failed."""
    return f"{failure_key(namespace)}/knows/{rank}"


@dataclass(frozen=True)
class FailureNote:
    """What a failing rank says of its failure, in the store."""

    rank: int  # global
    kind: str  # the error's class
    exit_code: int
    step: int | None
    ranks: tuple[int, ...]  # the ranks its error blames (global)
    message: str  # its first line

    @classmethod
    def of(cls, rank: int, exc: BaseException) -> FailureNote:
        code, step = getattr(exc, "exit_code", EXIT_FAILURE), getattr(exc, "step", None)
        ranks = getattr(exc, "ranks", None) or ()
        first = (str(exc).strip().splitlines() or [""])[0][:MESSAGE_CHARS]
        return cls(rank, type(exc).__name__, code if isinstance(code, int) else EXIT_FAILURE,
                   step if isinstance(step, int) else None, tuple(int(r) for r in ranks), first)

    def encode(self) -> str:
        step = "" if self.step is None else str(self.step)
        return SEP.join((VERSION, str(self.rank), self.kind, str(self.exit_code), step,
                         ",".join(str(r) for r in self.ranks), self.message))

    @classmethod
    def decode(cls, raw: bytes) -> FailureNote | None:
        """The note, or None for anything that is not one of ours."""
        try:
            version, rank, kind, code, step, ranks, message = raw.decode().split(SEP, 6)
            if version != VERSION:
                return None
            return cls(int(rank), kind, int(code), int(step) if step else None,
                       tuple(int(r) for r in ranks.split(",") if r), message)
        except ValueError:
            return None


class JobEnd:
    """One rank's account of whether the job has failed elsewhere (module docstring). Times
    are passed in, never read, so tests drive every order without sleeping."""

    def __init__(self, rank: int, namespace: str, deadline_s: float, grace_s: float,
                 peers: Sequence[int] = (), wait_s: float = 0.0) -> None:
        self.rank, self.namespace, self.key = rank, namespace, failure_key(namespace)
        self.deadline_s, self.grace_s = deadline_s, grace_s
        self.peers, self.wait_s = tuple(peers), wait_s  # global ranks; the writer's wait
        self.own: BaseException | None = None  # this rank failed itself: its own error ends it
        self.note: FailureNote | None = None
        self._seen_at = 0.0
        self._gone_since: float | None = None
        self._gone_error = ""

    def declare(self, store: dist.Store, exc: BaseException) -> None:
        """This rank fails with ``exc``: leave the note unless a peer's is there first. Never
        raises (the store may be what failed)."""
        if self.own is not None:
            return
        self.own = exc
        try:
            store.compare_set(self.key, "", FailureNote.of(self.rank, exc).encode())
            self.acknowledge(store)  # a peer failing too need not wait for this rank's word
        except Exception:  # noqa: BLE001 - a note is a courtesy; the error stands without it
            pass

    def acknowledge(self, store: dist.Store) -> None:
        """Say this rank knows the job failed (store errors propagate)."""
        store.set(knows_key(self.namespace, self.rank), "1")

    def await_peers(self, store: dist.Store) -> list[int]:
        """Before this rank ends its process: block until every peer has said it knows the job
        failed, or ``wait_s`` passed; the peers that had not (all of them if the store failed).
        A store ``wait`` with a deadline, no polling, on the caller's connection: from the
        training thread it holds the watchdog's heartbeat for at most ``wait_s``, which the
        watchdog keeps under the deadline after which a peer calls a rank silent. Never
        raises."""
        keys = [knows_key(self.namespace, r) for r in self.peers]
        if not keys or self.wait_s <= 0:
            return []
        try:
            store.wait(keys, timedelta(seconds=self.wait_s))
            return []
        except Exception:  # noqa: BLE001 - past the wait (or the store failed): exit anyway
            try:
                return [r for r, key in zip(self.peers, keys, strict=True)
                        if not store.check([key])]
            except Exception:  # noqa: BLE001
                return list(self.peers)

    def read(self, store: dist.Store) -> FailureNote | None:
        """The note in the store, if any (store errors propagate: the caller counts them)."""
        if not store.check([self.key]):
            return None
        return FailureNote.decode(store.get(self.key))

    def saw(self, note: FailureNote | None, now: float) -> bool:
        """Keep a peer's note, the first one seen: True when this one is kept (the caller
        then ``acknowledge``s it)."""
        if note is not None and note.rank != self.rank and self.note is None:
            self.note, self._seen_at = note, now
            return True
        return False

    def store_failed(self, exc: BaseException, now: float) -> None:
        if isinstance(exc, GONE):
            if self._gone_since is None:
                self._gone_since = now
            self._gone_error = f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0]}"
        else:
            self._gone_since = None

    def store_answered(self) -> None:
        self._gone_since = None

    def known(self) -> BaseException | None:
        """The failure this rank knows ended the job, whatever the grace — what a rank ended
        from outside should say: its own once declared (SIGTERMed while it waits for its
        peers' word), else the peer's it has read (``peers_failure``); or None."""
        return self.own if self.own is not None else self.peers_failure()

    def peers_failure(self) -> JobFailed | None:
        """The peer's failure this rank has read, as the error it would end with, or None."""
        note = self.note
        if note is None:
            return None
        blames = f"blaming ranks {list(note.ranks)}" if note.ranks else "blaming no rank"
        return JobFailed(f"rank {note.rank} failed with {note.kind} ({blames}): "
                         f"{note.message}; rank {self.rank} ends too", rank=note.rank,
                         ranks=list(note.ranks), step=note.step, exit_code=note.exit_code)

    def verdict(self, now: float) -> JobFailed | None:
        """Why this rank must end now, or None."""
        if self.own is not None:
            return None
        if self.note is not None and now - self._seen_at >= self.grace_s:
            return self.peers_failure()
        if self._gone_since is not None and now - self._gone_since >= self.deadline_s:
            return JobFailed(f"the job's store has not answered for {now - self._gone_since:.1f} "
                             f"s ({self._gone_error}): its host (the launcher, or the torchrun "
                             f"agent that hosts the rendezvous) is gone, so the job has failed; "
                             f"rank {self.rank} ends too")
        return None
