"""Hangs become diagnoses: a per-rank watchdog thread that says which ranks a waiting collective
waits for and what each of them is doing — and never kills a healthy job unless told to.

The hot path hands the watchdog each bucket's ``Work`` (``issued``: a dict entry under an
uncontended lock, no I/O); the main thread drops a step's entries once it has waited on them
(``settled``). A background thread, every ``tick_s``:
  1. publishes this rank's *beat* to the c10d store under ``<namespace>/<rank>``: the latest
     (step, bucket) it issued, the last step it settled, whether a watched collective is in
     flight, and a counter that grows every tick (the heartbeat);
  2. polls every in-flight ``Work`` with ``is_completed()`` and forgets the finished ones;
  3. once the oldest (the *head*: the backend runs a rank's collectives in issue order, so the
     others queue behind it) has waited longer than ``deadline_s`` — counted from its issue, or
     from the tick that saw the one ahead of it complete, so a bucket queued behind a late
     rank's collective is not reported again, as "slow", once that rank arrives — reads the
     published beats, names the ranks behind its (step, bucket) and says of each whether it
     is *alive* (its counter moves: between steps, saving, evaluating) or *silent* (no new
     beat for a whole deadline: frozen, dead or cut off), then acts (``base.WatchdogAction``):
     ``EXIT`` ends the process through ``on_timeout``; ``RAISE`` and ``REPORT`` record the
     diagnosis in ``events`` and warn, once per collective and again if a late rank turns
     silent; under ``RAISE`` the training thread's next ``check()`` raises it when the
     collective failed or still waits on a silent rank.

Why poll the ``Work``: NCCL marks a collective's future done when its kernel is *enqueued*;
``Work.is_completed()`` asks the backend whether it has finished (NCCL: its CUDA event; gloo: the
work ran). One mechanism for both, so the CPU tests exercise the logic a GPU job runs.

Why ``RAISE`` waits for ``check()``: the training thread is blocked inside the backend's wait,
which no other thread can interrupt (gloo's ``abort()`` does not wake it); it regains control when
the collective completes (nothing to raise: the late rank arrived) or fails at the process
group's ``timeout`` (the diagnosis is raised instead of the bare backend error).

The store is the watchdog's only link to its peers, through its own client connection
(``store.clone()``: a training thread blocked in a store ``wait`` would otherwise hold up the
heartbeat, and the rank would look frozen). An error there never ends the thread: the
operation is retried with a doubling back-off (up to ``MAX_BACKOFF_S``) and an event says, once,
that the watchdog cannot see its peers (and, once, that it can again). Deadlines on this rank's
own collectives are still noticed meanwhile, with the late ranks unknown.

A failed job ends everywhere (``job_end.py``): a rank that raises a diagnosis or exits on one
leaves a failure note in the store (and, before its process ends, waits a bounded while for
the peers' word that they read it); every tick reads the peers' note; a note seen, or a store
whose host is gone, ends this process within the deadline (``RAISE``, ``EXIT``). So does an
overdue FSDP2 collective its guard can explain (``outside_work.py``).

Progress is compared as (step, bucket) tuples because every rank issues buckets in increasing
index order within a step (the step guard watches one collective per step, its exchange, as
bucket ``STEP_EXCHANGE``); a rank that arrives within a tick of the deadline completes the
collective and is never named. Not watched: DDP's own collectives (the bucket-rebuild and buffer
broadcasts in the forward, the unused-parameter map) and ``join()``'s shadow allreduces — a rank
waiting there is seen only at its next bucket.
"""

from __future__ import annotations

import threading
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch.distributed as dist

from openclaw_ref.sync.base import WatchdogAction
from openclaw_ref.sync.errors import Event, SyncTimeout
from openclaw_ref.sync.evidence.heartbeat import (
    LATE_KEY,
    NOT_STARTED,
    STEP_EXCHANGE,
    Beat,
    Late,
    Progress,
    what,
)
from openclaw_ref.sync.evidence.job_end import JobEnd, exit_fatal
from openclaw_ref.sync.evidence.outside_work import OutsideWork

MAX_BACKOFF_S = 10.0
BLIND = "WatchdogBlind"  # Event kind: the store cannot be read or written
SIGHTED = "WatchdogSighted"  # Event kind: it can again


