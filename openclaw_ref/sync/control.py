"""The control block: what every rank says about each bucket of a step, reduced in one
allreduce, and the check every rank runs on the result.

Layout. For every bucket the block has one *slot* of ``SLOT_FIELDS`` elements per rank. Rank
``r`` writes its fields into slot ``r`` and zeros everywhere else, so after the SUM every slot
holds exactly one rank's values: ``x + 0 + … + 0 == x`` is exact. Each field is split into 8-bit
chunks (integers 0..255), exact in fp32 — and in fp16/bf16, so the bucketed engine can append a
bucket's block to its gradients on any wire dtype. The hardened hook sends the blocks of every
bucket of a step at the tail of the step's last bucket (``StepBlock``), in the order the
buckets were issued, so position k describes every rank's k-th bucket collective — what each
rank believed it reduced there — with no collective beyond stock DDP's.

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
  ``absent``     2  1 + the member index of the first *required* parameter (one the model does
                    not declare conditional) that got no local gradient this step; 0 = none
  ``nonfinite``  1  1 if the rank's own gradients in the bucket held NaN/inf before the wire
  ``ready``      3  bucket-ready time relative to the rank's step start, in units of
                    ``READY_UNIT_US`` µs (floor), saturating at 2**24 − 1 units (≈ 167 s)

Every chunk before ``nonfinite`` must be the same on every active rank; the last two legitimately
differ, which is why they come last.

Decision rule (``verify``). The verdict is a pure function of the reduced block, which is
bitwise identical on every rank, so every rank raises the same error at the same step and bucket
or none does. For each field the reference value is the one most ranks report (ties: the value
of the lowest such rank; ``vote.plurality``); the ranks reporting anything else are the
disagreeing ranks.
Checks run in cause order: missing slot → clock → bucket index/membership → scale → absent
required gradient; a local non-finite gradient is reported with its ranks (what to do about it
is the ledger's policy). ``verify`` states the rule and names the ranks; ``check_blocks`` passes
the clean buckets of a whole step with a few tensor operations whatever the world size, and
only a bucket it cannot pass is decoded on the host for ``verify`` to judge and name.

Size: ``SLOT_FIELDS`` × W elements per bucket per step (88 B per rank in fp32): 0.72 MB per
bucket at 8,192 ranks — 2.75 % of a 25 MB bucket's bytes, and 69 % of a 1 MB one.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from openclaw_ref.sync.errors import (
    BucketMisalignment,
    ClockMismatch,
    MissingGradient,
    ScaleMismatch,
)
from openclaw_ref.sync.vote import plurality

CHUNK_BITS = 8
CHUNK = 1 << CHUNK_BITS
MAGIC = 0xA5
MAGIC_JOINED = 0x5A
READY_UNIT_US = 10.0  # ready-time resolution: 10 µs, floor-quantized
SCALE_OFFSET = 128

# (name, chunks) in slot order
FIELDS: tuple[tuple[str, int], ...] = (
    ("magic", 1), ("clock", 4), ("bucket", 2), ("digest", 8), ("scale", 1), ("absent", 2),
    ("nonfinite", 1), ("ready", 3),
)
SLOT_FIELDS = sum(n for _, n in FIELDS)
_OFFSET: dict[str, int] = {}
_acc = 0
for _name, _n in FIELDS:
    _OFFSET[_name] = _acc
    _acc += _n
READY = slice(_OFFSET["ready"], _OFFSET["ready"] + 3)
ABSENT = slice(_OFFSET["absent"], _OFFSET["absent"] + 2)
NONFINITE = _OFFSET["nonfinite"]


def block_size(world_size: int) -> int:
    """Elements of one bucket's control block (one slot per rank)."""
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


def units_to_ms(units: float) -> float:
    return units * READY_UNIT_US / 1e3


def ready_units(ready_s: float) -> int:
    return max(0, min(CHUNK ** 3 - 1, int(ready_s * 1e6 / READY_UNIT_US)))


def _absent_code(absent: int | None) -> int:
    return 0 if absent is None else min(absent + 1, CHUNK ** 2 - 1)


def slot_middle(*, bucket: int, digest: int, scale_exp: int) -> list[int]:
    """The chunks of a slot that stay the same from step to step for one bucket (bucket index,
    membership digest, scale exponent): the hook encodes them once per bucket."""
    if not -SCALE_OFFSET <= scale_exp < SCALE_OFFSET:
        raise ValueError(f"scale exponent {scale_exp} outside the control block's range")
    return _chunks(bucket, 2) + _chunks(digest, 8) + [scale_exp + SCALE_OFFSET]


def assemble_slot(clock_chunks: list[int], middle: list[int], *, ready_s: float,
                  absent: int | None = None, nonfinite: bool = False) -> list[int]:
    """A slot from its per-step pieces (``_chunks(clock, 4)``) and ``slot_middle``."""
    return ([MAGIC] + clock_chunks + middle + _chunks(_absent_code(absent), 2)
            + [int(nonfinite)] + _chunks(ready_units(ready_s), 3))


