"""What a watchdog publishes every tick — a rank's *beat* — and how a watched collective is
worded. Progress is a (step, bucket) tuple: every rank issues its watched collectives in
increasing order within a step (``watchdog.py``)."""

from __future__ import annotations

from dataclasses import dataclass

Progress = tuple[int, int]  # (step, bucket)
NOT_STARTED: Progress = (-1, -1)
STEP_EXCHANGE = -1  # the "bucket" of harden()'s step guard: its one exchange per step


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
