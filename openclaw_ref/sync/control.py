"""The in-band control block: what every rank says about a bucket, carried in the bucket's own
allreduce, and the check every rank runs on the reduced result.

Layout. The block has one *slot* of ``SLOT_FIELDS`` elements per rank, appended to the bucket's
gradient elements on the wire. Rank ``r`` writes its fields into slot ``r`` and zeros everywhere
else, so after the SUM every slot holds exactly one rank's values: ``x + 0 + … + 0 == x`` is
exact in every floating-point format. Each field is split into 8-bit chunks (integers 0..255),
which fp32, fp16 (11-bit significand) and bf16 (8-bit significand) all represent exactly — so the
block survives any wire dtype bit for bit, and costs no extra collective.

Fields of a slot (chunks, most significant first):
  ``magic``      1  0xA5: the slot was written (a zero slot = that rank sent no block); 0x5A: the
                    rank has joined (``DDP.join()``) and sends zeros in DDP's shadow allreduce —
                    its slot abstains from every comparison
  ``clock``      4  the rank's logical clock (training step) mod 2**32
  ``bucket``     2  the bucket index the rank thinks it is reducing
  ``digest``     8  64-bit digest of the bucket's parameter membership (names, shapes, dtypes,
                    slices) — *layout*, never presence: a parameter with no local gradient is
                    zero-filled and stays a member
  ``scale``      1  the rank's power-of-two pre-scale exponent, offset by 128
  ``nonfinite``  1  1 if the rank's *local* gradients in this bucket held a NaN/inf before the
                    wire cast (a genuine non-finite gradient, as opposed to a wire overflow)
  ``ready``      3  bucket-ready time relative to the rank's step start, in units of
                    ``READY_UNIT_US`` µs (floor), saturating at 2**24 − 1 units (≈ 167 s)
  ``absent``     2  1 + the member index of the first *required* parameter (one the model does
                    not declare conditional) that got no local gradient this step; 0 = none

Decision rule (``verify``). The verdict is a pure function of the reduced block, which is
bitwise identical on every rank, so every rank raises the same error at the same step and bucket
or none does. For each field the reference value is the one most ranks report (ties: the value
of the lowest such rank); the ranks reporting anything else are the disagreeing ranks.
Checks run in cause order: missing slot → clock → bucket index/membership → scale → non-finite
→ absent required gradient. A local non-finite gradient raises only under the ``raise`` policy;
under ``skip`` the verdict carries the ranks and the step is skipped on every rank together.
"""

from __future__ import annotations

import hashlib
import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Sequence

import torch

from openclaw_ref.errors import (
    BucketMisalignment, ClockMismatch, ConsistencyError, Event, MissingGradient,
    NonFiniteGradient, ScaleMismatch,
)
from openclaw_ref.sync.precision import count_nonfinite, has_nonfinite

CHUNK_BITS = 8
CHUNK = 1 << CHUNK_BITS
MAGIC = 0xA5
MAGIC_JOINED = 0x5A
READY_UNIT_US = 10.0  # ready-time resolution: 10 µs, floor-quantized
SCALE_OFFSET = 128

# (name, chunks) in slot order
FIELDS: tuple[tuple[str, int], ...] = (
    ("magic", 1), ("clock", 4), ("bucket", 2), ("digest", 8), ("scale", 1), ("nonfinite", 1),
    ("ready", 3), ("absent", 2),
)
SLOT_FIELDS = sum(n for _, n in FIELDS)
_OFFSET: dict[str, int] = {}
_acc = 0
for _name, _n in FIELDS:
    _OFFSET[_name] = _acc
    _acc += _n
NONFINITE_INDEX = _OFFSET["nonfinite"]


def block_size(world_size: int) -> int:
    """Elements the control block adds to every bucket's allreduce."""
    return SLOT_FIELDS * world_size


def _chunks(value: int, n: int) -> list[int]:
    value %= CHUNK ** n
    return [(value >> (CHUNK_BITS * (n - 1 - i))) & (CHUNK - 1) for i in range(n)]


def _unchunk(chunks: Sequence[int]) -> int:
    v = 0
    for c in chunks:
        v = (v << CHUNK_BITS) | c
    return v


def membership_digest(members: Sequence[tuple[str, tuple[int, ...], str, int, int]]) -> int:
    """64-bit digest of a bucket's ordered membership: (name, shape, dtype, start, stop) per
    member, where start/stop select the flattened slice of the parameter the bucket carries."""
    h = hashlib.blake2b(digest_size=8)
    for name, shape, dtype, start, stop in members:
        h.update(f"{name}|{tuple(shape)}|{dtype}|{start}:{stop};".encode())
    return int.from_bytes(h.digest(), "big")