def clock_chunks(clock: int) -> list[int]:
    return _chunks(clock, 4)


def encode_slot(*, clock: int, bucket: int, digest: int, scale_exp: int, ready_s: float,
                absent: int | None = None, nonfinite: bool = False) -> list[int]:
    """The slot of one rank, as 8-bit integers. ``absent``: member index of the first required
    parameter without a local gradient, or None."""
    return assemble_slot(clock_chunks(clock),
                         slot_middle(bucket=bucket, digest=digest, scale_exp=scale_exp),
                         ready_s=ready_s, absent=absent, nonfinite=nonfinite)


def joined_slot() -> list[int]:
    """The slot of a rank that has joined: present, abstaining from every comparison."""
    return [MAGIC_JOINED] + [0] * (SLOT_FIELDS - 1)


def write_block(block: torch.Tensor, rank: int, slot: Sequence[int]) -> None:
    """Fill ``block`` (``block_size(W)`` elements of the wire dtype): zeros, then our slot."""
    block.zero_()
    block[rank * SLOT_FIELDS:(rank + 1) * SLOT_FIELDS].copy_(
        torch.tensor(slot, dtype=block.dtype), non_blocking=True)


class StepBlock:
    """The hardened hook's control block for one step: this rank's slot for every bucket it
    issues, sent at the tail of the step's last bucket.

    Why per step: a slot appended to each bucket's own allreduce forces every bucket through a
    separate wire buffer (a copy of all gradients) and a tensor write per bucket; a block of its
    own would add a collective (≈ 1.8 ms of latency per step on gloo here). Riding at the tail
    of the last bucket costs neither: that bucket's one pass writes the wire instead of dividing
    in place. A bucket costs one Python list append; the step, one zero fill and one copy of
    B × ``SLOT_FIELDS`` values. The local non-finite flags arrive as 0-dim device tensors
    (sums, never read on the host here) and are written into their column on the device."""

    def __init__(self, rank: int, world_size: int) -> None:
        self.rank = rank
        self.world_size = world_size
        self.slots: list[list[int]] = []
        self.flags: list[torch.Tensor] = []

    def add(self, slot: list[int], local_sum: torch.Tensor | None) -> None:
        """One bucket: its encoded slot and the sum of this rank's own gradients in it (NaN or
        ±inf when they held one; None for a joined rank's zeros)."""
        self.slots.append(slot)
        if local_sum is not None:
            self.flags.append(local_sum)

    def __len__(self) -> int:
        return len(self.slots)

    def clear(self) -> None:
        self.slots, self.flags = [], []

    def write(self, block: torch.Tensor) -> None:
        """Fill ``block`` (``len(self) * block_size(W)`` elements of any wire dtype): zeros, then
        our slot of every bucket; the step's slots are cleared."""
        B, W, F = len(self.slots), self.world_size, SLOT_FIELDS
        block.zero_()
        mine = block.view(B, W, F)[:, self.rank]
        mine.copy_(torch.tensor(self.slots, dtype=block.dtype), non_blocking=True)
        if self.flags:
            sums = torch.stack(self.flags)
            mine[:, NONFINITE] = (sums - sums).ne(0).to(block.dtype)  # NaN for NaN and ±inf
        self.clear()


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

        def field(name: str, ints: list[int] = ints) -> list[int]:
            o = _OFFSET[name]
            return ints[o:o + dict(FIELDS)[name]]

        slots.append(Slot(
            True, clock=_unchunk(field("clock")), bucket=_unchunk(field("bucket")),
            digest=_unchunk(field("digest")), scale_exp=field("scale")[0] - SCALE_OFFSET,
            nonfinite=bool(field("nonfinite")[0]), ready_ms=units_to_ms(_unchunk(field("ready"))),
            absent=(_unchunk(field("absent")) - 1) if _unchunk(field("absent")) else None))
    return slots


@dataclass(frozen=True)
class BucketVerdict:
    """What one verified bucket tells (all ranks compute the same figures). ``ready_ms`` and
    the skew cover the ranks that took part (joined ranks abstain); ``ready_ms`` is None where
    ``check_blocks`` did not bring the per-rank times to the host (more than
    ``READY_DETAIL_MAX_RANKS`` ranks)."""

    index: int
    ready_ms: list[float] | None
    skew_ms: float
    late_rank: int
    joined: bool = False  # some rank had joined (DDP.join()) and abstained
    nonfinite_ranks: tuple[int, ...] = ()  # ranks whose own gradients held NaN/inf


def verify(slots: list[Slot], *, bucket: int, params: list[str]) -> BucketVerdict:
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
            "collision)", step=int(plurality(clocks)[0]) if clocks else None, ranks=missing,
            bucket=bucket, params=params)
    joined = len(active) < len(slots)
    if not active:
        return BucketVerdict(bucket, [], 0.0, 0, joined)

    def odd(name: str) -> tuple[object, list[int]]:
        ref, off = plurality([getattr(slots[r], name) for r in active])
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
            f"{ {r: f'2^{slots[r].scale_exp:d}' for r in off} }",
            step=step, ranks=off, bucket=int(index), params=params)
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
    return BucketVerdict(int(index), ready, max(ready) - min(ready), late_rank, joined,
                         tuple(r for r in active if slots[r].nonfinite))


