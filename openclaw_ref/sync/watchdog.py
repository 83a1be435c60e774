"""Hangs become errors: a per-rank watchdog thread that names the ranks a stuck allreduce waits for.

The hot path hands the watchdog each bucket's ``Work`` (``issued``: a dict entry under an
uncontended lock, no I/O); the main thread drops a step's entries once it has waited on them
(``settled``). A background thread, every ``tick_s``:
  1. publishes this rank's progress — the latest (step, bucket) it *issued* — to the c10d store
     under ``<namespace>/<rank>`` (only when it changed);
  2. polls every in-flight ``Work`` with ``is_completed()`` and forgets the finished ones;
  3. if one has been in flight longer than ``deadline_s``, reads every rank's published
     progress, names those behind (step, bucket) — the ranks that have not arrived at the
     collective — and calls ``on_timeout(SyncTimeout(...))``.

Why poll the ``Work``: a future's completion means different things per backend. NCCL marks
a collective's future done when its kernel is *enqueued*, so a watchdog fed by future callbacks
would see every NCCL allreduce finish at once and never fire; ``Work.is_completed()`` asks the
backend whether the collective has actually finished (NCCL: its CUDA event; gloo: the work
ran). One mechanism for both, so the CPU tests exercise the same logic a GPU job runs.

The main thread is then blocked inside a gloo/NCCL collective, so nothing it could raise would
ever be seen: ``on_timeout`` must report and end the process itself (the launcher's ``report_fatal``
sends the error to the launcher and ``os._exit(4)``s). Progress is compared as (step, bucket)
tuples because every rank issues buckets in increasing index order within a step.

Published progress may be up to one tick stale; a rank that arrives within that tick completes
the collective, so it is never named. ``deadline_s`` must exceed the slowest legitimate bucket.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable, Sequence

import torch.distributed as dist

from openclaw_ref.sync.errors import SyncTimeout

Progress = tuple[int, int]  # (step, bucket)
NOT_STARTED: Progress = (-1, -1)


def exit_fatal(exc: BaseException) -> None:
    """Fallback reporter outside the launcher (e.g. a user's own torchrun script)."""
    sys.stderr.write(f"openclaw watchdog: {exc}\n")
    sys.stderr.flush()
    os._exit(getattr(exc, "exit_code", 1))


def namespace_for(store: dist.Store, rank: int, prefix: str = "openclaw/watchdog",
                  group_ranks: Sequence[int] | None = None) -> str:
    """A key namespace unique to this construction, agreed without a collective: each rank
    counts its own constructions in the store, and every rank of a group constructs the same
    strategies in the same order, so the counters agree. ``group_ranks`` (the global ranks of a
    DDP model's process group) keeps two groups of one job out of each other's keys; ``rank``
    is then the global rank."""
    if group_ranks is not None:
        prefix = f"{prefix}/g{'-'.join(str(r) for r in group_ranks)}"
    generation = store.add(f"{prefix}/generation/{rank}", 1)
    return f"{prefix}/{generation}"


class Watchdog:
    """See the module docstring. ``close()`` stops the thread (never blocks on other ranks)."""

    def __init__(self, store: dist.Store, rank: int, world_size: int, deadline_s: float,
                 namespace: str, on_timeout: Callable[[BaseException], None] = exit_fatal,
                 tick_s: float | None = None, global_ranks: Sequence[int] | None = None) -> None:
        self.store = store
        # ``rank``/``world_size`` are within the watched group; errors name global ranks
        self.global_ranks = list(global_ranks if global_ranks is not None else range(world_size))
        self.rank = rank
        self.world_size = world_size
        self.deadline_s = deadline_s
        self.namespace = namespace
        self.on_timeout = on_timeout
        self.tick_s = tick_s if tick_s is not None else max(0.02, min(1.0, deadline_s / 5))
        self._progress: Progress = NOT_STARTED
        self._inflight: dict[Progress, tuple[float, object]] = {}  # -> (issued at, Work)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.fired: SyncTimeout | None = None
        store.set(self._key(rank), _fmt(NOT_STARTED))
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

    # background ---------------------------------------------------------------------------
    def _run(self) -> None:
        published = NOT_STARTED
        while not self._stop.wait(self.tick_s):
            progress = self._progress
            if progress != published:
                self.store.set(self._key(self.rank), _fmt(progress))
                published = progress
            with self._lock:
                for key in [k for k, (_, w) in self._inflight.items() if w.is_completed()]:
                    del self._inflight[key]
                now = time.monotonic()
                overdue = [(t, key) for key, (t, _) in self._inflight.items()
                           if now - t > self.deadline_s]
            if overdue:
                t, (step, bucket) = min(overdue)
                late = self.late_ranks((step, bucket))
                self.fired = SyncTimeout(
                    f"rank {self.global_ranks[self.rank]}: allreduce of bucket {bucket} at step "
                    f"{step} still waiting after {time.monotonic() - t:.1f} s (deadline "
                    f"{self.deadline_s:g} s)",
                    ranks=late, step=step, bucket=bucket)
                self.on_timeout(self.fired)
                return

    def late_ranks(self, waiting_for: Progress) -> list[int]:
        """Global ranks whose published progress has not reached ``waiting_for``."""
        late = []
        for r in range(self.world_size):
            if r == self.rank:
                continue
            key = self._key(r)
            if not self.store.check([key]):
                late.append(r)
                continue
            if _parse(self.store.get(key)) < waiting_for:
                late.append(r)
        return [self.global_ranks[r] for r in late]

    def close(self) -> None:
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=2 * self.tick_s + 1)


def _fmt(p: Progress) -> str:
    return f"{p[0]}:{p[1]}"


def _parse(raw: bytes) -> Progress:
    step, bucket = raw.decode().split(":")
    return int(step), int(bucket)