def ready_units(ready_s: float) -> int:
    return max(0, min(CHUNK ** 3 - 1, int(ready_s * 1e6 / READY_UNIT_US)))


def encode_slot(*, clock: int, bucket: int, digest: int, scale_exp: int, ready_s: float,
                absent: int | None = None) -> list[int]:
    """The slot of one rank, as 8-bit integers; ``nonfinite`` is 0 here and set on the device
    by ``write_block`` (it is a tensor result, read without a host sync). ``absent``: member
    index of the first required parameter without a local gradient, or None."""
    if not -SCALE_OFFSET <= scale_exp < SCALE_OFFSET:
        raise ValueError(f"scale exponent {scale_exp} outside the control block's range")
    absent_code = 0 if absent is None else min(absent + 1, CHUNK ** 2 - 1)
    return ([MAGIC] + _chunks(clock, 4) + _chunks(bucket, 2) + _chunks(digest, 8)
            + [scale_exp + SCALE_OFFSET, 0] + _chunks(ready_units(ready_s), 3)
            + _chunks(absent_code, 2))


def joined_slot() -> list[int]:
    """The slot of a rank that has joined: present, abstaining from every comparison."""
    return [MAGIC_JOINED] + [0] * (SLOT_FIELDS - 1)


def write_block(block: torch.Tensor, rank: int, slot: Sequence[int],
                local_nonfinite: torch.Tensor | None = None) -> None:
    """Fill ``block`` (``block_size(W)`` elements of the wire dtype): zeros, then our slot."""
    block.zero_()
    mine = block[rank * SLOT_FIELDS:(rank + 1) * SLOT_FIELDS]
    mine.copy_(torch.tensor(slot, dtype=block.dtype), non_blocking=True)
    if local_nonfinite is not None:
        mine[NONFINITE_INDEX].copy_(local_nonfinite)


@dataclass(frozen=True)
class Slot:
    """One rank's decoded fields; ``valid`` is False when the slot is empty or corrupt."""

    valid: bool
    joined: bool = False
    clock: int = -1
    bucket: int = -1
    digest: int = -1
    scale_exp: int = 0
    nonfinite: bool = False
    ready_ms: float = 0.0
    absent: int | None = None  # member index of the first required parameter without gradient


def decode_block(values: Sequence[float], world_size: int) -> list[Slot]:
    """Slots from the reduced block (host floats). A slot whose chunks are not integers in
    0..255 or whose magic is wrong was not written by exactly one rank: ``valid=False``."""
    slots = []
    for r in range(world_size):
        raw = values[r * SLOT_FIELDS:(r + 1) * SLOT_FIELDS]
        ok = all(math.isfinite(v) and v == int(v) and 0 <= v < CHUNK for v in raw)
        ints = [int(v) if ok else 0 for v in raw]
        if ok and ints[0] == MAGIC_JOINED:
            slots.append(Slot(True, joined=True))
            continue
        if not ok or ints[0] != MAGIC:
            slots.append(Slot(False))
            continue

        def field(name: str) -> list[int]:
            o = _OFFSET[name]
            return ints[o:o + dict(FIELDS)[name]]

        slots.append(Slot(
            True, clock=_unchunk(field("clock")), bucket=_unchunk(field("bucket")),
            digest=_unchunk(field("digest")), scale_exp=field("scale")[0] - SCALE_OFFSET,
            nonfinite=bool(field("nonfinite")[0]),
            ready_ms=_unchunk(field("ready")) * READY_UNIT_US / 1e3,
            absent=(_unchunk(field("absent")) - 1) if _unchunk(field("absent")) else None))
    return slots


def disagreeing(values: Sequence[object]) -> tuple[object, list[int]]:
    """The reference value (most frequent; ties → the lowest rank's) and the ranks that differ."""
    counts = Counter(values)
    top = max(counts.values())
    ref = next(v for v in values if counts[v] == top)
    return ref, [r for r, v in enumerate(values) if v != ref]


@dataclass(frozen=True)
class BucketVerdict:
    """What one verified bucket tells (all ranks compute the same figures). ``ready_ms`` and
    the skew cover the ranks that took part (joined ranks abstain); ``nonfinite_ranks`` are
    the ranks whose local gradients held NaN/inf (non-empty only under the ``skip`` policy)."""

    index: int
    ready_ms: list[float]
    skew_ms: float
    late_rank: int
    nonfinite_ranks: list[int] = field(default_factory=list)


