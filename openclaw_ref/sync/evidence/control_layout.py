"""The control block's layout: what every rank says about each bucket of a step, encoded so
that one SUM allreduce delivers every rank's words intact; ``control`` judges the result.

Layout. For every bucket the block has one *slot* of ``SLOT_FIELDS`` elements per rank. Rank
``r`` writes its fields into slot ``r`` and zeros everywhere else, so after the SUM every slot
holds exactly one rank's values: ``x + 0 + … + 0 == x`` is exact. Each field is split into 8-bit
chunks (integers 0..255), exact in fp32 — and in fp16/bf16, the wires a bucket's own allreduce
may carry. The guards keep the slots of every bucket of a step (``StepBlock``), in the order
the buckets were issued, so position k describes every rank's k-th bucket collective — what
each rank believed it reduced there; they send them as counts (``control_counts``: O(B)
elements whatever W) and gather the slots themselves only on a step whose counts fail, for
``control.verify`` to judge and name.

Fields of a slot (chunks, most significant first):
  ``magic``      1  0xA5: the slot was written (a zero slot = that rank sent no block); 0x5A: the
                    rank has joined (``DDP.join()``) and sends zeros in DDP's shadow allreduce —
                    its slot abstains from every comparison; 0x3C/0x3D/0x3E: the rank's DDP never
                    issued this bucket in this backward, and why (``NotIssued``: it stopped at a
                    parameter without a gradient, no forward through the wrapper armed it, its
                    parameters were replaced); the rank sends zeros once it learns so, to end
                    the step on every rank with the same verdict
  ``clock``      4  the rank's logical clock (training step) mod 2**32
  ``bucket``     2  the bucket index the rank thinks it is reducing
  ``digest``     8  64-bit digest of the bucket's parameter membership (names, shapes, dtypes,
                    slices) — *layout*, never presence: a parameter with no local gradient is
                    zero-filled and stays a member
  ``scale``      1  the rank's power-of-two pre-scale exponent, offset by 128
  ``absent``     2  1 + the member index of the first *required* parameter (one the model does
                    not declare conditional) that got no local gradient this step; 0 = none. In
                    a slot marked never issued: 1 + the index of the first parameter the cause
                    concerns (``NotIssued``), so every rank names the one this rank saw
  ``nonfinite``  1  1 if the rank's own gradients in the bucket held NaN/inf before the wire
  ``ready``      3  bucket-ready time relative to the rank's step start, in units of
                    ``READY_UNIT_US`` µs (floor), saturating at 2**24 − 1 units (≈ 167 s)

Every chunk before ``nonfinite`` must be the same on every active rank; the last two legitimately
differ, which is why they come last.

Sizes: the counted block, 752 B per bucket in fp32 from 65 ranks up (``control_counts``); the
failure gather, ``SLOT_FIELDS`` × B int64 per rank.
"""

from __future__ import annotations

import enum
import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate

import torch

CHUNK_BITS = 8
CHUNK = 1 << CHUNK_BITS
MAGIC = 0xA5
MAGIC_JOINED = 0x5A


class NotIssued(enum.Enum):
    """Why a rank's DDP never issued a bucket in a backward, as the magic of the slot it sends
    instead (cause order: the evidence that names the cause most surely first)."""

    BYPASSED = 0x3D  # no forward through the wrapper armed DDP's reducer (``ddp.module(x)``)
    REPLACED = 0x3E  # parameters replaced after wrapping: DDP's hooks never ran
    STOPPED = 0x3C  # DDP waited for a parameter that got no gradient


_NOT_ISSUED = {w.value: w for w in NotIssued}
READY_UNIT_US = 10.0  # ready-time resolution: 10 µs, floor-quantized
SCALE_OFFSET = 128

# (name, chunks) in slot order
FIELDS: tuple[tuple[str, int], ...] = (
    ("magic", 1), ("clock", 4), ("bucket", 2), ("digest", 8), ("scale", 1), ("absent", 2),
    ("nonfinite", 1), ("ready", 3),
)
SLOT_FIELDS = sum(n for _, n in FIELDS)
_WIDTH: dict[str, int] = dict(FIELDS)
_OFFSET: dict[str, int] = dict(zip(_WIDTH, accumulate(_WIDTH.values(), initial=0)))
MAGIC_AT = _OFFSET["magic"]
READY = slice(_OFFSET["ready"], _OFFSET["ready"] + 3)
ABSENT = slice(_OFFSET["absent"], _OFFSET["absent"] + 2)
NONFINITE = _OFFSET["nonfinite"]


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


def unissued_slot(slot: list[int], why: NotIssued = NotIssued.STOPPED) -> list[int]:
    """``slot`` marked as sent for a bucket this rank's DDP never issued, for ``why``."""
    return [why.value] + slot[1:]


class StepBlock:
    """The hardened hook's slots for one step: this rank's slot for every bucket it issues,
    written as counts (``control_counts_write.write_counts``) at the tail of the step's last bucket.

    Why per step: a block appended to each bucket's own allreduce forces every bucket through a
    separate wire buffer (a copy of all gradients) and a tensor write per bucket; a block of its
    own would add a collective (≈ 1.8 ms of latency per step on gloo here). Riding at the tail
    of the last bucket costs neither: that bucket's one pass writes the wire instead of dividing
    in place. A bucket costs one Python list append. The local non-finite flags arrive as 0-dim
    device tensors (sums, never read on the host in the hook)."""

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
    unissued: NotIssued | None = None  # the rank's DDP never issued this bucket, and why


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
        if not ok or (ints[0] != MAGIC and ints[0] not in _NOT_ISSUED):
            slots.append(Slot(False))
            continue
        value = {name: _unchunk(ints[o:o + _WIDTH[name]]) for name, o in _OFFSET.items()}
        slots.append(Slot(
            True, clock=value["clock"], bucket=value["bucket"], digest=value["digest"],
            scale_exp=value["scale"] - SCALE_OFFSET, nonfinite=bool(value["nonfinite"]),
            ready_ms=units_to_ms(value["ready"]),
            absent=value["absent"] - 1 if value["absent"] else None,
            unissued=_NOT_ISSUED.get(ints[0])))
    return slots
