"""The hardened hook's step block as counts: O(B) elements per step whatever the world size W,
and an exact clean check on every wire dtype (``control`` judges the per-rank slots that only a
failing step gathers).

Encoding. Every field the active ranks must agree on — the agreed chunks of a
``control_layout`` slot (clock, bucket index, membership digest, scale exponent, absent code:
136 bits) — is written one element per bit. Each rank adds its bits, so after the SUM an element
is the number of ranks whose bit is 1, and the active ranks agree iff every bit count is 0 or
``n_active`` (one element each active rank sets to 1; a joined rank sets ``joined`` instead and
abstains from every count). Exact, not probabilistic: a count is an integer sum of 0/1 terms.
A rank that wrote nothing or twice makes ``n_active + n_joined`` differ from W; what sums cannot
tell is one rank writing twice while another writes nothing, which cannot arise (each rank
zero-fills and writes its own contribution once; there are no per-rank positions to confuse).
Also counted: ranks whose own gradients held NaN/inf, and the absent-gradient bits (which must
all be 0). Counts are exact while a group's ranks stay within the wire's exact-integer limit
(fp32 2^24, fp16 2,048, bf16 256): beyond it the ranks are split into groups of that many, one
set of counts per group, summed on the host side of the check in float64.

Ready times. Up to ``DETAIL_MAX_RANKS`` ranks each rank writes its own ready time (3 chunks of 8
bits, as in the slot) and an "active" marker at its own position — the exact skew and the late
rank, as before. Beyond that, a histogram: each active rank adds 1 to the bin of its ready time,
``HIST_PER_OCTAVE`` bins per octave of ``READY_UNIT_US`` µs units (bin 0: under one unit); the
skew is the distance between the lowest edges of the highest and lowest occupied bins, exact to
within one bin (the later time's bin is (√2 − 1) ≈ 41 % of its value wide) and no late rank is
named.

Replica digest. The block ends with one step row per group: an "active" element and the 64 bits
of this rank's ``ReplicaDigest`` of the step's parameter slice, as counts (clean iff every count
is 0 or the number of ranks that digested).

Size per step, elements of the wire dtype: B × (G × ``COUNT_FIELDS`` + ready section) +
G × ``STEP_FIELDS``, with G = ⌈W / exact limit⌉ groups and the ready section 4·W (W ≤ 64) or
G × ``HIST_BINS`` (W > 64). fp32: 139 + 4·W ≤ 395 elements per bucket up to 64 ranks, 188 from 65
to 16,777,216 ranks (752 B per bucket, 770 KB for 1,024 buckets); fp16 at 8,192 ranks: 4 groups,
752 elements (1,504 B) per bucket; bf16 at 8,192 ranks: 32 groups (12 KB per bucket).

Only when the clean check fails (a disagreement, a NaN count > 0 whose ranks must be named, a
replica mismatch) does every rank gather the per-rank slots with one extra collective
(``ledger``); every rank sees the same reduced block, so every rank enters it together.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from openclaw_ref.sync.control_layout import (
    CHUNK_BITS,
    MAGIC,
    MAGIC_JOINED,
    NONFINITE,
    READY,
    READY_UNIT_US,
)

AGREED_BITS = (NONFINITE - 1) * CHUNK_BITS  # slot chunks 1 .. NONFINITE-1, eight bits each
ACTIVE, JOINED, BITS0 = 0, 1, 2
NONFINITE_COUNT = BITS0 + AGREED_BITS
COUNT_FIELDS = NONFINITE_COUNT + 1
# bit positions of the absent code (the last two agreed chunks): any count there is an error
ABSENT_BITS = slice(AGREED_BITS - 2 * CHUNK_BITS, AGREED_BITS)
DIGEST_BITS = 64
STEP_FIELDS = 1 + DIGEST_BITS
DETAIL_MAX_RANKS = 64  # per-rank ready times (4 elements per rank) up to here
DETAIL_FIELDS = 4  # active marker, 3 ready chunks
HIST_PER_OCTAVE = 2
HIST_BINS = 1 + HIST_PER_OCTAVE * 24  # ready units saturate at 2^24 − 1

EXACT_LIMIT = {torch.float32: 1 << 24, torch.float16: 1 << 11, torch.bfloat16: 1 << 8,
               torch.float64: 1 << 53}


@dataclass(frozen=True)
class CountLayout:
    """Where each count of a step block lives, for W ranks on one wire dtype."""

    world_size: int
    dtype: torch.dtype

    @property
    def group_size(self) -> int:
        return EXACT_LIMIT[self.dtype]

    @property
    def groups(self) -> int:
        return -(-self.world_size // self.group_size)

    @property
    def detail(self) -> bool:
        return self.world_size <= DETAIL_MAX_RANKS

    @property
    def ready_fields(self) -> int:
        return (DETAIL_FIELDS * self.world_size if self.detail
                else self.groups * HIST_BINS)

    @property
    def row(self) -> int:
        """Elements per bucket."""
        return self.groups * COUNT_FIELDS + self.ready_fields

    def size(self, buckets: int) -> int:
        """Elements of a step block of ``buckets`` buckets (their rows, then the step row)."""
        return buckets * self.row + self.groups * STEP_FIELDS

    def nbytes(self, buckets: int) -> int:
        return self.size(buckets) * self.dtype.itemsize


def hist_bin(units: torch.Tensor) -> torch.Tensor:
    """The histogram bin of ready times in ``READY_UNIT_US`` units (int64 tensor)."""
    u = units.to(torch.float64)
    k = torch.floor(HIST_PER_OCTAVE * torch.log2(u.clamp(min=1.0))).to(torch.int64) + 1
    return torch.where(u < 1, torch.zeros_like(k), k.clamp(max=HIST_BINS - 1))


def bin_floor_ms(k: int) -> float:
    """The lowest ready time of bin ``k``, in ms."""
    return 0.0 if k == 0 else 2.0 ** ((k - 1) / HIST_PER_OCTAVE) * READY_UNIT_US / 1e3


def count_rows(slots: torch.Tensor) -> torch.Tensor:
    """(B, COUNT_FIELDS + HIST_BINS) int64: one rank's contribution per bucket from its slots
    ``(B, SLOT_FIELDS)`` (0..255 chunks): the count fields, then its one-hot ready bin. A slot
    whose magic is neither active nor joined contributes nothing (a rank that wrote nothing)."""
    B = slots.shape[0]
    out = torch.zeros(B, COUNT_FIELDS + HIST_BINS, dtype=torch.int64)
    active = slots[:, 0] == MAGIC
    out[:, ACTIVE] = active.long()
    out[:, JOINED] = (slots[:, 0] == MAGIC_JOINED).long()
    shifts = torch.arange(CHUNK_BITS - 1, -1, -1)  # most significant bit first
    bits = (slots[:, 1:NONFINITE, None] >> shifts).bitwise_and_(1).reshape(B, AGREED_BITS)
    out[:, BITS0:NONFINITE_COUNT] = bits * active[:, None]
    out[:, NONFINITE_COUNT] = slots[:, NONFINITE] * active
    c = slots[:, READY]
    units = (c[:, 0] << 16) | (c[:, 1] << 8) | c[:, 2]
    out[torch.arange(B), COUNT_FIELDS + hist_bin(units)] = active.long()
    return out


def digest_bits(digest: torch.Tensor) -> torch.Tensor:
    """The 64 bits of a 0-dim int64 digest, most significant first, on its device (the shifts
    are made there: no host-to-device copy, no stream synchronization)."""
    shifts = torch.arange(DIGEST_BITS - 1, -1, -1, device=digest.device)
    return torch.bitwise_right_shift(digest, shifts).bitwise_and_(1)


def write_counts(block: torch.Tensor, layout: CountLayout, rank: int, slots: torch.Tensor,
                 flags: torch.Tensor | None = None, replica: torch.Tensor | None = None) -> None:
    """Fill ``block`` (``layout.size(B)`` elements, any wire dtype, any device) with this rank's
    contribution: zeros, its counts in its group, its ready detail or bin, its step row.
    ``slots``: (B, SLOT_FIELDS) int64 on the host; ``flags``: (B,) 0/1 of the rank's own
    non-finite gradients, on the block's device (None: as in the slots); ``replica``: 0-dim
    int64 digest of this step's parameter slice, on the block's device (None: abstain)."""
    B, G, W = slots.shape[0], layout.groups, layout.world_size
    g = rank // layout.group_size
    block.zero_()
    rows = block[:B * layout.row].view(B, layout.row)
    rowsv = rows[:, :G * COUNT_FIELDS].view(B, G, COUNT_FIELDS)
    contrib = count_rows(slots)
    rowsv[:, g].copy_(contrib[:, :COUNT_FIELDS].to(block.dtype), non_blocking=True)
    if flags is not None:
        rowsv[:, g, NONFINITE_COUNT] = flags.to(block.dtype) * rowsv[:, g, ACTIVE]
    ready = rows[:, G * COUNT_FIELDS:]
    if layout.detail:
        mine = torch.cat([contrib[:, ACTIVE:ACTIVE + 1], slots[:, READY]], 1)
        mine = mine * contrib[:, ACTIVE:ACTIVE + 1]
        ready.view(B, W, DETAIL_FIELDS)[:, rank].copy_(mine.to(block.dtype), non_blocking=True)
    else:
        ready.view(B, G, HIST_BINS)[:, g].copy_(contrib[:, COUNT_FIELDS:].to(block.dtype),
                                                non_blocking=True)
    if replica is not None:
        step = block[B * layout.row:].view(G, STEP_FIELDS)[g]
        step[0] = 1
        step[1:] = digest_bits(replica).to(block.dtype)


@dataclass(frozen=True)
class Figures:
    """A passing bucket's ready-time figures (``control.BucketVerdict`` fields)."""

    ready_ms: list[float] | None
    skew_ms: float
    late_rank: int | None
    joined: bool