def verify(slots: list[Slot], *, bucket: int, params: list[str],
           raise_nonfinite: bool = True) -> BucketVerdict:
    """Raise the first disagreement in the reduced block of one bucket, else the verdict.

    ``bucket`` and ``params`` are this rank's view, used only to *name* the bucket in the error
    (``params`` may differ on the very rank whose membership disagrees); the decision itself and
    the step, bucket and ranks in the error come from the shared block alone. Joined ranks'
    slots abstain: they take part in the sum with zeros and report nothing to compare.
    """
    missing = [r for r, s in enumerate(slots) if not s.valid]
    active = [r for r, s in enumerate(slots) if s.valid and not s.joined]
    if missing:
        clocks = [slots[r].clock for r in active]
        raise BucketMisalignment(
            "no readable control block from these ranks (different bucket sizes or slot "
            "collision)", step=int(disagreeing(clocks)[0]) if clocks else None, ranks=missing,
            bucket=bucket, params=params)
    if not active:
        return BucketVerdict(bucket, [], 0.0, 0)

    def odd(name: str) -> tuple[object, list[int]]:
        ref, off = disagreeing([getattr(slots[r], name) for r in active])
        return ref, [active[i] for i in off]

    clock, late = odd("clock")
    if late:
        got = {r: slots[r].clock for r in late}
        raise ClockMismatch(f"logical clocks differ: most ranks at step {clock}, but {got}",
                            step=int(clock), ranks=late, bucket=bucket, params=params)
    step = int(clock)
    index, off = odd("bucket")
    if off:
        raise BucketMisalignment(
            f"ranks reduce different buckets together: most say bucket {index}, "
            f"{ {r: slots[r].bucket for r in off} }", step=step, ranks=off, bucket=int(index),
            params=params)
    digest, off = odd("digest")
    if off:
        raise BucketMisalignment(
            f"bucket {index} holds different parameters on these ranks (membership digest "
            f"{digest:016x} on most ranks, "
            f"{ {r: format(slots[r].digest, '016x') for r in off} })",
            step=step, ranks=off, bucket=int(index), params=params)
    exp, off = odd("scale_exp")
    if off:
        raise ScaleMismatch(
            f"FP16 pre-scale differs: 2^{exp} on most ranks, "
            f"{ {r: '2^%d' % slots[r].scale_exp for r in off} }",
            step=step, ranks=off, bucket=int(index), params=params)
    bad = [r for r in active if slots[r].nonfinite]
    if bad and raise_nonfinite:
        raise NonFiniteGradient("local gradients held NaN/inf before the wire",
                                step=step, ranks=bad, bucket=int(index), params=params)
    absent = [r for r in active if slots[r].absent is not None]
    if absent:
        first = slots[absent[0]].absent
        named = [params[first]] if first is not None and first < len(params) else params
        raise MissingGradient(
            f"required parameter(s) got no gradient on these ranks (member index "
            f"{ {r: slots[r].absent for r in absent} }); the sum would silently miss them",
            step=step, ranks=absent, bucket=int(index), params=named)
    ready = [slots[r].ready_ms for r in active]
    late_rank = active[max(range(len(ready)), key=lambda i: (ready[i], -i))]
    return BucketVerdict(int(index), ready, max(ready) - min(ready), late_rank, bad)


# ---------------------------------------------------------------------------------------------
# Per-step bookkeeping shared by the hardened hook and the bucketed engine.


@dataclass
class BucketRecord:
    """One bucket reduced this step, as this rank saw it."""

    index: int
    params: list[str]  # this rank's members, to name the bucket in errors
    elements: int  # gradient elements on the wire (excluding the control block)
    block: torch.Tensor  # the reduced control block (a view into the wire buffer)
    reduced: torch.Tensor  # the reduced gradient elements, still in the wire dtype
    done: torch.futures.Future | None = None  # the allreduce; waited on before reading


def read_step(records: Sequence[BucketRecord], world_size: int,
              extra: torch.Tensor | None = None) -> tuple[list[list[Slot]], list[int], list[float]]:
    """Decoded slots and wire non-finite counts of every bucket of the step (and the values of
    ``extra``), read with ONE host synchronization (a single ``.tolist()`` over everything) on
    steps without overflow; an overflowed step pays one more to count its non-finite elements."""
    for r in records:
        if r.done is not None:
            r.done.wait()
    flags = torch.stack([has_nonfinite(r.reduced) for r in records])
    parts = [r.block.to(torch.float64) for r in records] + [flags.to(torch.float64)]
    if extra is not None:
        parts.append(extra.to(torch.float64).reshape(-1))
    flat = torch.cat(parts).tolist()
    size = block_size(world_size)
    n = len(records)
    slots = [decode_block(flat[i * size:(i + 1) * size], world_size) for i in range(n)]
    # exact counts only where the cheap flag fired: a second host sync on overflowed steps alone
    counts = [count_nonfinite(r.reduced) if flag else 0
              for r, flag in zip(records, flat[n * size:n * size + n])]
    return slots, counts, flat[n * size + n:]


