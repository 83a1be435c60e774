"""What a watchdog publishes every tick — a rank's *beat*, under the key namespace of its
construction — what a late rank looks like to its peers, and how a watched collective is
worded. Progress is a (step, bucket) tuple: every rank issues its watched collectives in
increasing order within a step (``watchdog.py``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch.distributed as dist

Progress = tuple[int, int]  # (step, bucket)
NOT_STARTED: Progress = (-1, -1)
STEP_EXCHANGE = -1  # the "bucket" of harden()'s step guard: its one exchange per step
LATE_KEY = "openclaw/watchdog/late"  # the latest diagnosis's late ranks, for a launcher


@dataclass(frozen=True)
class Beat:
    """What a rank publishes every tick."""

    progress: Progress  # the latest (step, bucket) it issued
    settled: int  # the last step whose buckets it waited on (-1: none yet)
    busy: bool  # a watched collective of its own is in flight
    count: int  # grows every tick while its watchdog thread runs

    def encode(self) -> str:
        return f"{self.progress[0]}:{self.progress[1]}:{self.settled}:{int(self.busy)}:{self.count}"

    @classmethod
    def decode(cls, raw: bytes) -> Beat:
        step, bucket, settled, busy, count = (int(x) for x in raw.decode().split(":"))
        return cls((step, bucket), settled, bool(busy), count)

    def whereabouts(self) -> str:
        """Where this rank was last seen, in words."""
        if self.progress == NOT_STARTED:
            return "before its first collective"
        if self.busy:
            return f"waiting in step {self.progress[0]}'s allreduce ({what(self.progress[1])})"
        if self.settled >= self.progress[0]:
            return f"after step {self.settled} (no collective in flight)"
        return f"in step {self.progress[0]}, after {what(self.progress[1], 'its ')}"


def what(bucket: int, its: str = "") -> str:
    """A watched collective in words: a bucket's allreduce, or the step guard's exchange."""
    return "the step's exchange" if bucket == STEP_EXCHANGE else f"{its}bucket {bucket}"


def namespace_for(store: dist.Store, rank: int, prefix: str = "openclaw/watchdog",
                  group_ranks: Sequence[int] | None = None) -> str:
    """A key namespace unique to this construction, agreed without a collective: each rank
    counts its own constructions in the store, and every rank of a group constructs the same
    guards in the same order, so the counters agree. ``group_ranks`` (the global ranks of a
    DDP model's process group) keeps two groups of one job out of each other's keys; ``rank``
    is then the global rank."""
    if group_ranks is not None:
        prefix = f"{prefix}/g{'-'.join(str(r) for r in group_ranks)}"
    generation = store.add(f"{prefix}/generation/{rank}", 1)
    return f"{prefix}/{generation}"


@dataclass
class Late:
    """A rank behind the overdue collective, as this rank has watched it."""

    rank: int  # within the group
    beat: Beat | None  # None: it never published one
    changed_at: float  # monotonic time of this rank's last look that saw the beat change

    def silent(self, now: float, window_s: float) -> bool:
        return self.beat is None or now - self.changed_at >= window_s


def read_late(store: dist.Store) -> tuple[int, list[int]] | None:
    """(the reporting rank, the late ranks it named) of the latest watchdog diagnosis in the
    job — what a launcher past its own deadline names — or None (none, or unreadable)."""
    try:
        if not store.check([LATE_KEY]):
            return None
        reporter, ranks = store.get(LATE_KEY).decode().split(":")
        return int(reporter), [int(r) for r in ranks.split(",") if r]
    except (RuntimeError, ValueError):
        return None