@dataclass(frozen=True)
class CountCheck:
    """``check_counts``' answer for one step, on the host."""

    ok: list[bool]  # per bucket: the active ranks agree, none joined-inconsistent, no NaN
    figures: list[Figures | None]  # None where not ok
    replica_ok: bool
    joined: bool  # some rank had joined (DDP.join()) in some bucket
    counts: list[list[float]]  # per bucket, the group-summed counts (only when some failed)
    step_counts: list[float]  # group-summed step row (only when the replica row failed)


def _agree(counts: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
    return ((counts == 0) | (counts == n.unsqueeze(-1))).all(-1)


def check_counts(block: torch.Tensor, layout: CountLayout, buckets: int,
                 extra: torch.Tensor | None = None) -> tuple[CountCheck, list[float]]:
    """The clean check of a reduced step block on its own device, one host transfer
    (``extra``, any 1-D tensor the caller needs on the host too, rides along)."""
    B, G, W = buckets, layout.groups, layout.world_size
    rows = block[:B * layout.row].view(B, layout.row).to(torch.float64)
    counts = rows[:, :G * COUNT_FIELDS].view(B, G, COUNT_FIELDS).sum(1)
    n = counts[:, ACTIVE]
    bits = counts[:, BITS0:NONFINITE_COUNT]
    ok = ((n + counts[:, JOINED] == W) & _agree(bits, n)
          & (bits[:, ABSENT_BITS] == 0).all(-1) & (counts[:, NONFINITE_COUNT] == 0))
    step = block[B * layout.row:].view(G, STEP_FIELDS).to(torch.float64).sum(0)
    replica_ok = _agree(step[1:], step[0])
    ready = rows[:, G * COUNT_FIELDS:]
    parts = [ok.double(), replica_ok.double().reshape(1), counts[:, JOINED]]
    if layout.detail:  # skew and late rank on the device: the first active rank at the max
        d = ready.view(B, W, DETAIL_FIELDS)
        marks = d[:, :, 0]
        ms = (d[:, :, 1] * 65536 + d[:, :, 2] * 256 + d[:, :, 3]) * READY_UNIT_US / 1e3
        on = marks == 1
        hi = torch.where(on, ms, torch.full_like(ms, -1.0))
        lo = torch.where(on, ms, torch.full_like(ms, float("inf")))
        some = on.any(1)  # none active (every rank joined): skew 0, rank 0, as ``verify``
        parts += [torch.where(some, hi.amax(1) - lo.amin(1), 0.0),
                  torch.where(some, hi.argmax(1), 0).double(), marks.reshape(-1),
                  ms.reshape(-1)]
    else:
        parts.append(ready.view(B, G, HIST_BINS).sum(1).reshape(-1))
    flat = torch.cat(parts)
    if extra is not None:
        flat = torch.cat([flat, extra.to(device=flat.device, dtype=torch.float64).reshape(-1)])
    host = flat.tolist()  # the one host synchronization
    oks = [v == 1.0 for v in host[:B]]
    rep_ok = host[B] == 1.0
    joined_n = host[B + 1:2 * B + 1]
    at = 2 * B + 1
    figures: list[Figures | None] = []
    if layout.detail:
        skew, late, at = host[at:at + B], host[at + B:at + 2 * B], at + 2 * B
        marks, ms, at = host[at:at + B * W], host[at + B * W:at + 2 * B * W], at + 2 * B * W
        for b in range(B):
            if not oks[b]:
                figures.append(None)
                continue
            ready = ms[b * W:(b + 1) * W]
            if joined_n[b] > 0:  # the active ranks' times only
                ready = [t for t, m in zip(ready, marks[b * W:(b + 1) * W]) if m == 1.0]
            figures.append(Figures(ready, skew[b], int(late[b]), joined_n[b] > 0))
    else:
        hist, at = host[at:at + B * HIST_BINS], at + B * HIST_BINS
        for b in range(B):
            figures.append(_binned(hist[b * HIST_BINS:(b + 1) * HIST_BINS], joined_n[b] > 0)
                           if oks[b] else None)
    failed = not all(oks) or not rep_ok
    check = CountCheck(oks, figures, rep_ok, any(j > 0 for j in joined_n),
                       counts.tolist() if failed else [],
                       step.tolist() if not rep_ok else [])
    return check, host[at:]


def _binned(hist: list[float], joined: bool) -> Figures:
    occupied = [k for k, c in enumerate(hist) if c > 0]
    if not occupied:
        return Figures(None, 0.0, None, joined)
    return Figures(None, bin_floor_ms(occupied[-1]) - bin_floor_ms(occupied[0]), None, joined)


def first_failing_field(counts: list[float], world_size: int) -> str | None:
    """The first disagreeing field of a bucket's group-summed counts, in ``control.verify``'s
    cause order ("missing", "clock", "bucket", "digest", "scale", "absent", "nonfinite"), or
    None. For the case where ranks cannot be named (a joined rank takes no part in a gather)."""
    n = counts[ACTIVE]
    if n + counts[JOINED] != world_size:
        return "missing"
    bits = counts[BITS0:NONFINITE_COUNT]
    spans = (("clock", 4), ("bucket", 2), ("digest", 8), ("scale", 1))
    at = 0
    for name, chunks in spans:
        if any(c not in (0, n) for c in bits[at:at + chunks * CHUNK_BITS]):
            return name
        at += chunks * CHUNK_BITS
    if any(c != 0 for c in bits[ABSENT_BITS]):
        return "absent"
    return "nonfinite" if counts[NONFINITE_COUNT] else None
