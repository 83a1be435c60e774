"""The check every rank runs on a step's reduced control blocks (their layout and encoding:
``control_layout``).

Decision rule (``verify``). The verdict is a pure function of the reduced block, which is
bitwise identical on every rank, so every rank raises the same error at the same step and bucket
or none does. For each field the reference value is the one a strict majority of the ranks
report (``vote.majority``); the ranks reporting anything else are the disagreeing ranks (``ranks``
of the error) — with no strict majority, every rank, and the message says the ranks disagree
and gives every rank's value (``vote.split_view``).
Checks run in cause order: missing slot → a bucket some rank's DDP never issued (worded from
the slots of the ranks that did not reduce, ``not_reduced``) → clock → bucket index/membership →
scale → absent required gradient; a local non-finite gradient is reported
with its ranks (what to do about it is the ledger's policy). ``verify`` states the rule and
names the ranks; the counts (``control_counts``) pass the clean buckets of a whole step, and
only a step they cannot pass has its per-rank slots gathered for ``verify`` to judge and name.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from openclaw_ref.sync.errors import (
    BucketMisalignment,
    ClockMismatch,
    ConsistencyError,
    GradientsNotAveraged,
    MissingGradient,
    ScaleMismatch,
)
from openclaw_ref.sync.evidence.averaged import Cause
from openclaw_ref.sync.evidence.control_layout import NotIssued, Slot
from openclaw_ref.sync.evidence.vote import majority, split_view


@dataclass(frozen=True)
class BucketVerdict:
    """What one verified bucket tells (all ranks compute the same figures). ``ready_ms`` and
    the skew cover the ranks that took part (joined ranks abstain); ``ready_ms`` is None where
    the check did not bring the per-rank times to the host (too many ranks)."""

    index: int | None  # None: the step guard's one slot for the whole step
    ready_ms: list[float] | None
    skew_ms: float
    late_rank: int | None  # None: not known (a ready-time histogram beyond 64 ranks)
    joined: bool = False  # some rank had joined (DDP.join()) and abstained
    nonfinite_ranks: tuple[int, ...] = ()  # ranks whose own gradients held NaN/inf
    nonfinite_seen: bool = False  # some rank's did, but the ranks could not be named


def verify(slots: list[Slot], *, bucket: int | None, params: list[str]) -> BucketVerdict:
    """Raise the first disagreement in the reduced block of one bucket, else the verdict.

    ``bucket`` and ``params`` are this rank's view, used only to *name* the bucket in the error
    (``params`` may differ on the very rank whose membership disagrees); the decision itself and
    the step, bucket and ranks in the error come from the shared block alone. ``bucket=None``:
    the slots describe a whole step (the step guard's one exchange), and no error names a
    bucket (the slot's bucket field then holds the first bucket a rank's DDP never issued).
    Joined ranks' slots abstain: they take part in the sum with zeros and report
    nothing to compare.
    """
    missing = [r for r, s in enumerate(slots) if not s.valid]
    active = [r for r, s in enumerate(slots) if s.valid and not s.joined]
    if missing:
        clocks = [slots[r].clock for r in active]
        raise BucketMisalignment(
            "no readable control block from these ranks (different bucket sizes or slot "
            "collision)", step=int(majority(clocks).reference) if clocks else None,
            ranks=missing,
            bucket=bucket, params=params)
    unissued = [r for r in active if slots[r].unissued]
    if unissued:
        raise not_reduced(slots, active, unissued, bucket=bucket, params=params)
    joined = len(active) < len(slots)
    if not active:
        return BucketVerdict(bucket, [], 0.0, 0, joined)

    def odd(name: str, show=str) -> tuple[object, list[int], str]:
        values = [getattr(slots[r], name) for r in active]
        vote = majority(values)
        return (vote.reference, [active[i] for i in vote.differing],
                split_view(values, vote, active, show))

    clock, late, split = odd("clock", lambda c: f"step {c}")
    if late:
        raise ClockMismatch(f"logical clocks differ: {split}",
                            step=int(clock), ranks=late, bucket=bucket, params=params)
    step = int(clock)
    index, off, split = odd("bucket", lambda b: f"bucket {b}")
    at = None if bucket is None else int(index)
    if off:
        raise BucketMisalignment(
            f"ranks reduce different buckets together: {split}", step=step, ranks=off,
            bucket=at, params=params)
    digest, off, split = odd("digest", lambda d: format(d, "016x"))
    if off:
        raise BucketMisalignment(
            f"bucket {index} holds different parameters on these ranks (membership digest "
            f"{split})", step=step, ranks=off, bucket=at, params=params)
    exp, off, split = odd("scale_exp", lambda e: f"2^{e}")
    if off:
        raise ScaleMismatch(f"FP16 pre-scale differs: {split}", step=step, ranks=off,
                            bucket=at, params=params)
    absent = [r for r in active if slots[r].absent is not None]
    if absent:
        first = slots[absent[0]].absent
        named = [params[first]] if first is not None and first < len(params) else params
        raise MissingGradient(
            f"required parameter(s) got no gradient on these ranks (member index "
            f"{ {r: slots[r].absent for r in absent} }); the sum would silently miss them",
            step=step, ranks=absent, bucket=at, params=named)
    return _passed(at, [slots[r] for r in active], active, joined)


def not_reduced(slots: Sequence[Slot], active: Sequence[int], unissued: Sequence[int], *,
                bucket: int | None, params: Sequence[str]) -> ConsistencyError:
    """The verdict of a step on which the ``unissued`` ranks' DDP did not reduce every bucket,
    from their slots alone (each says why, ``NotIssued``, and the first parameter concerned), so
    every rank words it alike: the rank with the evidence decides. The class is that of the
    surest cause any of them reports (cause order): ``GradientsNotAveraged`` for a forward that
    bypassed the wrapper or parameters replaced after wrapping, else ``MissingGradient``; the
    parameter named is the one the first rank with that cause reported; ``ranks`` are every
    rank whose DDP did not reduce, each cause's ranks in the words when they differ."""
    step = int(majority([slots[r].clock for r in active]).reference)
    by_why: dict[NotIssued, list[int]] = {}
    for r in unissued:
        by_why.setdefault(slots[r].unissued, []).append(r)
    causes = [w for w in NotIssued if w in by_why]
    words = [_why_words(w, slots[by_why[w][0]], bucket, params)
             + (f" (ranks {by_why[w]})" if len(causes) > 1 else "") for w in causes]
    first = slots[by_why[causes[0]][0]].absent
    named = [params[first]] if first is not None and first < len(params) else list(params)
    kind = MissingGradient if causes[0] is NotIssued.STOPPED else GradientsNotAveraged
    return kind("; ".join(words), step=step, ranks=list(unissued), bucket=bucket, params=named)


def _why_words(why: NotIssued, slot: Slot, bucket: int | None, params: Sequence[str]) -> str:
    """One cause's words: ``averaged.Cause``'s for a bypass or a replacement; for a DDP that
    stopped, the bucket it stopped before and the parameter it waited for, where known."""
    if why is NotIssued.BYPASSED:
        return Cause.BYPASSED.value
    if why is NotIssued.REPLACED:
        return Cause.REPLACED.value
    first = slot.bucket if bucket is None else bucket  # step guard: from the slot
    waited = (f": {params[slot.absent]} got no gradient, and under "
              "find_unused_parameters=False DDP waits for every parameter"
              if slot.absent is not None and slot.absent < len(params) else
              " (a parameter without a gradient under find_unused_parameters=False?)")
    return (f"DDP never reduced this backward's last bucket on these ranks: their DDP stopped "
            f"before bucket {first}{waited}; they sent zeros so that every rank stops here")


def _passed(index: int | None, mine: list[Slot], active: list[int], joined: bool) -> BucketVerdict:
    """The figures of a bucket ``verify`` passed: ``mine`` are the slots of the ``active``
    ranks; the late rank is the first at the latest ready time."""
    ready = [s.ready_ms for s in mine]
    late_rank = active[max(range(len(ready)), key=lambda i: (ready[i], -i))]
    return BucketVerdict(index, ready, max(ready) - min(ready), late_rank, joined,
                         tuple(r for r, s in zip(active, mine) if s.nonfinite))