FOLD_COLUMNS = 1 + -(-(NONFINITE - 1) // 3) + 2  # magic, packed agreed chunks, ready, flag


def _fold_matrix(device: torch.device) -> torch.Tensor:
    """(SLOT_FIELDS, FOLD_COLUMNS): column 0 is the magic chunk alone; then the other agreed
    chunks three to a column (256² · a + 256 · b + c, an exact integer < 2^24 in fp32 and
    injective for chunks in 0..255); then the ready time as one integer; then the flag."""
    m = torch.zeros(SLOT_FIELDS, FOLD_COLUMNS, device=device)
    m[0, 0] = 1.0
    for c in range(1, NONFINITE):
        m[c, 1 + (c - 1) // 3] = float(CHUNK ** (2 - (c - 1) % 3))
    m[READY, FOLD_COLUMNS - 2] = torch.tensor([CHUNK * CHUNK, CHUNK, 1.0])
    m[NONFINITE, FOLD_COLUMNS - 1] = 1.0
    return m


READY_DETAIL_MAX_RANKS = 64  # per-rank ready times reach the host (metrics, plots) up to here


@dataclass(frozen=True)
class BlockCheck:
    """``check_blocks``' answer for the buckets of one step, already on the host."""

    ok: list[bool]  # False: decode the bucket and let ``verify`` judge and name
    verdicts: list[BucketVerdict | None]  # None where not ok


def check_blocks(blocks: torch.Tensor, indices: Sequence[int], rank: int,
                 extra: torch.Tensor | None = None) -> tuple[BlockCheck, list[float]]:
    """A fast, exact pass test of a step's reduced blocks ``(B, W * SLOT_FIELDS)`` on their
    own device, with one transfer to the host (``extra``, any 1-D tensor the caller needs on the
    host too, rides along; its values are returned).

    A bucket passes when every slot equals this rank's own slot ``rank`` in the agreed chunks,
    this rank's slot is an active one (magic ``MAGIC``) with no absent gradient, and no slot
    flags a non-finite gradient. That is exactly ``verify`` raising nothing and naming no
    non-finite rank, when no rank has joined: a missing slot, two ranks in one slot (magic
    2·0xA5), any clock/bucket/digest/scale difference or an absent gradient makes some slot
    differ from ours, and a slot that equals ours was written by one active rank, so its other
    chunks are valid too. A joined rank's slot differs as well: such buckets, like non-finite
    ones, are left to ``verify`` (neither is the hot path). Passing buckets get the skew (max −
    min ready time) and the late rank (the first at the max, as in ``verify``). Cost: about a
    dozen tensor operations per step over B·W·SLOT_FIELDS values, whatever W is; nothing per
    rank in Python."""
    B = blocks.shape[0]
    W = blocks.shape[1] // SLOT_FIELDS
    x = blocks.reshape(B, W, SLOT_FIELDS).to(torch.float32)  # chunks ≤ 255: exact
    # One product folds each slot into a few exact integers. A slot written by one rank has
    # chunks in 0..255, where the packing is injective, so it agrees with ours iff its folded
    # agreed columns do; a slot written by none or by several has a magic of 0 or k·0xA5,
    # which column 0 (the magic alone) tells apart whatever its other chunks hold.
    K = FOLD_COLUMNS  # folded column-major: every later operation reads contiguous rows
    folded = torch.mm(_fold_matrix(x.device).t(), x.reshape(B * W, SLOT_FIELDS).t())
    folded = folded.view(K, B, W)
    agreed = folded[:K - 2]
    units = folded[K - 2]  # (B, W)
    ok = ((agreed == agreed[:, :, rank:rank + 1]).all(0).all(1)
          & (folded[K - 1].amax(1) == 0)
          & (x[:, rank, _OFFSET["magic"]] == MAGIC) & (x[:, rank, ABSENT] == 0).all(-1))
    parts = [ok.to(torch.float32), units.amax(1) - units.amin(1), units.argmax(1).float()]
    detail = W <= READY_DETAIL_MAX_RANKS
    if detail:
        parts.append(units.reshape(-1))
    flat = torch.cat(parts).double()
    if extra is not None:
        flat = torch.cat([flat, extra.to(torch.float64).reshape(-1)])
    host = flat.tolist()  # the one host synchronization
    oks = [v == 1.0 for v in host[:B]]
    verdicts: list[BucketVerdict | None] = []
    for b in range(B):
        ready = None
        if detail:
            ready = [units_to_ms(u) for u in host[3 * B + b * W:3 * B + (b + 1) * W]]
        verdicts.append(BucketVerdict(int(indices[b]), ready, units_to_ms(host[B + b]),
                                      int(host[2 * B + b])) if oks[b] else None)
    tail = 3 * B + (B * W if detail else 0)
    return BlockCheck(oks, verdicts), host[tail:]