class Ledger:
    """Verifies a step's buckets and keeps the run's statistics.

    ``settle`` is the only place a step's verdict is made: it raises on any disagreement, else
    decides overflow (any non-finite element in the reduced gradients — the same tensor on every
    rank, so the same decision), updates the shared scale policy and returns whether the
    optimizer step may run. Overflowed steps are skipped on every rank together and counted.
    """

    def __init__(self, world_size: int, policy, *,  # policy: precision.ScalePolicy
                 global_ranks: Sequence[int] | None = None, raise_nonfinite: bool = True) -> None:
        from openclaw_ref.sync.precision import OverflowStats

        self.world_size = world_size
        self.policy = policy
        self.global_ranks = list(global_ranks if global_ranks is not None else range(world_size))
        self.raise_nonfinite = raise_nonfinite
        self.events: list[Event] = []  # non-fatal findings (skipped non-finite steps)
        self.overflow = OverflowStats()
        self.checks_run = 0
        self.checks_passed = 0
        self.bucket_checks = 0
        self.replica_checks = 0
        self.max_skew_ms = 0.0
        self.max_skew_at: dict = {}
        self.last: dict = {}
        self.extra: list[float] = []
        self._pending_checks = [0, 0]  # checks run/passed since the last settled step

    def count_check(self, passed: bool) -> None:
        """A check outside the buckets (replica, construction) ran at this step."""
        self._pending_checks[0] += 1
        self._pending_checks[1] += passed
        self.checks_run += 1
        self.checks_passed += passed

    def settle(self, step: int, records: Sequence[BucketRecord], *, sync_ms: float,
               verify_started: float, extra: torch.Tensor | None = None) -> bool:
        """``extra``: a reduced tensor the caller needs on the host too (read in the same sync;
        its values land in ``self.extra``)."""
        import time

        exponent = self.policy.exponent
        slots, nonfinite, self.extra = (read_step(records, self.world_size, extra) if records
                                        else ([], [], []))
        buckets = []
        for rec, s in zip(records, slots):
            self.checks_run += 1
            self._pending_checks[0] += 1
            try:
                verdict = verify(s, bucket=rec.index, params=rec.params,
                                 raise_nonfinite=self.raise_nonfinite)
            except ConsistencyError as exc:
                raise exc.renumbered(self.global_ranks) from None
            if verdict.nonfinite_ranks:
                self.events.append(NonFiniteGradient(
                    "local gradients held NaN/inf: the step is skipped on every rank",
                    step=step, ranks=[self.global_ranks[r] for r in verdict.nonfinite_ranks],
                    bucket=verdict.index, params=rec.params).event())
            self.checks_passed += 1
            self.bucket_checks += 1
            self._pending_checks[1] += 1
            buckets.append({"index": verdict.index, "skew_ms": verdict.skew_ms,
                            "late_rank": self.global_ranks[verdict.late_rank],
                            "ready_ms": verdict.ready_ms})
            if verdict.skew_ms > self.max_skew_ms:
                self.max_skew_ms = verdict.skew_ms
                self.max_skew_at = {"step": step, "bucket": verdict.index,
                                    "late_rank": self.global_ranks[verdict.late_rank]}
        overflow_elements = sum(nonfinite)
        elements = sum(r.elements for r in records)
        overflowed = overflow_elements > 0
        self.overflow.add(elements, overflow_elements, skipped=overflowed)
        self.policy.update(overflowed)
        run, passed = self._pending_checks
        self._pending_checks = [0, 0]
        self.last = {
            "sync_ms": sync_ms + (time.perf_counter() - verify_started) * 1e3,
            "verify_ms": (time.perf_counter() - verify_started) * 1e3,
            "buckets": buckets,
            "overflow_elements": overflow_elements,
            "elements": elements,
            "overflowed": overflowed,
            "scale": 2.0 ** exponent,
            "scale_exp": exponent,
            "checks_run": run,
            "checks_passed": passed,
        }
        return not overflowed

    def summary(self) -> dict:
        return {
            **self.overflow.to_json(),
            "checks_run": self.checks_run, "checks_passed": self.checks_passed,
            "bucket_checks": self.bucket_checks, "replica_checks": self.replica_checks,
            "max_skew_ms": self.max_skew_ms, "max_skew_at": self.max_skew_at,
            "final_scale_exp": self.policy.exponent,
            "scale_backoffs": self.policy.backoffs, "scale_growths": self.policy.growths,
            "ready_time_resolution_ms": READY_UNIT_US / 1e3,
        }