def _own_connection(store: dist.Store) -> dist.Store:
    """A client of its own where the store can make one (TCPStore and its prefixes): a store
    client serves one operation at a time, and a training thread blocked in a store ``wait``
    must not stop this rank's heartbeat. Otherwise ``store`` itself."""
    try:
        return store.clone()
    except Exception:
        return store


def _succeeded(work) -> bool:
    """Whether ``work`` completed without an error (a failed one raises from its future)."""
    if not work.is_completed():
        return False
    try:
        work.get_future().value()
    except Exception:
        return False
    return True


@dataclass
class Verdict:
    """The diagnosis of one overdue collective, pending for the training thread (``RAISE``)."""

    key: Progress
    work: object
    error: SyncTimeout
    silent: bool  # some late rank is silent: the collective will not complete by itself
    raised: bool = False


class Watchdog:
    """See the module docstring. ``close()`` stops the thread (never blocks on other ranks)."""

    def __init__(self, store: dist.Store, rank: int, world_size: int, deadline_s: float,
                 namespace: str, on_timeout: Callable[[BaseException], None] = exit_fatal,
                 tick_s: float | None = None, global_ranks: Sequence[int] | None = None, *,
                 action: WatchdogAction = WatchdogAction.RAISE,
                 events: list[Event] | None = None) -> None:
        self.store = _own_connection(store)
        # ``rank``/``world_size`` are within the watched group; errors name global ranks
        self.global_ranks = list(global_ranks if global_ranks is not None else range(world_size))
        self.rank = rank
        self.world_size = world_size
        self.deadline_s = deadline_s
        self.namespace = namespace
        self.on_timeout = on_timeout  # how EXIT ends the process
        self.action = action
        self.events: list[Event] = events if events is not None else []
        self.tick_s = tick_s if tick_s is not None else max(0.02, min(1.0, deadline_s / 5))
        self._progress: Progress = NOT_STARTED
        self._settled = -1
        self._count = 0
        self._inflight: dict[Progress, tuple[float, object]] = {}  # -> (issued at, Work)
        self._head: tuple[Progress, float] | None = None  # the oldest in flight, waiting since
        self._last_tick = 0.0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._late: dict[int, Late] = {}  # of the current overdue collective
        self._episode: Progress | None = None
        self._told_silent: set[int] = set()
        self._reported = False  # the current overdue collective's diagnosis was recorded
        self._verdict: Verdict | None = None
        self._failures = 0
        self._retry_at = 0.0
        self.blind = False  # the store failed and has not answered since
        self.fired: SyncTimeout | None = None  # the latest diagnosis
        peers = [g for i, g in enumerate(self.global_ranks) if i != rank]
        self.job = JobEnd(self.global_ranks[rank], namespace, deadline_s, deadline_s / 2,
                          peers, wait_s=min(deadline_s / 2, 3 * self.tick_s))
        self.outside = OutsideWork()  # FSDP2's collectives, judged by their guard's evidence
        self._store_op(lambda: store.set(self._key(rank), self._beat().encode()))
        self._thread = threading.Thread(target=self._run, name=f"openclaw-watchdog-{rank}",
                                         daemon=True)
        self._thread.start()

    def _key(self, rank: int) -> str:
        return f"{self.namespace}/{rank}"

    # hot path -----------------------------------------------------------------------------
    def issued(self, step: int, bucket: int, work) -> None:
        """``work``: the collective's ``dist.Work`` (anything with ``is_completed()``)."""
        with self._lock:
            self._inflight[(step, bucket)] = (time.monotonic(), work)
            self._progress = (step, bucket)

    def settled(self, step: int) -> None:
        """The main thread has waited on every bucket of ``step`` (and of earlier steps)."""
        with self._lock:
            for key in [k for k in self._inflight if k[0] <= step]:
                del self._inflight[key]
            self._settled = max(self._settled, step)

    def check(self, cause: BaseException | None = None) -> None:
        """The training thread's point of delivery under ``RAISE``: raise the pending
        ``SyncTimeout`` when its collective failed (``cause``: the backend's error, chained) or
        still waits on a silent rank; forget it once the collective completed. With ``cause`` (any
        error the training thread got while this diagnosis stands — a failed wait, or what a
        failed collective's garbage made a check conclude) the diagnosis is raised from it unless
        the diagnosed collective succeeded; otherwise nothing is raised here (the caller
        re-raises ``cause``)."""
        verdict = self._verdict
        if verdict is None:
            return
        if cause is not None and not verdict.raised and _succeeded(verdict.work):
            self._verdict = None  # ``cause`` is not about the collective diagnosed
            return
        if cause is None and not verdict.raised:
            if verdict.work.is_completed():
                self._verdict = None
                return
            if not verdict.silent:
                return
        verdict.raised = True  # the job cannot go on: every later entry raises it too
        self.job.declare(self.store, verdict.error)
        raise verdict.error from cause

    def declare_failed(self, exc: BaseException, leaving: bool = False) -> None:
        """This rank is failing with ``exc``: tell the peers, whose watchdogs then end their
        processes (``job_end.py``); ``leaving`` (the process ends next): wait, bounded, until
        they read it. Any thread; never raises."""
        self.job.declare(self.store, exc)
        if leaving:
            self.job.await_peers(self.store)

    def known_failure(self) -> BaseException | None:
        """The failure this rank knows ended the job (``JobEnd.known``), or None."""
        return self.job.known()

    # background ---------------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.wait(self.tick_s):
            try:
                if self._tick():
                    return
            except Exception as exc:  # never let the thread die: record, keep watching
                self._blinded(exc)

    def _tick(self) -> bool:
        """One round; True when the thread must end (``EXIT`` fired)."""
        self._count += 1
        beat = self._beat()
        self._store_op(lambda: self.store.set(self._key(self.rank), beat.encode()))
        if self._job_ended() or self._outside_diagnosed():
            return True
        overdue = self._oldest_overdue()
        if overdue is None:
            self._episode = None
            return False
        since, key, work = overdue
        if key != self._episode:
            self._episode, self._late, self._told_silent = key, {}, set()
            self._reported = False
            self._look(key, initial=True)
        else:
            self._look(key, initial=False)
        return self._act(key, work, time.monotonic() - since)

    def _job_ended(self) -> bool:
        """Read the peers' failure note; end the process when the job has failed elsewhere."""
        if self.job.saw(self._store_op(lambda: self.job.read(self.store)), time.monotonic()):
            self._store_op(lambda: self.job.acknowledge(self.store))
        ended = self.job.verdict(time.monotonic())
        if ended is None or self.action is WatchdogAction.REPORT:
            return False
        self.events.append(ended.event())
        self.on_timeout(ended)
        return True

    def _outside_diagnosed(self) -> bool:
        """End the process on a diagnosis of an overdue outside collective (``outside_work``):
        it can never complete, and the training thread is blocked inside it."""
        if self.action is WatchdogAction.REPORT:
            return False
        error = self.outside.overdue(self.deadline_s, time.monotonic())
        if error is None:
            return False
        self._end(error)
        return True

    def _end(self, error: BaseException) -> None:
        """``EXIT``: the note, the peers' word that they read it (bounded), the process's end."""
        self.job.declare(self.store, error)
        self.job.await_peers(self.store)
        self.on_timeout(error)

    def _beat(self) -> Beat:
        with self._lock:
            return Beat(self._progress, self._settled, bool(self._inflight), self._count)

    def _oldest_overdue(self) -> tuple[float, Progress, object] | None:
        """(waiting since, key, Work) of the head collective once it is overdue (step 3)."""
        with self._lock:
            for key in [k for k, (_, w) in self._inflight.items() if w.is_completed()]:
                del self._inflight[key]
            now = time.monotonic()
            last, self._last_tick = self._last_tick, now
            if not self._inflight:
                self._head = None
                return None
            key = min(self._inflight)  # issue order: (step, bucket) increases on a rank
            issued_at, work = self._inflight[key]
        if self._head is None or self._head[0] != key:  # ahead of it completed after ``last``
            self._head = (key, max(issued_at, last))
        since = self._head[1]
        return (since, key, work) if now - since > self.deadline_s else None

    def _look(self, waiting_for: Progress, *, initial: bool) -> None:
        """Read the beats of every rank (first look) or of those still late; keep the late."""
        now = time.monotonic()
        ranks = [r for r in range(self.world_size) if r != self.rank] if initial else list(
            self._late)
        beats = self._store_op(lambda: {r: self.beat_of(r) for r in ranks})
        if beats is None:  # blind: keep what we knew
            return
        for r, beat in beats.items():
            if beat is not None and beat.progress >= waiting_for:
                self._late.pop(r, None)
                continue
            known = self._late.get(r)
            if known is None:
                self._late[r] = Late(r, beat, now)
            elif beat != known.beat:
                known.beat, known.changed_at = beat, now

    def beat_of(self, rank: int) -> Beat | None:
        """The beat ``rank`` (within the group) last published; None if it never did."""
        key = self._key(rank)
        return Beat.decode(self.store.get(key)) if self.store.check([key]) else None

    def _act(self, key: Progress, work, waited_s: float) -> bool:
        now = time.monotonic()
        silent = sorted(r for r, late in self._late.items() if late.silent(now, self.deadline_s))
        error = self._diagnosis(key, waited_s, now)
        self.fired = error
        if error.ranks:  # for a launcher past its deadline (``heartbeat.read_late``)
            me, late = self.global_ranks[self.rank], ",".join(str(r) for r in error.ranks)
            self._store_op(lambda: self.store.set(LATE_KEY, f"{me}:{late}"))
        if self.action is WatchdogAction.EXIT:
            self._end(error)
            return True
        if self.action is WatchdogAction.RAISE and not (self._verdict and self._verdict.raised):
            self._verdict = Verdict(key, work, error, bool(silent))
        news = set(silent) - self._told_silent
        if not self._reported or news:
            self._reported = True
            self._told_silent |= news
            self.events.append(error.event())
            warnings.warn(f"openclaw watchdog: {error}", RuntimeWarning, stacklevel=1)
        return False

    def _diagnosis(self, key: Progress, waited_s: float, now: float) -> SyncTimeout:
        step, index = key
        bucket = None if index == STEP_EXCHANGE else index
        me = self.global_ranks[self.rank]
        head = (f"rank {me}: allreduce of {what(index)} at step {step} still waiting after "
                f"{waited_s:.1f} s (deadline {self.deadline_s:g} s)")
        if self.blind and not self._late:
            return SyncTimeout(f"{head}; the late ranks are unknown: the store cannot be read",
                               ranks=[], step=step, bucket=bucket)
        parts = []
        for r, late in sorted(self._late.items()):
            who = f"rank {self.global_ranks[r]} has not reached step {step}'s allreduce " \
                  f"({what(index)})"
            if late.beat is None:
                parts.append(f"{who}: it never published a heartbeat")
            elif late.silent(now, self.deadline_s):
                parts.append(f"{who}: no heartbeat for {now - late.changed_at:.1f} s, last seen "
                             f"{late.beat.whereabouts()} — frozen, dead or cut off")
            else:
                parts.append(f"{who}; it is alive, last seen {late.beat.whereabouts()}")
        if not parts:
            parts.append("every rank has reached it: the collective itself is slow")
        return SyncTimeout(f"{head}; {'; '.join(parts)}",
                           ranks=[self.global_ranks[r] for r in self._late], step=step,
                           bucket=bucket)

    # the store, which may fail ------------------------------------------------------------
    def _store_op(self, op: Callable[[], object]) -> object | None:
        """``op()``'s result, or None while the store fails (retried with a doubling
        back-off; the first failure and the recovery are each recorded once)."""
        now = time.monotonic()
        if now < self._retry_at:
            return None
        try:
            result = op()
        except Exception as exc:
            self._failures += 1
            self._retry_at = now + min(self.tick_s * 2 ** self._failures, MAX_BACKOFF_S)
            self.job.store_failed(exc, now)
            self._blinded(exc)
            return None
        self._failures = 0
        self.job.store_answered()
        if self.blind:
            self.blind = False
            self.events.append(Event(SIGHTED, None, [self.global_ranks[self.rank]],
                                     detail="the watchdog reads the store again"))
        return result

    def _blinded(self, exc: BaseException) -> None:
        if self.blind:
            return
        self.blind = True
        detail = (f"rank {self.global_ranks[self.rank]}: the watchdog cannot watch its peers "
                  f"({type(exc).__name__}: {exc}); it retries with back-off, and until then "
                  f"cannot name late ranks")
        self.events.append(Event(BLIND, None, [self.global_ranks[self.rank]], detail=detail))
        warnings.warn(f"openclaw watchdog: {detail}", RuntimeWarning, stacklevel=1)

    def close(self) -> None:
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=2 * self.tick_s + 1)
